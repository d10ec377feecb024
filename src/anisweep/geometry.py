"""Representation-geometry metrics: pure numpy/scipy, no torch, no file I/O.

Each function's docstring gives its exact definition; the README's "What is measured" says which tables and
sites they are computed on, and ``tests/test_metrics.py`` checks each against an independent computation.
The metrics and where they come from:

- ``avg_cos``: mean cosine similarity over all distinct pairs of vectors, the usual anisotropy measure
  (Ethayarajh 2019, "How Contextual are Contextualized Word Representations?"); ``centred_avg_cos`` is the
  same after subtracting the mean vector.
- ``drift``: the norm of the mean vector, and its ratio to the mean norm: the common direction all
  representations share (Bis et al. 2021, "Too Much in Common"; Godey et al. 2024, "Anisotropy Is Inherent
  to Self-Attention in Transformers").
- ``isoscore``: IsoScore (Rudman et al. 2022, "IsoScore: Measuring the Uniformity of Embedding Space
  Utilization"), from the eigenvalues of the covariance; ``top_eig_share``: the largest eigenvalue's share.
- ``partition_isotropy``: I(W) of Mu & Viswanath 2018 ("All-but-the-Top"), of the embedding matrices.
- ``qk_alignment``: cosine of a head's mean query and mean key, and their contribution to every attention
  logit (Godey et al. 2024).
- ``layer_correlations``: drift norm vs avg_cos across layers (Machina & Mercer 2024, "Anisotropy is Not
  Inherent to Transformers"); ``layernorm_param_stats``, ``bias_drift_share``: the LayerNorm's gain and bias.

Point clouds are ``(N, d)`` arrays whose ROWS are the points. Functions over a whole cloud stream it in
row chunks and accumulate in float64, so a float32 ``(1e6, 768)`` array is never copied whole into float64.
``chunk_rows`` overrides the chunk size; the defaults keep a chunk cache-sized (1 MB) for the memory-bound
streaming sums and 8 MB for the covariance products, which BLAS runs faster on larger blocks.

Degenerate inputs give NaN rather than an exception (a sweep must not die on one odd layer),
except where the answer would be silently wrong: IsoScore with fewer points than dimensions raises.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from scipy import stats

__all__ = [
    "avg_cos_from_sums",
    "unit_sum",
    "avg_cos",
    "centred_avg_cos",
    "drift",
    "drift_from_sums",
    "cov_eigvals",
    "isoscore",
    "top_eig_share",
    "partition_isotropy",
    "layer_correlations",
    "norm_spread_from_sums",
    "qk_alignment",
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


def centred_avg_cos(x, chunk_rows: int | None = None) -> float:
    """avg_cos of x_i - mean(x): the anisotropy left once the common drift is removed.

    For any centred set of equal-norm vectors this is exactly -1/(N-1).
    """
    x = _as_cloud(x)
    if x.shape[0] == 0:
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


def norm_spread_from_sums(sum_norm: float, sum_norm_sq: float, n: int) -> tuple[float, float]:
    """(mean, population std) of vector norms from sum ||x_i|| and sum ||x_i||^2 (variance clipped at 0)."""
    if n < 1:
        return float("nan"), float("nan")
    mean = float(sum_norm) / n
    var = float(sum_norm_sq) / n - mean * mean
    return mean, float(np.sqrt(max(var, 0.0)))


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
    low. NaN for d < 2 or a constant cloud.
    """
    x = _as_cloud(x)
    n, d = x.shape
    if n < d:
        raise ValueError(
            f"IsoScore needs at least d points (got n={n} points in d={d} dims); "
            "with fewer the covariance is rank-deficient and the score is artificially low: sample more tokens"
        )
    if d < 2:
        return float("nan")
    lam = cov_eigvals(x, chunk_rows)
    norm = np.linalg.norm(lam)
    if not norm > 0:
        return float("nan")
    sd = np.sqrt(d)
    lam_hat = sd * lam / norm
    delta = np.linalg.norm(lam_hat - 1.0) / np.sqrt(2.0 * (d - sd))
    k = (d - delta**2 * (d - sd)) ** 2 / d**2
    return float((d * k - 1.0) / (d - 1.0))


def top_eig_share(x, chunk_rows: int | None = None) -> float:
    """Largest eigenvalue of the centred covariance over its trace (NaN for a constant cloud)."""
    lam = cov_eigvals(x, chunk_rows)
    tr = lam.sum()
    return float(lam[0] / tr) if tr > 0 else float("nan")


def partition_isotropy(w, centre: bool = False, chunk_rows: int | None = None) -> float:
    """Partition isotropy I(W) of Mu & Viswanath (2018) of the rows w_i of W, in [0, 1].

    ``Z(c) = sum_i exp(<w_i, c>)`` over the eigenvectors c of W^T W; ``I(W) = min_c Z / max_c Z``.
    An eigenvector's sign is arbitrary (LAPACK's choice), so both c and -c are used: this makes the
    result well defined. Evaluated as exp(min log Z - max log Z) with a streamed logsumexp: naive
    exp overflows for rows of norm >~ 710 (a tiny I can underflow to 0.0). ``centre=True`` subtracts the row mean first.
    """
    w = _as_cloud(w)
    if w.shape[0] == 0:
        return float("nan")
    shift = _mean(w, chunk_rows) if centre else None
    gram = np.zeros((w.shape[1], w.shape[1]))
    for c in _chunks(w, chunk_rows, shift, _GEMM_ELEMS):
        gram += c.T @ c
    _, vecs = np.linalg.eigh(gram)
    log_z = np.full(2 * w.shape[1], -np.inf)  # log Z(c) for every +c, then every -c
    for c in _chunks(w, chunk_rows, shift, _GEMM_ELEMS):
        p = c @ vecs
        log_z[: w.shape[1]] = np.logaddexp(log_z[: w.shape[1]], _logsumexp_rows(p))
        np.negative(p, out=p)
        log_z[w.shape[1] :] = np.logaddexp(log_z[w.shape[1] :], _logsumexp_rows(p))
    return float(np.exp(log_z.min() - log_z.max()))


def _logsumexp_rows(p: np.ndarray) -> np.ndarray:
    """log sum_i exp(p_ij) per column j, with one temporary (scipy's logsumexp makes several)."""
    m = p.max(axis=0)
    t = np.subtract(p, m)
    np.exp(t, out=t)
    return m + np.log(t.sum(axis=0))


# --------------------------------------------------------------------------- across layers
def layer_correlations(drift_norm: Sequence[float], avg_cos: Sequence[float]) -> dict[str, float]:
    """Spearman and Pearson correlation (with two-sided p-values) of drift_norm vs avg_cos over layers.

    Pairs with a non-finite value are dropped; all four values are NaN (no warning) when fewer than
    3 pairs remain or either input is constant.
    """
    a = np.asarray(drift_norm, dtype=np.float64).ravel()
    b = np.asarray(avg_cos, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"drift_norm and avg_cos differ in length: {a.size} vs {b.size}")
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    nan = float("nan")
    out = {"spearman_r": nan, "spearman_p": nan, "pearson_r": nan, "pearson_p": nan}
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return out
    sr = stats.spearmanr(a, b)
    pr = stats.pearsonr(a, b)
    out.update(
        spearman_r=float(sr.statistic),
        spearman_p=float(sr.pvalue),
        pearson_r=float(pr.statistic),
        pearson_p=float(pr.pvalue),
    )
    return out


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
