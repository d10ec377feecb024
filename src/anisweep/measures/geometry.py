"""Representation-geometry metrics: pure numpy/scipy, no torch, no file I/O.

Each function's docstring gives its exact definition; the README's "What is measured" says which tables and
sites they are computed on, and ``tests/measures/test_metrics.py`` checks each against an independent computation.
The metrics and where they come from:

- ``avg_cos``: mean cosine similarity over all distinct pairs of vectors, the usual anisotropy measure
  (Ethayarajh 2019, "How Contextual are Contextualized Word Representations?"); ``centred_avg_cos`` is the
  same after subtracting the mean vector.
- ``drift``: the norm of the mean vector, and its ratio to the mean norm: the common direction all
  representations share (Bis et al. 2021, "Too Much in Common"; Godey et al. 2024, "Anisotropy Is Inherent
  to Self-Attention in Transformers").
- ``isoscore``: IsoScore (Rudman et al. 2022, "IsoScore: Measuring the Uniformity of Embedding Space
  Utilization"), from the eigenvalues of the covariance; ``top_eig_share``: the largest eigenvalue's share.
- ``partition_isotropy``: I(W) of Mu & Viswanath 2018 ("All-but-the-Top"), of the embedding matrices,
  sign-free and (``partition_isotropy_mm``) with Machina & Mercer's one-sign eigenvectors.
- ``qk_alignment``: cosine of a head's mean query and mean key, and their contribution to every attention
  logit (Godey et al. 2024); ``qk_mean_dot``: their unscaled dot product; ``qk_cos_concat``: the cosine of
  the means concatenated over a layer's heads.
- ``layer_correlations``: drift norm vs avg_cos across layers (Machina & Mercer 2024, "Anisotropy is Not
  Inherent to Transformers"); ``layernorm_param_stats``, ``bias_drift_share``: the LayerNorm's gain and bias.

Point clouds are ``(N, d)`` arrays whose ROWS are the points. Functions over a whole cloud stream it in
row chunks and accumulate in float64, so a float32 ``(1e6, 768)`` array is never copied whole into float64.
``chunk_rows`` overrides the chunk size; the defaults keep a chunk cache-sized (1 MB) for the memory-bound
streaming sums and 8 MB for the covariance products, which BLAS runs faster on larger blocks.

Degenerate inputs give NaN rather than an exception (a sweep must not die on one odd layer),
except where the answer would be silently wrong: IsoScore with fewer points than dimensions raises. A cloud
with no spread (``relative_spread`` below SPREAD_TOLERANCE: every point the same up to rounding) has no
covariance to describe: ``centred_avg_cos``, ``isoscore`` and ``top_eig_share`` are NaN there.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np
from scipy import stats

__all__ = [
    "avg_cos_from_sums",
    "unit_sum",
    "avg_cos",
    "pair_avg_cos",
    "isotropic_cos_quantile",
    "isotropic_cos_sf",
    "centred_avg_cos",
    "drift",
    "drift_from_sums",
    "cov_eigvals",
    "isoscore",
    "top_eig_share",
    "partition_isotropies",
    "partition_isotropy",
    "partition_isotropy_mm",
    "permutation_p",
    "layer_correlations",
    "norm_spread_from_moments",
    "relative_spread",
    "has_spread",
    "qk_alignment",
    "qk_mean_dot",
    "qk_cos_concat",
    "layernorm_param_stats",
    "bias_drift_share",
]

_STREAM_ELEMS = 1 << 17  # float64 elements per chunk for streaming sums: 1 MB, stays in cache
_GEMM_ELEMS = 1 << 20  # for X^T X and X V products: 8 MB


# --------------------------------------------------------------------------- streaming helpers
def _as_cloud(x) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"expected an (N, d) array of row vectors, got shape {x.shape}")
    return x


def _chunks(
    x: np.ndarray, chunk_rows: int | None, shift: np.ndarray | None = None, elems: int = _STREAM_ELEMS
) -> Iterator[np.ndarray]:
    """float64 row copies of x (minus ``shift`` if given), a chunk at a time."""
    rows = chunk_rows or max(1, elems // max(1, x.shape[1]))
    for start in range(0, x.shape[0], rows):
        c = np.array(x[start : start + rows], dtype=np.float64)  # copy: never alias the caller's array
        if shift is not None:
            c -= shift
        yield c


def _row_norms(c: np.ndarray) -> np.ndarray:
    return np.sqrt(np.einsum("ij,ij->i", c, c))


def _mean(x: np.ndarray, chunk_rows: int | None) -> np.ndarray:
    s = np.zeros(x.shape[1])
    for c in _chunks(x, chunk_rows):
        s += c.sum(axis=0)
    return s / x.shape[0]


def _centred_scatter(x: np.ndarray, chunk_rows: int | None) -> np.ndarray:
    """sum_i (x_i - mean)(x_i - mean)^T in float64 (two passes; no E[xx^T] - mm^T cancellation)."""
    mu = _mean(x, chunk_rows)
    s = np.zeros((x.shape[1], x.shape[1]))
    for c in _chunks(x, chunk_rows, shift=mu, elems=_GEMM_ELEMS):
        s += c.T @ c
    return s


# --------------------------------------------------------------------------- average cosine
def avg_cos_from_sums(sum_unit: np.ndarray, n: int) -> float:
    """Exact mean cosine over all n(n-1) ordered distinct pairs, from s = sum_i x_i/||x_i||.

    ``avg_cos = (||s||^2 - n) / (n (n - 1))``: ||s||^2 = sum_ij cos_ij and the n diagonal terms are 1.
    NaN when n < 2.
    """
    if n < 2:
        return float("nan")
    s = np.asarray(sum_unit, dtype=np.float64)
    return float((s @ s - n) / (n * (n - 1.0)))


def unit_sum(x, shift: np.ndarray | None = None, chunk_rows: int | None = None) -> tuple[np.ndarray, int]:
    """(sum of unit vectors (x_i - shift)/||x_i - shift|| in float64, number of nonzero rows).

    Zero-norm rows have no direction: they are EXCLUDED (not counted in n).
    """
    x = _as_cloud(x)
    s = np.zeros(x.shape[1])
    n = 0
    for c in _chunks(x, chunk_rows, shift):
        norms = _row_norms(c)
        keep = norms > 0
        inv = np.zeros_like(norms)
        inv[keep] = 1.0 / norms[keep]
        s += inv @ c
        n += int(keep.sum())
    return s, n


def avg_cos(x, chunk_rows: int | None = None) -> float:
    """Average cosine similarity of the rows of x, EXACT over all distinct pairs, in O(N d).

    Computed as ``avg_cos_from_sums(sum_i x_i/||x_i||, N)`` with float64 accumulation. Pairs are
    not subsampled: on an anisotropic set a pair sample badly misestimates the mean. Zero-norm rows
    (no direction) are excluded; NaN if fewer than 2 rows remain.
    """
    return avg_cos_from_sums(*unit_sum(x, chunk_rows=chunk_rows))


def isotropic_cos_spread(d: int) -> float:
    """The standard deviation of the cosine between two independent N(0, I_d) vectors, 1/sqrt(d) (its mean is 0):
    the spread of cosines an isotropic cloud of that dimension shows (Godey et al. 2024, Fig. 17/18)."""
    return 1.0 / np.sqrt(d)


def isotropic_cos_quantile(d: int, q: float = 0.95) -> float:
    """The `q` quantile of the cosine between two independent N(0, I_d) vectors (Godey et al. 2024, Fig. 18), exact:
    (cos + 1) / 2 follows Beta((d - 1) / 2, (d - 1) / 2)."""
    a = (d - 1) / 2
    return float(2.0 * stats.beta.ppf(q, a, a) - 1.0) if d >= 2 else float("nan")


def isotropic_cos_sf(d: int, c: float) -> float:
    """P(cos >= c) for the cosine between two independent N(0, I_d) vectors: how unlikely a cosine as high as `c`
    is between isotropic vectors of that width."""
    a = (d - 1) / 2
    return float(stats.beta.sf((c + 1.0) / 2.0, a, a)) if d >= 2 and np.isfinite(c) else float("nan")


def pair_avg_cos(x, seed: int = 0) -> tuple[float, float, int]:
    """avg_cos as Godey et al. 2024 (Sec. 3) estimate it, from uniformly drawn pairs of the rows of x: the rows in a
    seeded random order taken two by two (floor(N/2) disjoint pairs, so the pairs are independent). Returns the
    mean cosine of the pairs, its standard error (sample sd / sqrt(pairs)) and the number of pairs; NaN with no
    pair. Zero-norm rows are left out."""
    x = _as_cloud(x)
    norms = _row_norms(x)
    x = x[norms > 0]
    n_pairs = x.shape[0] // 2
    if n_pairs == 0:
        return float("nan"), float("nan"), 0
    order = np.random.default_rng(seed).permutation(x.shape[0])[: 2 * n_pairs]
    a, b = x[order[0::2]].astype(np.float64), x[order[1::2]].astype(np.float64)
    cos = np.einsum("ij,ij->i", a, b) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    se = float(cos.std(ddof=1) / np.sqrt(n_pairs)) if n_pairs > 1 else float("nan")
    return float(cos.mean()), se, n_pairs


def centred_avg_cos(x, chunk_rows: int | None = None) -> float:
    """avg_cos of x_i - mean(x): the anisotropy left once the common drift is removed.

    For any centred set of equal-norm vectors this is exactly -1/(N-1). NaN for a cloud without spread
    (has_spread): its centred vectors are rounding.
    """
    x = _as_cloud(x)
    if not has_spread(x, chunk_rows):
        return float("nan")
    return avg_cos_from_sums(*unit_sum(x, shift=_mean(x, chunk_rows), chunk_rows=chunk_rows))


# --------------------------------------------------------------------------- drift
def drift_from_sums(sum_x: np.ndarray, sum_norm: float, n: int) -> tuple[float, float]:
    """(drift_norm, drift_ratio) from streamed sums: sum_x = sum_i x_i, sum_norm = sum_i ||x_i||.

    ``drift_norm = ||mean_i x_i||``, ``drift_ratio = drift_norm / mean_i ||x_i||`` (in [0, 1]).
    NaN when n < 1 (ratio NaN also when every vector is zero).
    """
    if n < 1:
        return float("nan"), float("nan")
    dn = float(np.linalg.norm(np.asarray(sum_x, dtype=np.float64)) / n)
    mean_norm = float(sum_norm) / n
    return dn, (dn / mean_norm if mean_norm > 0 else float("nan"))


def drift(x, chunk_rows: int | None = None) -> tuple[float, float]:
    """(drift_norm, drift_ratio) of the rows of x (all rows count, zero rows included)."""
    x = _as_cloud(x)
    sum_x = np.zeros(x.shape[1])
    sum_norm = 0.0
    for c in _chunks(x, chunk_rows):
        sum_x += c.sum(axis=0)
        sum_norm += float(_row_norms(c).sum())
    return drift_from_sums(sum_x, sum_norm, x.shape[0])


def norm_spread_from_moments(sum_norm: float, m2_norm: float, n: int) -> tuple[float, float]:
    """(mean, population std) of vector norms from sum ||x_i|| and M2 = sum_i (||x_i|| - mean)^2, streamed without
    cancellation (anisweep.moments; sum ||x||^2 / n - mean^2 would lose the digits of mean^2 / variance)."""
    if n < 1:
        return float("nan"), float("nan")
    return float(sum_norm) / n, float(np.sqrt(max(float(m2_norm), 0.0) / n))


# --------------------------------------------------------------------------- spread
#: The relative spread below which a cloud counts as one point: deviations from the mean under 1e-5 of the norm,
#: about a hundred float32 roundings of it, where the "covariance" is rounding (a corpus of one repeated word at a
#: layer that sees no position) and its eigenvalues describe the arithmetic, not the model.
SPREAD_TOLERANCE = 1e-10


def relative_spread(x, chunk_rows: int | None = None) -> float:
    """``sum_i ||x_i - mean||^2 / sum_i ||x_i||^2``: the trace of the covariance (population) over the mean squared
    norm, the share of the cloud's second moment that is spread about its mean, in [0, 1] (0: every point the
    same). NaN for an empty or all-zero cloud."""
    x = _as_cloud(x)
    if x.shape[0] == 0:
        return float("nan")
    total = sum(float(np.einsum("ij,ij->", c, c)) for c in _chunks(x, chunk_rows))
    shift = _mean(x, chunk_rows)
    spread = sum(float(np.einsum("ij,ij->", c, c)) for c in _chunks(x, chunk_rows, shift))
    return spread / total if total > 0 else float("nan")


def has_spread(x, chunk_rows: int | None = None) -> bool:
    """Whether the cloud's relative spread reaches SPREAD_TOLERANCE (False for an empty or all-zero cloud)."""
    return relative_spread(x, chunk_rows) >= SPREAD_TOLERANCE


# --------------------------------------------------------------------------- spectrum-based
def cov_eigvals(x, chunk_rows: int | None = None) -> np.ndarray:
    """Eigenvalues (descending, clipped at 0) of the covariance of the rows of x (ddof=1)."""
    x = _as_cloud(x)
    if x.shape[0] < 2:
        raise ValueError(f"covariance needs at least 2 points, got {x.shape[0]}")
    ev = np.linalg.eigvalsh(_centred_scatter(x, chunk_rows) / (x.shape[0] - 1))
    return np.clip(ev[::-1], 0.0, None)


def isoscore(x, chunk_rows: int | None = None) -> float:
    """IsoScore (Rudman et al. 2022) of n points (ROWS of x) in d dims, in [0, 1].

    lambda = variances along the principal axes (eigenvalues of the covariance),
    ``lambda_hat = sqrt(d) lambda / ||lambda||``, ``delta = ||lambda_hat - 1|| / sqrt(2 (d - sqrt d))``,
    ``k = (d - delta^2 (d - sqrt d))^2 / d^2``, ``IsoScore = (d k - 1) / (d - 1)``.
    1 = equal variance in every direction; (k-1)/(d-1) = isotropic in a k-dim subspace; 0 = a line.
    Raises ValueError when n < d: the covariance then has rank < d and the score is artificially
    low. NaN for d < 2 or a cloud without spread (has_spread).
    """
    x = _as_cloud(x)
    n, d = x.shape
    if n < d:
        raise ValueError(
            f"IsoScore needs at least d points (got n={n} points in d={d} dims); "
            "with fewer the covariance is rank-deficient and the score is artificially low: sample more tokens"
        )
    if d < 2 or not has_spread(x, chunk_rows):
        return float("nan")
    return float(isoscore_of_variances(cov_eigvals(x, chunk_rows)))


def isoscore_of_variances(lam: np.ndarray) -> np.ndarray | float:
    """IsoScore from the principal variances `lam` (isoscore's formula): a float for (d,), an array for (..., d),
    one score per row; NaN where they are all 0."""
    lam = np.asarray(lam, dtype=np.float64)
    if lam.ndim > 1:
        rows = lam.reshape(-1, lam.shape[-1])
        return np.array([isoscore_of_variances(row) for row in rows]).reshape(lam.shape[:-1])
    d = lam.shape[0]
    norm = np.linalg.norm(lam)
    if not norm > 0:
        return float("nan")
    sd = np.sqrt(d)
    lam_hat = sd * lam / norm
    delta = np.linalg.norm(lam_hat - 1.0) / np.sqrt(2.0 * (d - sd))
    k = (d - delta**2 * (d - sd)) ** 2 / d**2
    return float((d * k - 1.0) / (d - 1.0))


def top_eig_share(x, chunk_rows: int | None = None) -> float:
    """Largest eigenvalue of the centred covariance over its trace (NaN for a cloud without spread, has_spread)."""
    if not has_spread(x, chunk_rows):
        return float("nan")
    lam = cov_eigvals(x, chunk_rows)
    tr = lam.sum()
    return float(lam[0] / tr) if tr > 0 else float("nan")


def partition_isotropies(w, centre: bool = False, chunk_rows: int | None = None) -> dict[str, float]:
    """Partition isotropy I(W) of Mu & Viswanath (2018) of the rows w_i of W, two ways, in [0, 1].

    ``Z(c) = sum_i exp(<w_i, c>)`` over the eigenvectors c of W^T W; ``I(W) = min_c Z / max_c Z``.
    An eigenvector's sign is arbitrary, so the set of c is a convention:

    - ``partition_isotropy``: both c and -c for every eigenvector. Sign-free, hence well defined.
    - ``partition_isotropy_mm``: each eigenvector with the one sign ``np.linalg.eigh`` returns (LAPACK
      ``dsyevd``), as Machina & Mercer 2024 compute it (``compute_IW`` in anemily-machina/isotropy_transformers,
      with ``torch.linalg.eigh``). It depends on the sign the LAPACK build picks; it is >= the sign-free
      value, and on drifted matrices much larger (the sign-free one is roughly its square).

    Both come from one eigendecomposition, evaluated as exp(min log Z - max log Z) with a streamed
    logsumexp: naive exp overflows for rows of norm >~ 710 (a tiny I can underflow to 0.0).
    ``centre=True`` subtracts the row mean first. NaN for an empty W.
    """
    w = _as_cloud(w)
    if w.shape[0] == 0:
        return {"partition_isotropy": float("nan"), "partition_isotropy_mm": float("nan")}
    d = w.shape[1]
    shift = _mean(w, chunk_rows) if centre else None
    gram = np.zeros((d, d))
    for c in _chunks(w, chunk_rows, shift, _GEMM_ELEMS):
        gram += c.T @ c
    _, vecs = np.linalg.eigh(gram)
    log_z = np.full(2 * d, -np.inf)  # log Z(c) for every c as eigh returns it, then for every -c
    for c in _chunks(w, chunk_rows, shift, _GEMM_ELEMS):
        p = c @ vecs
        log_z[:d] = np.logaddexp(log_z[:d], _logsumexp_rows(p))
        np.negative(p, out=p)
        log_z[d:] = np.logaddexp(log_z[d:], _logsumexp_rows(p))
    as_returned = log_z[:d]
    return {
        "partition_isotropy": float(np.exp(log_z.min() - log_z.max())),
        "partition_isotropy_mm": float(np.exp(as_returned.min() - as_returned.max())),
    }


def partition_isotropy(w, centre: bool = False, chunk_rows: int | None = None) -> float:
    """Sign-free I(W) (both c and -c): ``partition_isotropies(...)["partition_isotropy"]``."""
    return partition_isotropies(w, centre, chunk_rows)["partition_isotropy"]


def partition_isotropy_mm(w, centre: bool = False, chunk_rows: int | None = None) -> float:
    """I(W) over the eigenvectors as ``np.linalg.eigh`` returns them, Machina & Mercer's convention."""
    return partition_isotropies(w, centre, chunk_rows)["partition_isotropy_mm"]


def _logsumexp_rows(p: np.ndarray) -> np.ndarray:
    """log sum_i exp(p_ij) per column j, with one temporary (scipy's logsumexp makes several)."""
    m = p.max(axis=0)
    t = np.subtract(p, m)
    np.exp(t, out=t)
    return m + np.log(t.sum(axis=0))


# --------------------------------------------------------------------------- across layers
EXACT_PERMUTATION_MAX_N = 8  # 8! = 40,320 orderings: enumerated; beyond, a seeded Monte Carlo
MONTE_CARLO_PERMUTATIONS = 100_000
PERMUTATION_SEED = 0
_P_TOLERANCE = 1e-12  # relative: permuted statistics equal to the observed one up to rounding count as equal


def permutation_p(x: np.ndarray, y: np.ndarray) -> tuple[float, float, bool, int]:
    """(r, two-sided p, exact, number of orderings) of the Pearson correlation of x and y under permutation.

    The null distribution is r(x, y[perm]) over every ordering of y when n <= EXACT_PERMUTATION_MAX_N
    (exact: ``p = 2 min(#{r_perm <= r}, #{r_perm >= r}) / n!``, capped at 1, the identity included, so
    p >= 2/n!), else over MONTE_CARLO_PERMUTATIONS random orderings from a generator seeded with
    PERMUTATION_SEED (``p = 2 min(#{...} + 1) / (N + 1)``, the observed ordering counted once, as in
    ``scipy.stats.permutation_test``). Spearman is this on the (average-tie) ranks.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    zx = (x - x.mean()) / np.linalg.norm(x - x.mean())
    zy = (y - y.mean()) / np.linalg.norm(y - y.mean())
    n = x.size
    r = float(np.clip(zx @ zy, -1.0, 1.0))
    gamma = _P_TOLERANCE * max(1.0, abs(r))
    exact = n <= EXACT_PERMUTATION_MAX_N
    if exact:
        orders = np.array(list(itertools.permutations(range(n))), dtype=np.intp)
        null = zy[orders] @ zx
        less, greater, total = (null <= r + gamma).sum(), (null >= r - gamma).sum(), len(orders)
    else:
        gen = np.random.default_rng(PERMUTATION_SEED)
        less = greater = 0
        for start in range(0, MONTE_CARLO_PERMUTATIONS, 10_000):
            batch = min(10_000, MONTE_CARLO_PERMUTATIONS - start)
            null = gen.permuted(np.tile(zy, (batch, 1)), axis=1) @ zx
            less += int((null <= r + gamma).sum())
            greater += int((null >= r - gamma).sum())
        less, greater, total = less + 1, greater + 1, MONTE_CARLO_PERMUTATIONS + 1
    return r, float(min(1.0, 2.0 * min(less, greater) / total)), exact, total


def layer_correlations(drift_norm: Sequence[float], avg_cos: Sequence[float]) -> dict[str, float]:
    """Spearman and Pearson correlation of drift_norm vs avg_cos over layers, with permutation p-values.

    p-values are two-sided permutation p-values (``permutation_p``): exact over every ordering up to
    EXACT_PERMUTATION_MAX_N layers, seeded Monte Carlo beyond. The t approximation scipy's spearmanr and
    pearsonr use is invalid for a handful of layers (5 perfectly monotone points: t gives p ~ 1e-24, the
    exact p is 2/5! = 0.017). ``p_exact`` is 1.0 when enumerated, 0.0 when Monte Carlo;
    ``n_permutations`` the number of orderings the p-values rest on (n! when exact). ``spearman_p_ttest`` and
    ``pearson_p_ttest`` are the t-approximation p-values (``ttest_p``), those of scipy and of Godey et al.'s
    Fig. 5/16, for comparison with the paper only.
    Pairs with a non-finite value are dropped; every value is NaN (no warning) when fewer than
    3 pairs remain or either input is constant.
    """
    a = np.asarray(drift_norm, dtype=np.float64).ravel()
    b = np.asarray(avg_cos, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"drift_norm and avg_cos differ in length: {a.size} vs {b.size}")
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    keys = (
        "spearman_r",
        "spearman_p",
        "pearson_r",
        "pearson_p",
        "p_exact",
        "n_permutations",
        "spearman_p_ttest",
        "pearson_p_ttest",
    )
    out = dict.fromkeys(keys, float("nan"))
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return out
    out["spearman_r"], out["spearman_p"], exact, total = permutation_p(stats.rankdata(a), stats.rankdata(b))
    out["pearson_r"], out["pearson_p"], _, _ = permutation_p(a, b)
    out.update(p_exact=float(exact), n_permutations=float(total))
    out["spearman_p_ttest"] = ttest_p(out["spearman_r"], a.size)
    out["pearson_p_ttest"] = ttest_p(out["pearson_r"], a.size)
    return out


def ttest_p(r: float, n: int) -> float:
    """Two-sided p of a correlation r over n points from Student's t with n - 2 degrees of freedom,
    t = r sqrt((n - 2) / (1 - r^2)): what scipy's pearsonr and spearmanr report, and what Godey et al.'s Fig. 5/16
    p-values are. Comparable with theirs, not valid with a handful of layers (see layer_correlations); |r| = 1
    gives 0 (as scipy; within 1e-12, since r computed from ranks can miss 1 by rounding)."""
    if not np.isfinite(r) or n < 3:
        return float("nan")
    r = float(np.clip(r, -1.0, 1.0))
    if abs(r) >= 1.0 - 1e-12:
        return 0.0
    t = abs(r) * np.sqrt((n - 2) / (1.0 - r * r))
    return float(2.0 * stats.t.sf(t, n - 2))


# --------------------------------------------------------------------------- attention / LayerNorm
def qk_alignment(q_mean: np.ndarray, k_mean: np.ndarray) -> tuple[float, float]:
    """(qk_cos, qk_mean_score) of a head's mean query and mean key.

    ``qk_cos = cos(q_mean, k_mean)`` is SIGNED (heads drift in the same or the opposite direction;
    NaN if either is zero); ``qk_mean_score = <q_mean, k_mean> / sqrt(d_head)`` is the part of every
    attention logit contributed by the common drift.
    """
    q = np.asarray(q_mean, dtype=np.float64).ravel()
    k = np.asarray(k_mean, dtype=np.float64).ravel()
    if q.shape != k.shape:
        raise ValueError(f"q_mean and k_mean differ in length: {q.size} vs {k.size}")
    dot = float(q @ k)
    nn = float(np.linalg.norm(q) * np.linalg.norm(k))
    return (dot / nn if nn > 0 else float("nan")), dot / float(np.sqrt(q.size))


def qk_mean_dot(q_mean: np.ndarray, k_mean: np.ndarray) -> float:
    """``<q_mean, k_mean>``, unscaled (Godey et al. Fig. 14): qk_mean_score without the 1/sqrt(d_head)."""
    q = np.asarray(q_mean, dtype=np.float64).ravel()
    k = np.asarray(k_mean, dtype=np.float64).ravel()
    if q.shape != k.shape:
        raise ValueError(f"q_mean and k_mean differ in length: {q.size} vs {k.size}")
    return float(q @ k)


def qk_cos_concat(q_means: Sequence[np.ndarray], k_means: Sequence[np.ndarray]) -> float:
    """Cosine of a layer's mean queries and mean keys concatenated over its heads (Godey et al. Fig. 23).

    ``cos([q_mean_0, ..., q_mean_H-1], [k_mean_0, ..., k_mean_H-1])`` = sum_h <q_h, k_h> over
    sqrt(sum_h ||q_h||^2 sum_h ||k_h||^2): heads with large means weigh more than in the mean of qk_cos.
    """
    q = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in q_means])
    k = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in k_means])
    return qk_alignment(q, k)[0]


def layernorm_param_stats(gain: np.ndarray, bias: np.ndarray | None) -> dict[str, float]:
    """gain_mean, gain_std (population), gain_min, gain_max, bias_norm (NaN if no bias)."""
    g = np.asarray(gain, dtype=np.float64).ravel()
    return {
        "gain_mean": float(g.mean()),
        "gain_std": float(g.std()),
        "gain_min": float(g.min()),
        "gain_max": float(g.max()),
        "bias_norm": float("nan") if bias is None else float(np.linalg.norm(np.asarray(bias, dtype=np.float64))),
    }


def bias_drift_share(bias: np.ndarray, mean_out: np.ndarray) -> float:
    """Share of a LayerNorm output's drift that its bias contributes.

    The output is y = g * z_hat + b, so its mean (the drift) is mean_out = g * mean(z_hat) + b. The
    share is the projection of b on the drift direction: ``<b, mean_out> / ||mean_out||^2``.
    1.0 = the whole drift is the bias, 0 = the bias is orthogonal to it (it can be < 0 or > 1 when
    the gain term opposes it). NaN when mean_out is zero.
    """
    b = np.asarray(bias, dtype=np.float64).ravel()
    m = np.asarray(mean_out, dtype=np.float64).ravel()
    mm = float(m @ m)
    return float(b @ m) / mm if mm > 0 else float("nan")
