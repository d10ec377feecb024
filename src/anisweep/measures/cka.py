"""Linear CKA (Kornblith et al. 2019) of two representations of the same n tokens, from d x d cross-products: never
an n x n Gram matrix, so memory grows with the dimensions, not the sample.

With X (n x d1) and Y (n x d2) centred column by column and the linear kernels K = X X^T, L = Y Y^T:

- biased: HSIC(K, L) = ||Y^T X||_F^2 (tr(K H L H) up to 1 / (n - 1)^2, which cancels in CKA);
- unbiased (Song et al. 2012's U-statistic, as Kornblith et al.'s `feature_space_linear_cka(debiased=True)` computes
  it): with K~ and L~ the kernels with their diagonals set to 0, n (n - 3) HSIC_u = tr(K~ L~) + 1^T K~ 1 1^T L~ 1 /
  ((n - 1)(n - 2)) - 2 / (n - 2) 1^T K~ L~ 1, which for centred features is ||Y^T X||_F^2 - n / (n - 2) sum_i a_i b_i
  + (sum_i a_i)(sum_i b_i) / ((n - 1)(n - 2)), a_i = ||x_i||^2, b_i = ||y_i||^2; it needs n >= 4.

CKA(X, Y) = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)): 1 for Y = X Q c + t (Q orthogonal, c > 0), near 0 for
independent representations (the unbiased estimate, not the biased one, whose value at independence grows with d / n).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Features:
    """One representation's centred features and what every HSIC of them needs: n, the row norms a_i = ||x_i||^2 and
    the self-similarity ||X^T X||_F^2."""

    x: np.ndarray
    row_norms: np.ndarray
    self_product: float

    @classmethod
    def of(cls, x) -> Features:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2:
            raise ValueError(f"CKA takes a matrix of n tokens x d features, got shape {x.shape}")
        x = x - x.mean(axis=0)
        return cls(x, np.square(x).sum(axis=1), _cross_norm(x, x))

    @property
    def n(self) -> int:
        return self.x.shape[0]


def _cross_norm(x: np.ndarray, y: np.ndarray) -> float:
    """||Y^T X||_F^2 from the d2 x d1 product."""
    return float(np.square(y.T @ x).sum())


def hsic(fx: Features, fy: Features, debiased: bool = False, cross: float | None = None) -> float:
    """HSIC of two centred representations of the same tokens, up to a factor of n that CKA cancels."""
    if fx.n != fy.n:
        raise ValueError(f"CKA compares representations of the same tokens: {fx.n} rows against {fy.n}")
    cross = _cross_norm(fx.x, fy.x) if cross is None else cross
    if not debiased:
        return cross
    n = fx.n
    if n < 4:
        raise ValueError(f"the unbiased HSIC needs at least 4 tokens, got {n}")
    return (
        cross
        - n / (n - 2) * float(fx.row_norms @ fy.row_norms)
        + float(fx.row_norms.sum()) * float(fy.row_norms.sum()) / ((n - 1) * (n - 2))
    )


def linear_cka(x, y, debiased: bool = False) -> float:
    """Linear CKA of x (n x d1) and y (n x d2), rows the same tokens; NaN where either has no spread."""
    fx, fy = Features.of(x), Features.of(y)
    return _cka(fx, fy, debiased)


def _cka(fx: Features, fy: Features, debiased: bool) -> float:
    xy = hsic(fx, fy, debiased)
    xx = hsic(fx, fx, debiased, cross=fx.self_product)
    yy = hsic(fy, fy, debiased, cross=fy.self_product)
    denominator = math.sqrt(xx * yy) if xx > 0 and yy > 0 else 0.0
    return xy / denominator if denominator > 0 else float("nan")


def cka_matrix(representations, debiased: bool = False) -> np.ndarray:
    """CKA of every pair of representations of the same tokens (e.g. a checkpoint's layers), symmetric, each
    representation centred once."""
    features = [Features.of(x) for x in representations]
    k = len(features)
    out = np.empty((k, k))
    for i in range(k):
        for j in range(i, k):
            out[i, j] = out[j, i] = _cka(features[i], features[j], debiased)
    return out
