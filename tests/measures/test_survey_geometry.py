"""Godey et al. 2024, Section 3: avg_cos from uniformly drawn pairs with its sampling error, and where a level of
cosine sits against isotropic Gaussians of the same width (Fig. 17, 18), each against an independent computation."""

from __future__ import annotations

import numpy as np
import pytest

from anisweep.measures import geometry as M


def drifted(n=2000, d=32, drift=6.0, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) + drift * rng.normal(size=d) / np.sqrt(d)


def test_pair_avg_cos_is_the_mean_of_its_pairs_cosines():
    """By brute force: the pairs are the seeded order taken two by two."""
    x = drifted(n=11)
    mean, se, n_pairs = M.pair_avg_cos(x, seed=3)
    order = np.random.default_rng(3).permutation(11)[:10]
    cos = [x[i] @ x[j] / (np.linalg.norm(x[i]) * np.linalg.norm(x[j])) for i, j in zip(order[0::2], order[1::2])]
    assert n_pairs == 5
    assert mean == pytest.approx(np.mean(cos), rel=1e-12)
    assert se == pytest.approx(np.std(cos, ddof=1) / np.sqrt(5), rel=1e-12)


def test_pair_avg_cos_estimates_the_exact_avg_cos_within_its_standard_error():
    """Over 200 seeds the estimates centre on the exact all-pairs value, and their spread is the standard error."""
    x = drifted()
    exact = M.avg_cos(x)
    estimates = np.array([M.pair_avg_cos(x, seed=s)[0] for s in range(200)])
    se = M.pair_avg_cos(x, seed=0)[1]
    assert exact > 0.3  # anisotropic: a case the pair estimate must still get right on average
    assert abs(estimates.mean() - exact) < 4 * se / np.sqrt(200)
    assert estimates.std() == pytest.approx(se, rel=0.2)


def test_pair_avg_cos_without_pairs_is_nan():
    mean, se, n = M.pair_avg_cos(np.zeros((3, 4)))
    assert np.isnan(mean) and np.isnan(se) and n == 0


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
@pytest.mark.parametrize("d", [16, 128, 512])
def test_the_isotropic_quantile_and_tail_match_gaussian_pairs(d):
    """Monte Carlo of 40,000 pairs of N(0, I_d) vectors (tolerances about 5 of its standard errors): the 95th
    percentile, and P(cos >= c) at two levels."""
    rng = np.random.default_rng(d)
    a, b = rng.standard_normal(size=(2, 40_000, d), dtype=np.float32)
    cos = np.einsum("ij,ij->i", a, b) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert M.isotropic_cos_quantile(d) == pytest.approx(np.quantile(cos, 0.95), abs=0.04 / np.sqrt(d))
    for c in (0.5 / np.sqrt(d), 2.0 / np.sqrt(d)):
        assert M.isotropic_cos_sf(d, c) == pytest.approx((cos >= c).mean(), abs=0.008)
    assert M.isotropic_cos_sf(d, 0.9) < 1e-6


def test_isotropic_levels_known_answers():
    """d = 3: (cos + 1) / 2 is uniform (Archimedes), so the 95th percentile is 0.9 and P(cos >= 0) is 1/2."""
    assert M.isotropic_cos_quantile(3) == pytest.approx(0.9)
    assert M.isotropic_cos_sf(3, 0.0) == pytest.approx(0.5)
    assert np.isnan(M.isotropic_cos_quantile(1)) and np.isnan(M.isotropic_cos_sf(8, float("nan")))
