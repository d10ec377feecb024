"""Semi-nonnegative matrix factorisation (Ding, Li & Jordan 2010, "Convex and Semi-Nonnegative Matrix
Factorizations", IEEE TPAMI 32(1)): activations X (n tokens x d, mixed signs) ~ G F^T with nonnegative
coefficients G (n x k) and mixed-sign directions F (d x k). The span of F is the rank-k "tangent proxy"
of anisweep.tangent.

`semi_nmf` runs the paper's updates: F = X^T G (G^T G)^-1 in closed form, then the multiplicative update of
G, which never increases ||X - G F^T||_F. `semi_nmf_als` is a plain alternating least-squares reference
(F by least squares, each row of G by nonnegative least squares), slow but simple, for tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_EPS = 1e-12


@dataclass
class SemiNMF:
    """X ~ G F^T. `error` is ||X - G F^T||_F / ||X||_F; `iterations` the updates run."""

    F: np.ndarray  # (d, k) directions, mixed signs
    G: np.ndarray  # (n, k) coefficients, >= 0
    error: float
    iterations: int

    def basis(self) -> np.ndarray:
        """An orthonormal basis (d, r) of span(F), r = rank of F."""
        return orthonormal_basis(self.F)


def orthonormal_basis(a: np.ndarray, tol: float = 1e-10) -> np.ndarray:
    """Orthonormal columns spanning the columns of `a` (numerically dependent columns dropped)."""
    u, s, _ = np.linalg.svd(np.asarray(a, np.float64), full_matrices=False)
    if not s.size or s[0] == 0:
        return u[:, :0]
    return u[:, s > tol * s[0]]


def _check(x: np.ndarray, rank: int) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if x.ndim != 2:
        raise ValueError(f"semi-NMF: expected a 2-D array (tokens x d), got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("semi-NMF: the activations hold NaN or inf; drop non-finite rows first")
    if not 1 <= rank <= min(x.shape):
        raise ValueError(f"semi-NMF: rank {rank} must be between 1 and min(n, d) = {min(x.shape)} for shape {x.shape}")
    return x


def _kmeans_init(x: np.ndarray, k: int, rng: np.random.Generator, iterations: int = 10) -> np.ndarray:
    """The paper's initialisation: cluster indicators of k-means, plus 0.2 everywhere."""
    centres = x[rng.choice(len(x), size=k, replace=False)]
    for _ in range(iterations):
        d2 = (x * x).sum(1)[:, None] - 2 * x @ centres.T + (centres * centres).sum(1)[None, :]
        labels = d2.argmin(1)
        for j in range(k):
            members = x[labels == j]
            centres[j] = members.mean(0) if len(members) else x[rng.integers(len(x))]
    g = np.full((len(x), k), 0.2)
    g[np.arange(len(x)), labels] += 1.0
    return g


def _directions(x: np.ndarray, g: np.ndarray, norm_x: float) -> tuple[np.ndarray, float]:
    """argmin_F ||X - G F^T|| (the paper's F = X^T G (G^T G)^-1, with a pseudo-inverse where G^T G is singular),
    and the relative error it leaves. The error comes from the k x k and d x k products already at hand,
    ||X||^2 - 2 <F, X^T G> + <G^T G, F^T F>, rather than from the n x d residual (a third of an update's cost);
    it is recomputed from the residual when that difference is too small to trust (an error under 1e-2)."""
    xtg, gtg = x.T @ g, g.T @ g
    f = (np.linalg.pinv(gtg, hermitian=True) @ xtg.T).T
    if not norm_x:
        return f, 0.0
    squared = norm_x**2 - 2.0 * float(np.vdot(f, xtg)) + float(np.vdot(gtg, f.T @ f))
    if squared < 1e-4 * norm_x**2:
        return f, float(np.linalg.norm(x - g @ f.T) / norm_x)
    return f, float(np.sqrt(squared) / norm_x)


def _alternate(x, rank: int, seed: int, max_iter: int, tol: float, update_g) -> SemiNMF:
    """From the k-means start, alternate G = update_g(x, g, f) and the exact F, until the relative error improves
    by less than `tol` (relative) between two updates, or after `max_iter` updates."""
    x = _check(x, rank)
    rng = np.random.default_rng(seed)
    g = _kmeans_init(x, rank, rng)
    norm_x = float(np.linalg.norm(x))
    f, error = _directions(x, g, norm_x)
    iterations = 0
    while iterations < max_iter:
        iterations += 1
        g = update_g(x, g, f)
        previous = error
        f, error = _directions(x, g, norm_x)
        if previous - error <= tol * max(previous, _EPS):
            break
    return SemiNMF(f, g, error, iterations)


def _multiplicative_update(x: np.ndarray, g: np.ndarray, f: np.ndarray) -> np.ndarray:
    xf, ff = x @ f, f.T @ f
    numerator = np.maximum(xf, 0) + g @ np.maximum(-ff, 0)
    denominator = np.maximum(-xf, 0) + g @ np.maximum(ff, 0)
    return g * np.sqrt(numerator / np.maximum(denominator, _EPS))


def semi_nmf(x, rank: int, seed: int = 0, max_iter: int = 500, tol: float = 1e-6) -> SemiNMF:
    """Fit X (n x d) ~ G F^T with G >= 0 by the multiplicative updates of Ding, Li & Jordan (2010).

    Stops when the relative error improves by less than `tol` (relative) between two updates, or after
    `max_iter` updates. Seeded: the same x, rank and seed give the same factors.
    """
    return _alternate(x, rank, seed, max_iter, tol, _multiplicative_update)


def semi_nmf_als(x, rank: int, seed: int = 0, max_iter: int = 200, tol: float = 1e-8) -> SemiNMF:
    """Reference: alternating least squares, F by lstsq and every row of G by scipy's NNLS. Same start as
    `semi_nmf`; exact block minimisation at each half-step, so it is a lower bound on what the multiplicative
    updates reach from the same start after the same number of sweeps."""
    from scipy.optimize import nnls

    return _alternate(x, rank, seed, max_iter, tol, lambda x, g, f: np.stack([nnls(f, row)[0] for row in x]))


def principal_angles(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Principal angles (radians, ascending) between span(a) and span(b)."""
    qa, qb = orthonormal_basis(a), orthonormal_basis(b)
    s = np.linalg.svd(qa.T @ qb, compute_uv=False)
    return np.arccos(np.clip(s, -1.0, 1.0))
