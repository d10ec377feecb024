"""Semi-nonnegative matrix factorisation (Ding, Li & Jordan 2010, "Convex and Semi-Nonnegative Matrix
Factorizations", IEEE TPAMI 32(1)): activations X (n tokens x d, mixed signs) ~ G F^T with nonnegative
coefficients G (n x k) and mixed-sign directions F (d x k). The span of F is the rank-k "tangent proxy"
of anisweep.tangent.

`semi_nmf` minimises ||X - G F^T||_F by alternating least squares (ALS), from the paper's k-means start: each
sweep solves for G exactly given F (every row a k-variable nonnegative least-squares problem, all rows at once
by block principal pivoting, Kim & Park 2011, "Fast nonnegative matrix factorization: an active-set-like method
and comparisons", SIAM J. Sci. Comput. 33(6)) and then for F exactly given G (F = X^T G (G^T G)^-1). Both half
steps are exact block minimisations, so the error never increases. Each sweep also tries an extrapolated G
(Ang & Gillis 2019), kept only where it lowers the error, which about halves the sweeps. It converges in tens to
a few hundred sweeps (35-180, median 62, on the toys' 56 sites at rank 16; 2-3 s at 2048 tokens x d 768) where
the paper's multiplicative update of G (`solver="multiplicative"`, kept for comparison) needs about 10^4 updates:
at 100 or 200 updates its error is still 1.3-2.4x the optimum on planted data. `semi_nmf_als` is the same ALS without
extrapolation and with scipy's row-by-row NNLS, slow but simple, for tests.

A fit stops when a sweep changes the relative error by less than `tol` (relative), `converged` True, or at
`max_iter` sweeps, `converged` False and a `SemiNMFConvergenceWarning`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_EPS = 1e-12

MAX_ITER = 500  # ALS sweeps at most (the schema's gradients.max_iter default)
TOL = 1e-6  # a sweep that changes the relative error by less than this (relative) ends the fit
SOLVERS = ("als", "multiplicative")


class SemiNMFConvergenceWarning(UserWarning):
    """A semi-NMF fit stopped at its iteration cap before meeting its tolerance."""


@dataclass
class SemiNMF:
    """X ~ G F^T. `error` is ||X - G F^T||_F / ||X||_F; `iterations` the sweeps (updates of G and F) run;
    `converged` whether the last sweep changed the error by less than the tolerance (False: stopped at the cap)."""

    F: np.ndarray  # (d, k) directions, mixed signs
    G: np.ndarray  # (n, k) coefficients, >= 0
    error: float
    iterations: int
    converged: bool = True

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


def _alternate(
    x, rank: int, seed: int, max_iter: int, tol: float, update_g: Callable, unit: str, extrapolate: bool = False
) -> SemiNMF:
    """From the k-means start, alternate G = update_g(x, g, f) and the exact F, until an iteration changes the
    relative error by less than `tol` (relative), or after `max_iter` iterations (then warn).

    `extrapolate`: after each update, also try G + beta (G - G_before), clipped at 0, with its exact F, and keep it
    where its error is lower; beta grows after a success and shrinks after a failure (the extrapolation of Ang &
    Gillis 2019, "Accelerating nonnegative matrix factorization algorithms using extrapolation", Neural Comput.
    31(2), here kept monotone: a rejected try costs one F and leaves the plain update). Deterministic."""
    if max_iter < 1:
        raise ValueError(f"semi-NMF: max_iter must be at least 1, got {max_iter}")
    x = _check(x, rank)
    rng = np.random.default_rng(seed)
    g = _kmeans_init(x, rank, rng)
    norm_x = float(np.linalg.norm(x))
    f, error = _directions(x, g, norm_x)
    iterations, change, converged, beta = 0, np.inf, False, 0.5
    while iterations < max_iter:
        iterations += 1
        before, previous = g, error
        g = update_g(x, g, f)
        f, error = _directions(x, g, norm_x)
        if extrapolate:
            tried = np.maximum(g + beta * (g - before), 0.0)
            f_tried, error_tried = _directions(x, tried, norm_x)
            if error_tried < error:
                g, f, error, beta = tried, f_tried, error_tried, min(beta * 1.5, 4.0)
            else:
                beta = max(beta / 2, 0.05)
        change = (previous - error) / max(previous, _EPS)
        if abs(change) <= tol or error <= _EPS:
            converged = True
            break
    if not converged:
        warnings.warn(
            f"semi-NMF (rank {rank}, {x.shape[0]} x {x.shape[1]}) stopped at the cap of {iterations} {unit} before "
            f"converging: relative error {error:.6g}, last relative change {change:.3g} (tolerance {tol:g}); "
            "raise gradients.max_iter",
            SemiNMFConvergenceWarning,
            stacklevel=3,
        )
    return SemiNMF(f, g, error, iterations, converged)


def nnls_rows(gram: np.ndarray, targets: np.ndarray, start: np.ndarray | None = None, max_iter: int = 0) -> np.ndarray:
    """min_{g_i >= 0} ||x_i - F g_i||^2 for every row at once, from gram = F^T F (k x k) and targets = X F (n x k):
    block principal pivoting (Kim & Park 2011) with their backup rule against cycling, each row's passive set
    (the coordinates free to be positive) started at `start > 0` where given (a warm start), all rows' reduced
    systems solved as one batched solve. A ridge of 1e-12 of the mean of gram's diagonal keeps singular F (a zero
    or repeated column) solvable; a zero column of F gets coefficient 0."""
    gram = np.asarray(gram, np.float64)
    targets = np.asarray(targets, np.float64)
    n, k = targets.shape
    scale = float(np.mean(np.diag(gram))) if k else 0.0
    if n == 0 or scale <= 0:
        return np.zeros((n, k))
    h = gram + 1e-12 * scale * np.eye(k)
    passive = np.ones((n, k), bool) if start is None else np.asarray(start) > 0
    result = np.zeros((n, k))
    best = np.full(n, k + 1)  # the fewest infeasible coordinates seen, per row
    backup = np.full(n, 3)  # full exchanges left before the one-at-a-time backup rule
    rows = np.arange(n)
    # tolerances for "negative", against round-off: relative to the size of the row's solution and gradient
    slack = 1e-10 * (np.abs(targets).max(1) + _EPS)
    for _ in range(max_iter or 10 * k + 100):
        p, b = passive[rows], targets[rows]
        solution = _solve_passive(h, b, p)
        gradient = solution @ h - b  # y = H g - b, zero on the passive coordinates
        tolerance = slack[rows, None]
        infeasible = (p & (solution < -tolerance / scale)) | (~p & (gradient < -tolerance))
        count = infeasible.sum(1)
        done = count == 0
        result[rows[done]] = np.maximum(solution[done], 0.0)
        if done.all():
            return result
        # Kim & Park's rule: exchange all infeasible coordinates while their number falls, or for 3 more rounds;
        # then only the last infeasible coordinate, which guarantees termination
        keep = ~done
        rows, count, infeasible, solution = rows[keep], count[keep], infeasible[keep], solution[keep]
        fewer = count < best[rows]
        best[rows[fewer]] = count[fewer]
        backup[rows[fewer]] = 3
        spare = ~fewer & (backup[rows] >= 1)
        backup[rows[spare]] -= 1
        full = fewer | spare
        flip = np.where(full[:, None], infeasible, False)
        single = np.flatnonzero(~full)
        last = k - 1 - np.argmax(infeasible[single, ::-1], axis=1)
        flip[single, last] = True
        passive[rows] ^= flip
        result[rows] = np.maximum(solution, 0.0)  # the best so far, should the cap be reached
    return result


def _solve_passive(h: np.ndarray, targets: np.ndarray, passive: np.ndarray) -> np.ndarray:
    """Each row's solution of H g = b on its passive coordinates, its other coordinates held at 0 (the equation
    g_j = 0 in place of row and column j of H). A row passive everywhere solves H itself, shared rather than built
    per row (n copies of k x k were a third of an ALS sweep); every row is still its own solve, as before."""
    n, k = targets.shape
    whole = passive.all(1)
    if whole.all():
        return _solve_rows(np.broadcast_to(h, (n, k, k)), targets)
    solution = np.empty((n, k))
    if whole.any():
        solution[whole] = _solve_rows(np.broadcast_to(h, (int(whole.sum()), k, k)), targets[whole])
    part = ~whole
    if part.any():
        free = passive[part].astype(np.float64)
        system = h * free[:, :, None] * free[:, None, :]
        diagonal = np.arange(k)
        system[:, diagonal, diagonal] += 1.0 - free  # a fixed coordinate: the equation g_j = 0
        solution[part] = _solve_rows(system, targets[part] * passive[part])
    return solution


def _solve_rows(systems: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """x_i = systems_i^-1 rows_i for every i."""
    return np.linalg.solve(systems, rows[..., None])[..., 0]


def _als_update(x: np.ndarray, g: np.ndarray, f: np.ndarray) -> np.ndarray:
    """The exact G given F, warm-started at the current G's support."""
    return nnls_rows(f.T @ f, x @ f, start=g)


def _multiplicative_update(x: np.ndarray, g: np.ndarray, f: np.ndarray) -> np.ndarray:
    xf, ff = x @ f, f.T @ f
    numerator = np.maximum(xf, 0) + g @ np.maximum(-ff, 0)
    denominator = np.maximum(-xf, 0) + g @ np.maximum(ff, 0)
    return g * np.sqrt(numerator / np.maximum(denominator, _EPS))


def semi_nmf(
    x,
    rank: int,
    seed: int = 0,
    max_iter: int = MAX_ITER,
    tol: float = TOL,
    solver: str = "als",
    extrapolate: bool = True,
) -> SemiNMF:
    """Fit X (n x d) ~ G F^T with G >= 0, from the k-means start of Ding, Li & Jordan (2010).

    solver "als" (default): alternating least squares, exact NNLS for G and exact least squares for F per sweep;
    "multiplicative": the paper's multiplicative update of G (slow to converge, for comparison). Stops when an
    iteration changes the relative error by less than `tol` (relative), `converged` True, or after `max_iter`
    iterations, `converged` False with a SemiNMFConvergenceWarning. Seeded: the same x, rank and seed give the
    same factors.
    """
    if solver == "als":
        return _alternate(x, rank, seed, max_iter, tol, _als_update, "sweeps", extrapolate=extrapolate)
    if solver == "multiplicative":
        return _alternate(x, rank, seed, max_iter, tol, _multiplicative_update, "multiplicative updates")
    raise ValueError(f"semi-NMF: unknown solver {solver!r}; expected one of {SOLVERS}")


def semi_nmf_als(x, rank: int, seed: int = 0, max_iter: int = 200, tol: float = 1e-8) -> SemiNMF:
    """Reference: alternating least squares, F by lstsq and every row of G by scipy's NNLS, one row at a time.
    Same start as `semi_nmf`; the same iterates as its default solver, computed independently and slowly."""
    from scipy.optimize import nnls

    return _alternate(x, rank, seed, max_iter, tol, lambda x, g, f: np.stack([nnls(f, row)[0] for row in x]), "sweeps")


def principal_angles(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Principal angles (radians, ascending) between span(a) and span(b)."""
    qa, qb = orthonormal_basis(a), orthonormal_basis(b)
    s = np.linalg.svd(qa.T @ qb, compute_uv=False)
    return np.arccos(np.clip(s, -1.0, 1.0))
