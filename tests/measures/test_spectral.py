"""The spectral measures against direct computations: RankMe and proportional effective rank from numpy's SVD
(Garrido et al. 2023; pico-analyze's per.py in torch), alpha-ReQ from Li et al.'s weighted fit written out here
(numpy's polyfit on the covariance's eigenvalues) and on planted power laws, the condition number from
numpy.linalg.cond, Gini and Hoyer from pico-analyze's formulas, and known answers for each."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch

from anisweep.measures import spectral
from anisweep.measures.metrics import spectral_rows


def planted(n: int, singular: np.ndarray, seed: int = 0) -> np.ndarray:
    """n rows, centred, whose singular values are exactly `singular`."""
    rng = np.random.default_rng(seed)
    d = len(singular)
    u = rng.standard_normal((n, d))
    u -= u.mean(axis=0)
    u, _ = np.linalg.qr(u)  # orthonormal columns, each orthogonal to the ones vector
    v, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return u @ np.diag(singular) @ v.T


def rankme_direct(x: np.ndarray, eps: float = 1e-7) -> float:
    s = np.linalg.svd(x, compute_uv=False)
    p = s / s.sum() + eps
    return math.exp(-(p * np.log(p)).sum())


def li_alpha(x: np.ndarray, first: int, last: int) -> float:
    """Li et al. 2025's fit: the centred covariance's eigenvalues, log lambda_r on log r over ranks first..last,
    least squares weighted 1 / r (polyfit weights multiply the residuals: sqrt of that)."""
    lam = np.sort(np.linalg.eigvalsh(np.cov(x, rowvar=False)))[::-1]
    ranks = np.arange(first, last + 1)
    slope, _ = np.polyfit(np.log(ranks), np.log(lam[ranks - 1]), 1, w=np.sqrt(1.0 / ranks))
    return -slope


def test_rankme_known_answers_and_direct_svd():
    d = 16
    flat = planted(200, np.ones(d))
    assert spectral.rankme(np.linalg.svd(flat, compute_uv=False)) == pytest.approx(d, rel=1e-4)
    rank_one = np.outer(np.arange(1.0, 51.0), np.ones(8))
    assert spectral.rankme(np.linalg.svd(rank_one, compute_uv=False)) == pytest.approx(1.0, abs=1e-4)
    x = np.random.default_rng(1).standard_normal((300, 24)) @ np.diag(np.linspace(0.1, 3, 24))
    assert spectral.rankme(np.linalg.svd(x, compute_uv=False)) == pytest.approx(rankme_direct(x), rel=1e-12)


def test_proportional_effective_rank_as_pico_analyze_computes_it():
    x = np.random.default_rng(2).standard_normal((40, 12)) * np.linspace(0.2, 2, 12)
    s = torch.svd(torch.from_numpy(x)).S
    s = s / s.sum()
    expected = float(torch.exp(-torch.sum(s * torch.log(s)))) / len(s)
    assert spectral.proportional_effective_rank(np.linalg.svd(x, compute_uv=False)) == pytest.approx(expected)
    assert spectral.proportional_effective_rank(np.ones(7)) == pytest.approx(1.0)
    assert spectral.proportional_effective_rank(np.array([3.0, 0.0, 0.0])) == pytest.approx(1 / 3)  # 0 log 0 = 0


def test_condition_number_is_numpys():
    x = np.random.default_rng(3).standard_normal((30, 10))
    assert spectral.condition_number(np.linalg.svd(x, compute_uv=False)) == pytest.approx(np.linalg.cond(x))
    assert spectral.condition_number(np.array([2.0, 1.0, 0.0])) == math.inf
    assert math.isnan(spectral.condition_number(np.zeros(3)))


@pytest.mark.parametrize("alpha", [0.6, 1.0, 2.3])
def test_alpha_req_recovers_a_planted_power_law(alpha):
    d = 112  # ranks 12 to 100, and 10 beyond
    singular = np.sqrt(np.arange(1, d + 1, dtype=np.float64) ** -alpha)
    x = planted(150, singular) + 5.0  # an offset the centring removes
    fitted, last = spectral.alpha_req(spectral.covariance_eigenvalues(x))
    assert fitted == pytest.approx(alpha, rel=1e-9)
    assert last == 100


def test_alpha_req_is_li_et_als_weighted_fit():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((200, 120)) @ np.diag(np.arange(1, 121) ** -0.7) @ rng.standard_normal((120, 120))
    fitted, last = spectral.alpha_req(spectral.covariance_eigenvalues(x))
    assert last == 100
    assert fitted == pytest.approx(li_alpha(x, 12, 100), rel=1e-8)


def test_a_short_spectrum_ends_its_fit_before_its_tail_or_is_nan():
    x = np.random.default_rng(5).standard_normal((200, 32)) * np.arange(1, 33) ** -0.5
    fitted, last = spectral.alpha_req(spectral.covariance_eigenvalues(x))
    assert last == 22 and fitted == pytest.approx(li_alpha(x, 12, 22), rel=1e-8)
    rank_deficient = x[:, :30] @ np.random.default_rng(6).standard_normal((30, 32))  # rank 30 in 32 dimensions
    assert spectral.alpha_req(spectral.covariance_eigenvalues(rank_deficient))[1] == 20
    fitted, last = spectral.alpha_req(spectral.covariance_eigenvalues(x[:, :20]))
    assert math.isnan(fitted) and last == 10


def pico_gini(w: torch.Tensor) -> float:
    x, _ = torch.sort(w.flatten().abs())
    n = x.shape[0]
    idx = torch.arange(1, n + 1, dtype=x.dtype)
    return float(((2 * idx - n - 1) * x).sum() / (n * x.sum()))


def pico_hoyer(w: torch.Tensor) -> float:
    n = w.numel()
    return (math.sqrt(n) - float(torch.norm(w, p=1)) / float(torch.norm(w, p=2))) / (math.sqrt(n) - 1)


def test_gini_and_hoyer_as_pico_analyze_defines_them():
    w = torch.from_numpy(np.random.default_rng(7).standard_normal((9, 5)) ** 3)
    assert spectral.gini(w.numpy()) == pytest.approx(pico_gini(w))
    assert spectral.hoyer(w.numpy()) == pytest.approx(pico_hoyer(w))
    equal, one = np.full((4, 5), -2.0), np.zeros(20)
    one[3] = 7.0
    assert spectral.gini(equal) == pytest.approx(0.0) and spectral.hoyer(equal) == pytest.approx(0.0)
    assert spectral.gini(one) == pytest.approx(19 / 20) and spectral.hoyer(one) == pytest.approx(1.0)


def test_spectral_rows_per_layer_and_site_from_the_sample():
    rng = np.random.default_rng(8)
    frames = []
    for layer, site in ((0, "resid"), (1, "resid"), (1, "final_ln_out")):
        x = rng.standard_normal((60, 8)) * np.arange(1, 9) + layer
        frames.append(
            pl.DataFrame({"layer": layer, "site": site, "seq": 0, "position": range(60), "vector": x.tolist()})
        )
    hidden = pl.concat(frames)
    rows = {(r["layer"], r["site"], r["metric"]): r["value"] for r in spectral_rows(hidden)}
    for frame in frames:
        layer, site = frame["layer"][0], frame["site"][0]
        x = np.array(frame["vector"].to_list())
        s = np.linalg.svd(x, compute_uv=False)
        assert rows[(layer, site, "rankme")] == pytest.approx(rankme_direct(x))
        assert rows[(layer, site, "condition_number")] == pytest.approx(np.linalg.cond(x))
        p = s / s.sum()
        assert rows[(layer, site, "prop_effective_rank")] == pytest.approx(math.exp(-(p * np.log(p)).sum()) / 8)
        lam = np.sort(np.linalg.eigvalsh(np.cov(x, rowvar=False)))[::-1]
        q = lam / lam.sum() + 1e-7
        assert rows[(layer, site, "rankme_cov")] == pytest.approx(math.exp(-(q * np.log(q)).sum()))
        assert math.isnan(rows[(layer, site, "alpha_req")])  # 8 dimensions: no rank 12
