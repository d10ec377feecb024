"""The shape of a spectrum, not only its top: RankMe, alpha-ReQ, proportional effective rank and the condition
number of a matrix's singular values, and the Gini and Hoyer sparsity of its entries.

- RankMe (Garrido et al. 2023): exp(-sum p_i log p_i), p_i = s_i / sum_j s_j + RANKME_EPS over the singular values s
  of the (uncentred) matrix; d for a flat spectrum of d values, 1 for a rank-one matrix.
- alpha-ReQ (Agrawal et al. 2022), fitted as Li et al. 2025 fit it (melodylizx/Tracing-the-representation-geometry-
  of-language-models, utils/powerlaw.py `stringer_get_powerlaw`, called with trange = np.arange(11, 100) in
  rankme_alpha_scripts/compute_alpha_rankme_olmo2.py and compute_alpha_pythia.py, commit c9b6f82): the eigenvalues
  lambda_r of the centred covariance, and alpha the slope of log lambda_r against -log r by least squares weighted
  1 / r over the ranks ALPHA_FIRST_RANK..ALPHA_LAST_RANK (12 to 100). A spectrum too short for that range (d < 110)
  ends its fit TAIL_LEFT_OUT ranks before its last positive eigenvalue, as their plots leave out the tail of spectra
  shorter than 512; under ALPHA_MIN_RANKS ranks alpha is NaN.
- proportional effective rank (pico-lm/pico-analyze, src/metrics/per.py): exp(-sum p_i log p_i) / len(s),
  p_i = s_i / sum_j s_j (0 log 0 = 0), the effective rank (Roy & Vetterli 2007) over the number of singular values.
- condition number (pico-analyze, src/metrics/condition_number.py): s_max / s_min, inf where s_min is 0.
- Gini (pico-analyze, src/metrics/gini.py): of |x| sorted ascending, sum_i (2i - n - 1) x_(i) / (n sum x); 0 for equal
  entries, (n - 1) / n for one non-zero entry.
- Hoyer (pico-analyze, src/metrics/hoyer.py): (sqrt(n) - ||x||_1 / ||x||_2) / (sqrt(n) - 1); 0 for equal entries,
  1 for one non-zero entry.
"""

from __future__ import annotations

import math

import numpy as np

RANKME_EPS = 1e-7  # Garrido et al. 2023's epsilon, also Li et al.'s code's
ALPHA_FIRST_RANK = 12
ALPHA_LAST_RANK = 100
TAIL_LEFT_OUT = 10
ALPHA_MIN_RANKS = 3


def _entropy(p: np.ndarray) -> float:
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def rankme(singular: np.ndarray, eps: float = RANKME_EPS) -> float:
    """RankMe of a spectrum (singular values, or eigenvalues as Li et al.'s code passes them)."""
    singular = np.asarray(singular, dtype=np.float64)
    total = np.abs(singular).sum()
    if not total > 0:
        return float("nan")
    return math.exp(_entropy(singular / total + eps))


def proportional_effective_rank(singular: np.ndarray) -> float:
    singular = np.asarray(singular, dtype=np.float64)
    total = singular.sum()
    if not total > 0:
        return float("nan")
    return math.exp(_entropy(singular / total)) / len(singular)


def condition_number(singular: np.ndarray) -> float:
    singular = np.asarray(singular, dtype=np.float64)
    if len(singular) == 0 or not singular.max() > 0:
        return float("nan")
    smallest = singular.min()
    return float(singular.max() / smallest) if smallest > 0 else float("inf")


def covariance_eigenvalues(x: np.ndarray) -> np.ndarray:
    """Eigenvalues (descending) of the centred covariance of the rows of x, from the SVD of the centred rows (the
    small ones keep their digits); those below the SVD's rank tolerance are 0."""
    x = np.asarray(x, dtype=np.float64)
    if len(x) < 2:
        return np.zeros(0)
    singular = np.linalg.svd(x - x.mean(axis=0), compute_uv=False)
    tolerance = singular[0] * max(x.shape) * np.finfo(np.float64).eps if len(singular) else 0.0
    return np.where(singular > tolerance, singular, 0.0) ** 2 / (len(x) - 1)


def alpha_ranks(eigenvalues: np.ndarray) -> tuple[int, int]:
    """(first, last) rank alpha_req fits, from 1; last < first where the spectrum is too short."""
    positive = int((np.asarray(eigenvalues) > 0).sum())
    return ALPHA_FIRST_RANK, min(ALPHA_LAST_RANK, positive - TAIL_LEFT_OUT)


def alpha_req(eigenvalues: np.ndarray) -> tuple[float, int]:
    """(alpha, the last rank fitted): the power-law decay exponent of a descending eigenspectrum, lambda_r ~ r^-alpha,
    by least squares of log lambda_r on log r weighted 1 / r over alpha_ranks; (NaN, last) under ALPHA_MIN_RANKS."""
    eigenvalues = np.asarray(eigenvalues, dtype=np.float64)
    first, last = alpha_ranks(eigenvalues)
    if last - first + 1 < ALPHA_MIN_RANKS:
        return float("nan"), last
    ranks = np.arange(first, last + 1, dtype=np.float64)
    y = np.log(eigenvalues[first - 1 : last])
    design = np.stack([-np.log(ranks), np.ones_like(ranks)], axis=1)
    weights = 1.0 / ranks
    slope, _ = np.linalg.solve(design.T @ (design * weights[:, None]), (design * weights[:, None]).T @ y)
    return float(slope), last


def gini(x: np.ndarray) -> float:
    values = np.sort(np.abs(np.asarray(x, dtype=np.float64).ravel()))
    n, total = len(values), values.sum()
    if n == 0 or not total > 0:
        return 0.0
    index = np.arange(1, n + 1, dtype=np.float64)
    return float(((2 * index - n - 1) * values).sum() / (n * total))


def hoyer(x: np.ndarray) -> float:
    values = np.asarray(x, dtype=np.float64).ravel()
    n = len(values)
    l2 = np.linalg.norm(values)
    if n < 2 or not l2 > 0:
        return float("nan")
    return float((math.sqrt(n) - np.abs(values).sum() / l2) / (math.sqrt(n) - 1))


def sample_spectral_values(x: np.ndarray, singular: np.ndarray) -> dict[str, float]:
    """The spectral metrics of one site's sampled vectors x (tokens, d), `singular` its uncentred singular values (as
    spectra.parquet holds them)."""
    eigenvalues = covariance_eigenvalues(x)
    alpha, last = alpha_req(eigenvalues)
    return {
        "rankme": rankme(singular),
        "rankme_cov": rankme(eigenvalues),
        "alpha_req": alpha,
        "alpha_req_last_rank": float(last),
        "prop_effective_rank": proportional_effective_rank(singular),
        "condition_number": condition_number(singular),
    }


def matrix_values(w: np.ndarray) -> dict[str, float]:
    """A weight matrix's condition number, Gini and Hoyer sparsity."""
    w = np.asarray(w, dtype=np.float64)
    return {
        "condition_number": condition_number(np.linalg.svd(w, compute_uv=False)),
        "gini": gini(w),
        "hoyer": hoyer(w),
    }
