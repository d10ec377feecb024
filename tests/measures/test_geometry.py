"""Every metric of anisweep.measures.geometry against an independent computation or a derived known answer."""

from __future__ import annotations

import itertools
import math
import tracemalloc
import warnings

import numpy as np
import pytest
from scipy import stats

from anisweep.measures import geometry as M


def rng(seed=0):
    return np.random.default_rng(seed)


def brute_avg_cos(x):
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    c = u @ u.T
    n = len(x)
    return (c.sum() - np.trace(c)) / (n * (n - 1))


def anisotropic(n, d, seed=0):
    """Correlated, unequal-variance cloud with a common offset."""
    r = rng(seed)
    a = r.standard_normal((d, d)) * np.linspace(0.1, 3.0, d)
    return r.standard_normal((n, d)) @ a + 2.0 * r.standard_normal(d)


def random_rotation(d, seed=0):
    q, r = np.linalg.qr(rng(seed).standard_normal((d, d)))
    return q * np.sign(np.diag(r))


# --------------------------------------------------------------------------- avg_cos
@pytest.mark.parametrize(
    "make",
    [
        lambda: rng(1).standard_normal((50, 8)),
        lambda: anisotropic(60, 12, seed=2),
        lambda: rng(3).standard_normal((40, 5)) + np.array([5.0, 0, 0, 0, 0]),
        lambda: np.abs(rng(4).standard_normal((30, 3))).astype(np.float32),
    ],
)
def test_avg_cos_matches_brute_force(make):
    x = make()
    x64 = x.astype(np.float64)
    ref = brute_avg_cos(x64)
    assert M.avg_cos(x) == pytest.approx(ref, abs=1e-12)
    assert M.avg_cos(x, chunk_rows=7) == pytest.approx(ref, abs=1e-12)
    u = x64 / np.linalg.norm(x64, axis=1, keepdims=True)
    assert M.avg_cos_from_sums(u.sum(axis=0), len(x)) == pytest.approx(ref, abs=1e-12)


def test_avg_cos_known_answers_and_edge_cases():
    e = np.eye(4)
    assert M.avg_cos(np.vstack([e[0]] * 5)) == pytest.approx(1.0)
    assert M.avg_cos(np.vstack([e[0], -e[0]])) == pytest.approx(-1.0)
    assert M.avg_cos(e) == pytest.approx(0.0, abs=1e-15)
    # zero rows are excluded, not counted as orthogonal
    x = rng().standard_normal((20, 6))
    with_zeros = np.vstack([x[:10], np.zeros((3, 6)), x[10:]])
    assert M.avg_cos(with_zeros) == pytest.approx(brute_avg_cos(x), abs=1e-12)
    assert np.isnan(M.avg_cos(x[:1])) and np.isnan(M.avg_cos_from_sums(np.ones(6), 1))
    assert np.isnan(M.avg_cos(np.zeros((5, 3))))
    with pytest.raises(ValueError):
        M.avg_cos(np.ones(5))


def test_isotropic_gaussian_avg_cos_near_zero():
    # s = sum of N random unit vectors ~ N(0, (N/d) I): ||s||^2 ~ (N/d) chi2_d, so avg_cos has
    # mean 0 and std ~ sqrt(2/d) / N. Including the diagonal would add ~ +1/N and fail this bound.
    n, d = 2000, 256
    c = M.avg_cos(rng(5).standard_normal((n, d)))
    assert abs(c) < 5 * np.sqrt(2 / d) / n


def test_common_vector_theory():
    # x_i = m + z_i, z_i ~ N(0, I_d), ||m|| = a: <x_i, x_j> has mean a^2 and ||x_i||^2 concentrates
    # at a^2 + d, so avg_cos -> a^2 / (a^2 + d); mean x = m + zbar, ||.|| ~ sqrt(a^2 + d/N) +- 1/sqrt(N);
    # mean ||x|| ~ sqrt(a^2 + d).
    n, d, a = 4000, 64, 8.0
    m = np.zeros(d)
    m[3] = a
    x = rng(6).standard_normal((n, d)) + m
    assert M.avg_cos(x) == pytest.approx(a**2 / (a**2 + d), abs=0.01)  # = 0.5
    dn, dr = M.drift(x)
    assert dn == pytest.approx(np.sqrt(a**2 + d / n), abs=5 / np.sqrt(n))
    assert dr == pytest.approx(a / np.sqrt(a**2 + d), abs=0.01)
    # centred: y_i = x_i - mean has sum 0; with equal norms sum_i y_i/||y_i|| = 0 and avg_cos is
    # exactly -1/(N-1). Norm spread (relative var 1/(2d)) adds ~ +1/(2d(N-1)), under 1%.
    cc = M.centred_avg_cos(x)
    assert cc == pytest.approx(-1 / (n - 1), rel=0.03)
    assert M.centred_avg_cos(x, chunk_rows=333) == pytest.approx(cc, abs=1e-14)


def test_centred_avg_cos_matches_brute_force():
    x = anisotropic(80, 10, seed=7)
    assert M.centred_avg_cos(x) == pytest.approx(brute_avg_cos(x - x.mean(axis=0)), abs=1e-12)
    # equal-norm centred set: exactly -1/(N-1)
    sq = np.vstack([np.eye(3), -np.eye(3)]) + 10.0
    assert M.centred_avg_cos(sq) == pytest.approx(-1 / 5, abs=1e-12)


def test_avg_cos_never_copies_float32_whole():
    x = rng(8).standard_normal((40_000, 768), dtype=np.float32)  # 123 MB; float64 copy: 246 MB
    tracemalloc.start()
    try:
        c = M.avg_cos(x)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # streamed in small float64 chunks; a float64 copy would be 2 * x.nbytes (246 MB)
    assert peak < 0.1 * x.nbytes
    assert abs(c) < 1e-3


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize("fn", [M.isoscore, M.partition_isotropy, M.centred_avg_cos, M.drift])
def test_other_cloud_metrics_stream_too(fn):
    x = rng(30).standard_normal((200_000, 64), dtype=np.float32)  # 51 MB; float64 copy: 102 MB
    tracemalloc.start()
    try:
        fn(x)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 0.5 * x.nbytes  # a few 8 MB chunks; a float64 copy would be 2 * x.nbytes


# --------------------------------------------------------------------------- drift / norms
def test_drift_and_drift_from_sums():
    x = anisotropic(100, 9, seed=9)
    mean = x.mean(axis=0)
    norms = np.linalg.norm(x, axis=1)
    dn, dr = M.drift(x)
    assert dn == pytest.approx(np.linalg.norm(mean), rel=1e-12)
    assert dr == pytest.approx(np.linalg.norm(mean) / norms.mean(), rel=1e-12)
    assert M.drift(x, chunk_rows=11) == pytest.approx((dn, dr), rel=1e-12)
    assert M.drift_from_sums(x.sum(axis=0), norms.sum(), len(x)) == pytest.approx((dn, dr), rel=1e-12)
    # all vectors equal: ratio exactly 1; symmetric set: drift 0
    assert M.drift(np.tile([3.0, 4.0], (5, 1))) == pytest.approx((5.0, 1.0))
    assert M.drift(np.vstack([np.eye(3), -np.eye(3)])) == pytest.approx((0.0, 0.0), abs=1e-15)
    assert all(np.isnan(M.drift_from_sums(np.zeros(3), 0.0, 0)))


def test_norm_spread_from_moments():
    norms = np.linalg.norm(anisotropic(50, 4, seed=10), axis=1)
    mean, std = M.norm_spread_from_moments(norms.sum(), ((norms - norms.mean()) ** 2).sum(), len(norms))
    assert mean == pytest.approx(norms.mean(), rel=1e-12)
    assert std == pytest.approx(norms.std(ddof=0), rel=1e-12)
    r = np.sqrt(768.0)
    assert M.norm_spread_from_moments(r * 3, 0.0, 3) == pytest.approx((r, 0.0), abs=1e-12)
    assert all(np.isnan(M.norm_spread_from_moments(0.0, 0.0, 0)))


# --------------------------------------------------------------------------- IsoScore
def test_isoscore_package_takes_rows_as_points():
    """Documents the convention of the reference package (IsoScore 2.x: points are ROWS)."""
    iso = pytest.importorskip("IsoScore.IsoScore")
    x = rng(11).standard_normal((500, 4)) * np.array([1.0, 1.0, 1.0, 1e-3])
    # 4 dims, one nearly flat: rows-as-points gives ~ (3-1)/(4-1); columns-as-points is a 500-dim
    # cloud of 4 points, ~ 0.
    assert float(iso.IsoScore(x)) == pytest.approx(2 / 3, abs=0.05)


@pytest.mark.parametrize(
    "make",
    [
        lambda: rng(12).standard_normal((400, 10)),
        lambda: anisotropic(300, 16, seed=13),
        lambda: rng(14).standard_normal((200, 6)) * np.array([5, 3, 1, 1, 0.5, 0.1]),
        lambda: anisotropic(64, 64, seed=15).astype(np.float32),  # n == d is allowed
    ],
)
def test_isoscore_matches_reference_package(make):
    iso = pytest.importorskip("IsoScore.IsoScore")
    x = make()
    ref = float(iso.IsoScore(x.astype(np.float64)))  # 2.0.1: rows are points
    assert M.isoscore(x) == pytest.approx(ref, abs=1e-6)
    assert M.isoscore(x, chunk_rows=13) == pytest.approx(ref, abs=1e-6)


def test_isoscore_known_answers():
    d = 8
    # exactly equal variances on k axes (points +-e_j, j < k): IsoScore = (k - 1) / (d - 1)
    for k in (1, 2, 5, 8):
        e = np.eye(d)[:k]
        assert M.isoscore(np.tile(np.vstack([e, -e]), (d, 1))) == pytest.approx((k - 1) / (d - 1), abs=1e-9)
    # rank-one cloud: 0
    t = rng(16).standard_normal((100, 1))
    assert M.isoscore(t * rng(17).standard_normal(d) + 1.0) == pytest.approx(0.0, abs=1e-9)
    # isotropic Gaussian with n >> d: ~ 1; invariant to rotation, scale and translation
    x = rng(18).standard_normal((20_000, 16))
    s = M.isoscore(x)
    assert s > 0.97
    assert M.isoscore(7.0 * x @ random_rotation(16) + 100.0) == pytest.approx(s, abs=1e-9)
    # anisotropic scaling lowers it
    assert M.isoscore(x * np.linspace(0.1, 1, 16)) < 0.8


def test_isoscore_needs_n_at_least_d():
    with pytest.raises(ValueError, match="sample more tokens"):
        M.isoscore(rng().standard_normal((10, 11)))


def one_vector_up_to_rounding(n=300, d=8, seed=23) -> np.ndarray:
    """Every vector 1e-7 in every component, but for float32 rounding noise (a few ulps): no spread at all."""
    noise = rng(seed).standard_normal((n, d))
    return (np.float32(1e-7) * (1 + 3e-7 * noise).astype(np.float32)).astype(np.float64)


def test_a_cloud_without_spread_has_no_covariance_measures():
    """Issue 43 item 8: IsoScore read 0.17 to 0.19 on such a cloud; it, the top eigenvalue's share and centred
    avg_cos are NaN below the tolerance (relative spread 1e-10), and are numbers just above it."""
    x = one_vector_up_to_rounding()
    assert M.relative_spread(x) < 1e-12 and not M.has_spread(x)
    for measure in (M.isoscore, M.top_eig_share, M.centred_avg_cos):
        assert np.isnan(measure(x)), measure.__name__
    assert M.avg_cos(x) == pytest.approx(1.0)  # the cosines are real: every vector points the same way
    spread = np.ones((300, 8)) + 2e-5 * rng(24).standard_normal((300, 8))  # relative spread 4e-10
    assert M.SPREAD_TOLERANCE < M.relative_spread(spread) < 1e-9
    assert all(np.isfinite(m(spread)) for m in (M.isoscore, M.top_eig_share, M.centred_avg_cos))
    centred = rng(25).standard_normal((40, 3))
    expected = ((centred - centred.mean(0)) ** 2).sum() / (centred**2).sum()
    assert M.relative_spread(centred) == pytest.approx(expected, rel=1e-12)
    assert M.relative_spread(centred, chunk_rows=7) == pytest.approx(expected, rel=1e-12)
    assert np.isnan(M.relative_spread(np.zeros((5, 3)))) and not M.has_spread(np.zeros((5, 3)))


# --------------------------------------------------------------------------- top eigenvalue share
def test_top_eig_share():
    for x in (anisotropic(200, 12, seed=19), rng(20).standard_normal((50, 5))):
        ev = np.linalg.eigvalsh(np.cov(x, rowvar=False))
        assert M.top_eig_share(x) == pytest.approx(ev.max() / ev.sum(), rel=1e-10)
        assert M.top_eig_share(x, chunk_rows=9) == pytest.approx(ev.max() / ev.sum(), rel=1e-10)
        assert M.cov_eigvals(x) == pytest.approx(np.sort(ev)[::-1], rel=1e-8, abs=1e-12)
    # rank one + small noise: var(t) / (var(t) + eps^2 d) ~ 1
    r = rng(21)
    d, eps = 32, 1e-3
    x = r.standard_normal((500, 1)) * r.standard_normal(d) / np.sqrt(d) * 10 + eps * r.standard_normal((500, d))
    assert M.top_eig_share(x) > 0.999
    # isotropic: ~ 1/d
    assert M.top_eig_share(rng(22).standard_normal((20_000, 10))) == pytest.approx(0.1, abs=0.01)


# --------------------------------------------------------------------------- partition isotropy
def naive_partition_isotropy(w, centre=False):
    w = np.asarray(w, dtype=np.float64)
    if centre:
        w = w - w.mean(axis=0)
    _, v = np.linalg.eig(w.T @ w)  # different LAPACK route than the module's eigh
    v = np.real(v)
    p = w @ v
    z = np.concatenate([np.exp(p).sum(axis=0), np.exp(-p).sum(axis=0)])  # c and -c
    return z.min() / z.max()


def test_partition_isotropy_matches_naive_on_small_norms():
    for seed in (23, 24):
        w = 0.3 * anisotropic(300, 8, seed=seed)
        ref = naive_partition_isotropy(w)
        assert 0 < ref < 1
        assert M.partition_isotropy(w) == pytest.approx(ref, rel=1e-9)
        assert M.partition_isotropy(w, chunk_rows=17) == pytest.approx(ref, rel=1e-9)
        assert M.partition_isotropy(w, centre=True) == pytest.approx(naive_partition_isotropy(w, True), rel=1e-9)
        # rotating every row rotates the eigenvectors with it: I(W) unchanged
        assert M.partition_isotropy(w @ random_rotation(8, seed)) == pytest.approx(ref, rel=1e-8)


def test_partition_isotropy_large_norms_no_overflow():
    # rows +-R e_j, each repeated j+1 times: W^T W = diag(2 R^2 (j+1)), eigenvectors e_j,
    # Z(+-e_j) = (j+1) e^R + O(n): I = 1/d
    d, big = 4, 1000.0
    w = np.vstack([s * big * np.eye(d)[j] for j in range(d) for _ in range(j + 1) for s in (1, -1)])
    with np.errstate(over="ignore", invalid="ignore"):
        naive = naive_partition_isotropy(w)
    assert not np.isfinite(naive) or naive == 0  # inf / inf: the naive formula is useless here
    assert M.partition_isotropy(w) == pytest.approx(1 / d, rel=1e-9)


def test_partition_isotropy_known_answers():
    d = 6
    sym = np.vstack([np.eye(d), -np.eye(d)])
    assert M.partition_isotropy(sym) == pytest.approx(1.0, abs=1e-12)
    assert M.partition_isotropy(1e3 * sym) == pytest.approx(1.0, abs=1e-12)
    # small isotropic cloud: Z(c) ~ n exp(sigma^2 / 2) in every direction
    g = 0.5 * rng(25).standard_normal((20_000, 16))
    assert M.partition_isotropy(g) > 0.9
    # a large common vector: Z along +-m differs by ~ exp(2 ||m||); centring removes it
    m = np.zeros(16)
    m[0] = 10.0
    assert M.partition_isotropy(g + m) < 1e-6
    assert M.partition_isotropy(g + m, centre=True) == pytest.approx(M.partition_isotropy(g, centre=True), rel=1e-6)
    assert M.partition_isotropy(g + m, centre=True) > 0.9


def machina_mercer_iw(w, centre=False):
    """compute_IW of Machina & Mercer (anemily-machina/isotropy_transformers, partition_function.py), in numpy:
    eigenvectors of W^T W from eigh, used with the sign it returns; Z per eigenvector = column sums of
    exp(W V); I(W) = min Z / max Z. Centred as their calc_isotropy does: W minus its row mean."""
    w = np.asarray(w, dtype=np.float64)
    if centre:
        w = w - w.mean(axis=0)
    _, vectors = np.linalg.eigh(w.T @ w)
    z = np.exp(w @ vectors).sum(axis=0)
    return z.min() / z.max()


def test_partition_isotropy_mm_matches_machina_mercer_on_random_data():
    r = rng(40)
    for seed, (n, d, offset) in enumerate([(500, 8, 0.0), (2000, 16, 3.0), (300, 5, 1.0), (1000, 32, 2.0)]):
        mean = r.standard_normal(d)
        w = 0.3 * r.standard_normal((n, d)) @ random_rotation(d, seed) + offset * mean / np.linalg.norm(mean)
        ref = machina_mercer_iw(w)
        assert 0 < ref < 1
        assert M.partition_isotropy_mm(w) == pytest.approx(ref, rel=1e-9)
        assert M.partition_isotropy_mm(w, chunk_rows=17) == pytest.approx(ref, rel=1e-9)
        assert M.partition_isotropy_mm(w, centre=True) == pytest.approx(machina_mercer_iw(w, True), rel=1e-9)
        both = M.partition_isotropies(w)
        assert both["partition_isotropy_mm"] == pytest.approx(ref, rel=1e-9)
        assert both["partition_isotropy"] == pytest.approx(naive_partition_isotropy(w), rel=1e-9)


def test_partition_isotropy_one_sign_against_every_sign_choice():
    # the one-sign value is the ratio for one of the 2^d sign choices of the eigenvectors, the one eigh makes;
    # the sign-free value is at most every one of them
    d = 6
    r = rng(41)
    # unequal variances and an offset with components on several eigenvectors: Z(c) != Z(-c) for more than one
    w = r.standard_normal((400, d)) * np.linspace(0.3, 1.5, d) + np.linspace(0.5, 1.0, d)
    _, v = np.linalg.eigh(w.T @ w)
    per_choice = {}
    for signs in itertools.product((1.0, -1.0), repeat=d):
        z = np.exp(w @ (v * np.array(signs))).sum(axis=0)
        per_choice[signs] = z.min() / z.max()
    assert M.partition_isotropy_mm(w) == pytest.approx(per_choice[(1.0,) * d], rel=1e-9)
    assert M.partition_isotropy(w) <= min(per_choice.values()) * (1 + 1e-9)
    assert max(per_choice.values()) > 1.5 * min(per_choice.values())  # the sign choice matters here


def test_partition_isotropy_conventions_on_a_drifted_gaussian():
    # a common mean of norm 3: Z(+m) / Z(-m) ~ exp(2 * 3): one sign sees half of it, both signs all
    g = 0.5 * rng(42).standard_normal((20_000, 16))
    m = np.zeros(16)
    m[0] = 3.0
    both = M.partition_isotropies(g + m)
    assert both["partition_isotropy_mm"] == pytest.approx(machina_mercer_iw(g + m), rel=1e-9)
    assert both["partition_isotropy"] == pytest.approx(naive_partition_isotropy(g + m), rel=1e-9)
    assert both["partition_isotropy"] < both["partition_isotropy_mm"]
    # log Z(c) ~ log n + <m, c> + 0.5^2 / 2: exp(+-3) along +-m, exp(0) across it, whichever sign eigh returns
    assert both["partition_isotropy_mm"] == pytest.approx(np.exp(-3.0), rel=0.3)
    assert both["partition_isotropy"] == pytest.approx(np.exp(-6.0), rel=0.3)


# --------------------------------------------------------------------------- correlations
def brute_permutation_p(x, y, statistic):
    """Two-sided permutation p by enumerating every ordering of y, one scipy call each."""
    observed = statistic(x, y)
    null = np.array([statistic(x, np.asarray(y)[list(order)]) for order in itertools.permutations(range(len(y)))])
    tol = 1e-12 * max(1.0, abs(observed))
    return observed, min(1.0, 2 * min((null <= observed + tol).mean(), (null >= observed - tol).mean()))


def spearman(x, y):
    return stats.spearmanr(x, y).statistic


def pearson(x, y):
    return stats.pearsonr(x, y).statistic


def spearman_along(x, y, axis=-1):
    return stats.pearsonr(stats.rankdata(x, axis=axis), stats.rankdata(y, axis=axis), axis=axis).statistic


def pearson_along(x, y, axis=-1):
    return stats.pearsonr(x, y, axis=axis).statistic


def against(x, statistic):
    """statistic(x, y) as a vectorised function of y alone, for scipy's one-sample 'pairings' test."""
    return lambda y, axis=-1: statistic(x, y, axis)


@pytest.mark.parametrize("n", [3, 4, 5])
def test_layer_correlations_exact_p_against_brute_force_enumeration(n):
    for seed in range(3):
        a = rng(50 + seed).standard_normal(n)
        b = 0.7 * a + rng(60 + seed).standard_normal(n)
        b[0] = b[1] if seed == 2 else b[0]  # a tie in the ranks
        out = M.layer_correlations(a, b)
        for name, statistic in (("spearman", spearman), ("pearson", pearson)):
            r, p = brute_permutation_p(a, b, statistic)
            assert out[f"{name}_r"] == pytest.approx(r, abs=1e-12)
            assert out[f"{name}_p"] == pytest.approx(p, rel=1e-12)
            assert out[f"{name}_p"] >= 2 / math.factorial(n) - 1e-15
        assert out["p_exact"] == 1.0 and out["n_permutations"] == math.factorial(n)


@pytest.mark.parametrize("n", [5, 7, 8])
def test_layer_correlations_exact_p_against_scipy_permutation_test(n):
    a = rng(70 + n).standard_normal(n)
    b = np.exp(a) + 0.5 * rng(80 + n).standard_normal(n)
    out = M.layer_correlations(a, b)
    for name, statistic in (("spearman", spearman_along), ("pearson", pearson_along)):
        ref = stats.permutation_test(  # one sample: its order is permuted against a fixed
            (b,), against(a, statistic), permutation_type="pairings", n_resamples=np.inf
        )
        assert out[f"{name}_r"] == pytest.approx(ref.statistic, abs=1e-12)
        assert out[f"{name}_p"] == pytest.approx(ref.pvalue, rel=1e-12)


def test_layer_correlations_p_floor_where_the_t_approximation_fails():
    # 5 perfectly monotone layers: only the identity and the reversal reach |rho| = 1, p = 2/5!
    x = np.arange(1.0, 6.0)
    out = M.layer_correlations(x, np.exp(x))
    assert out["spearman_r"] == pytest.approx(1.0)
    assert out["spearman_p"] == pytest.approx(2 / 120, rel=1e-12)
    assert stats.spearmanr(x, np.exp(x)).pvalue < 1e-20  # what the t approximation claims
    linear = M.layer_correlations(x, 2 * x + 1)
    assert linear["pearson_r"] == pytest.approx(1.0) and linear["pearson_p"] == pytest.approx(2 / 120, rel=1e-12)
    # reversed: -1, the same p
    rev = M.layer_correlations(x, -(x**3))
    assert rev["spearman_r"] == pytest.approx(-1.0) and rev["spearman_p"] == pytest.approx(2 / 120, rel=1e-12)


def test_layer_correlations_monte_carlo_beyond_eight_layers():
    n = 12
    a = rng(90).standard_normal(n)
    b = 0.5 * a + rng(91).standard_normal(n)
    out = M.layer_correlations(a, b)
    assert out["p_exact"] == 0.0 and out["n_permutations"] == M.MONTE_CARLO_PERMUTATIONS + 1
    assert M.layer_correlations(a, b) == out  # seeded: the same p every run
    for name, statistic in (("spearman", spearman_along), ("pearson", pearson_along)):
        ref = stats.permutation_test(
            (b,), against(a, statistic), permutation_type="pairings", n_resamples=100_000, rng=1
        )
        assert out[f"{name}_r"] == pytest.approx(ref.statistic, abs=1e-12)
        assert 0.01 < ref.pvalue < 0.99
        assert out[f"{name}_p"] == pytest.approx(ref.pvalue, abs=0.01)  # two Monte Carlo estimates, se < 0.0016
    # 12 perfectly monotone layers: no random ordering reaches |rho| = 1, the floor 2/(N + 1)
    x = np.arange(12.0)
    assert M.layer_correlations(x, x**2)["spearman_p"] == pytest.approx(2 / (M.MONTE_CARLO_PERMUTATIONS + 1))


def test_layer_correlations_degenerate_inputs_give_nan_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for a, b in [
            ([1.0, 2.0], [3.0, 4.0]),
            ([], []),
            ([1.0, 2, 3, 4], [5.0, 5, 5, 5]),
            ([2.0, 2, 2], [1.0, 2, 3]),
            ([1.0, np.nan, 3, 4], [1.0, 2, np.nan, 4]),
        ]:
            out = M.layer_correlations(a, b)
            assert all(np.isnan(v) for v in out.values()), (a, b)
    # NaN pairs are dropped, the rest is used
    out = M.layer_correlations([1.0, np.nan, 2, 3, 4], [1.0, 5, 2, 3, 5])
    assert out["spearman_r"] == pytest.approx(1.0)


# --------------------------------------------------------------------------- Q-K, LayerNorm
def test_qk_alignment():
    r = rng(28)
    q, k = r.standard_normal(64), r.standard_normal(64)
    cos, score = M.qk_alignment(q, k)
    assert cos == pytest.approx(np.dot(q, k) / np.sqrt(np.dot(q, q) * np.dot(k, k)), rel=1e-12)
    assert score == pytest.approx(np.dot(q, k) / 8.0, rel=1e-12)
    assert M.qk_alignment(q, -3 * q)[0] == pytest.approx(-1.0)  # signed
    assert M.qk_alignment([1.0, 0, 0, 0], [0, 2.0, 0, 0]) == pytest.approx((0.0, 0.0))
    assert M.qk_alignment(np.float32([1, 1, 1, 1]), np.float32([2, 2, 2, 2])) == pytest.approx((1.0, 4.0))
    assert np.isnan(M.qk_alignment(np.zeros(4), np.ones(4))[0])


def test_layernorm_param_stats_and_bias_share():
    g = np.array([0.5, 1.0, 1.5, 3.0], dtype=np.float32)
    b = np.array([3.0, 0.0, 4.0, 0.0])
    st = M.layernorm_param_stats(g, b)
    assert st == pytest.approx(
        {"gain_mean": 1.5, "gain_std": np.sqrt(0.875), "gain_min": 0.5, "gain_max": 3.0, "bias_norm": 5.0}
    )
    assert np.isnan(M.layernorm_param_stats(g, None)["bias_norm"])
    # drift made only of the bias: share 1; bias orthogonal to the drift: 0; bias = half: 0.5
    assert M.bias_drift_share(b, b) == pytest.approx(1.0)
    assert M.bias_drift_share(b, np.array([0.0, 1.0, 0.0, 0.0])) == pytest.approx(0.0)
    assert M.bias_drift_share(b, 2 * b) == pytest.approx(0.5)
    # a simulated LayerNorm: y = g * zhat + b, the drift is mean(y) = g * mean(zhat) + b
    x = anisotropic(500, 4, seed=29)
    zhat = (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True)
    mean_out = (g * zhat + b).mean(axis=0)
    expect = np.dot(b, mean_out) / np.dot(mean_out, mean_out)
    assert M.bias_drift_share(b, mean_out) == pytest.approx(expect)
    assert np.isnan(M.bias_drift_share(b, np.zeros(4)))


@pytest.mark.parametrize("n", [3, 5, 12, 30])
def test_layer_correlations_ttest_p_is_scipys(n):
    """The t-test p-values (the paper's convention) offered beside the permutation ones are scipy's."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n)
    b = 0.6 * a + rng.standard_normal(n)
    out = M.layer_correlations(a, b)
    assert out["pearson_p_ttest"] == pytest.approx(stats.pearsonr(a, b).pvalue, rel=1e-9)
    assert out["spearman_p_ttest"] == pytest.approx(stats.spearmanr(a, b).pvalue, rel=1e-9)
    perfect = M.layer_correlations(np.arange(5.0), np.arange(5.0) ** 2)
    assert perfect["spearman_p_ttest"] == 0.0 and perfect["spearman_p"] == pytest.approx(2 / 120)
    assert np.isnan(M.layer_correlations([1.0, 2.0], [3.0, 4.0])["pearson_p_ttest"])
