"""Pure numpy: PCA and random bases, the energy and anisotropy shares of a subspace, the random controls and
the rows of gradients.parquet from one site's sums.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np

from anisweep.measures import geometry
from anisweep.tangent.sums import STRATA

if TYPE_CHECKING:
    from collections.abc import Sequence

    from anisweep.tangent.sums import SiteSums


# --------------------------------------------------------------------------- subspaces and shares
def pca_basis(x: np.ndarray, rank: int, centred: bool = True) -> np.ndarray:
    """The top-`rank` principal axes (d, rank) of the centred rows of x; with `centred=False` of the raw rows (the
    top right singular vectors of x: the reference semi-NMF, fitted to the raw activations, is to beat)."""
    x = np.asarray(x, np.float64)
    _, _, vt = np.linalg.svd(x - x.mean(0) if centred else x, full_matrices=False)
    return vt[:rank].T


def reference_bases(x: np.ndarray, rank: int) -> dict[str, np.ndarray]:
    """The PCA references of a semi-NMF fit of x: centred (`pca`) and uncentred (`pca_uncentred`)."""
    return {"pca": pca_basis(x, rank), "pca_uncentred": pca_basis(x, rank, centred=False)}


def random_bases(d: int, rank: int, n: int, seed: int) -> list[np.ndarray]:
    """`n` orthonormal bases of seeded Gaussian rank-`rank` subspaces of R^d (uniform on the Grassmannian)."""
    rng = np.random.default_rng(seed)
    return [np.linalg.qr(rng.standard_normal((d, rank)))[0] for _ in range(n)]


@functools.lru_cache(maxsize=8)
def control_bases(d: int, rank: int, n: int, seed: int) -> tuple[np.ndarray, ...]:
    """`random_bases`, read-only and computed once per process for each (d, rank, n, seed): every site, checkpoint
    and job of a model draws the same controls."""
    bases = random_bases(d, rank, n, seed)
    for basis in bases:
        basis.setflags(write=False)
    return tuple(bases)


def energy_share(basis: np.ndarray, second_moment: np.ndarray) -> float:
    """tr(U^T M U) / tr(M) = sum_t ||P g_t||^2 / sum_t ||g_t||^2 for M = sum_t g_t g_t^T."""
    total = float(np.trace(second_moment))
    # <U, M U> by one matrix product: a three-operand einsum looped over d x d x k in C, 40x slower
    return float(np.vdot(basis, second_moment @ basis) / total) if total > 0 else float("nan")


def top_eigenpairs(covariance: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The m largest eigenvalues (clipped at 0, descending) and their eigenvectors (d, m)."""
    values, vectors = np.linalg.eigh(covariance)
    order = np.argsort(values)[::-1][:m]
    return np.clip(values[order], 0.0, None), vectors[:, order]


def anisotropy_share(basis: np.ndarray, values: np.ndarray, vectors: np.ndarray) -> float:
    """sum_i lambda_i ||U^T v_i||^2 / sum_i lambda_i over the given top eigenpairs of the gradient covariance."""
    total = float(values.sum())
    captured = ((basis.T @ vectors) ** 2).sum(0)
    return float(values @ captured / total) if total > 0 else float("nan")


def null_moments(trace: float, trace_sq: float, d: int, k: int) -> tuple[float, float]:
    """Mean and sd of the share tr(P A) / tr(A) of a uniformly (Haar) random rank-k projector P of R^d, for a
    symmetric positive semi-definite A with tr A = `trace`, tr A^2 = `trace_sq`, exactly:

        mean = k / d,  var = 2 k (d - k) / (d (d - 1) (d + 2)) * (tr A^2 - (tr A)^2 / d) / (tr A)^2

    (the second moments of a Haar projector's entries). Every share here is of that form: the energy share with
    A = M, the anisotropy share with A = sum_i lambda_i v_i v_i^T over the top eigenpairs."""
    if trace <= 0 or d < 2:
        return k / d, float("nan")
    var = 2 * k * (d - k) / (d * (d - 1) * (d + 2)) * (trace_sq - trace**2 / d) / trace**2
    return k / d, float(np.sqrt(max(var, 0.0)))


def control_stats(value: float, controls: np.ndarray, null: tuple[float, float] | None = None) -> dict:
    """The sampled random controls' mean and sd (ddof=1), and z = (value - mean) / sd: against the exact null
    (`null_moments`, given as `null`: also its mean and sd) when given, else against the controls' own (whose sd
    is uncertain by about +-16% at 20 draws)."""
    mean, sd = float(controls.mean()), float(controls.std(ddof=1)) if len(controls) > 1 else float("nan")
    stats = {"control_mean": mean, "control_sd": sd}
    if null is not None:
        mean, sd = null
        stats |= {"null_mean": mean, "null_sd": sd}
    return stats | {"z": (value - mean) / sd if sd > 0 else float("nan")}


def moments(sums: SiteSums, index: int) -> tuple[np.ndarray, np.ndarray]:
    """(second moment M, centred covariance C) of stratum `index`'s gradients, over the tokens that have one: C from
    their streamed scatter about the mean (SiteSums.grad_m2), never M / n - mean mean^T."""
    n = max(int(sums.n_grad[index]), 1)
    return sums.grad_second[index], sums.grad_m2[index] / n


def share_rows(bases: dict[str, np.ndarray], controls: Sequence[np.ndarray], sums: SiteSums, rank: int) -> list[dict]:
    """energy_share and anisotropy_share of each fitted basis, per stratum, with z against the exact null of a
    random subspace of the same rank (`null_moments`) and the sampled random controls beside it (subspace
    `random`: their mean, and its z against the exact null, a check that should stay within a few units)."""
    rows = []
    for index, stratum in enumerate(STRATA):
        if sums.n_grad[index] < 2:
            continue
        second, covariance = moments(sums, index)
        values, vectors = top_eigenpairs(covariance, rank)
        d = second.shape[0]
        measures = {
            "energy_share": (
                lambda u, second=second: energy_share(u, second),
                null_moments(float(np.trace(second)), float((second**2).sum()), d, rank),
            ),
            "anisotropy_share": (
                lambda u, values=values, vectors=vectors: anisotropy_share(u, values, vectors),
                null_moments(float(values.sum()), float((values**2).sum()), d, rank),
            ),
        }
        for measure, (share, null) in measures.items():
            control_values = np.array([share(u) for u in controls])
            for subspace, basis in bases.items():
                value = share(basis)
                rows.append(
                    {
                        "stratum": stratum,
                        "subspace": subspace,
                        "rank": rank,
                        "measure": measure,
                        "value": value,
                        "n_tokens": int(sums.n_grad[index]),
                        **control_stats(value, control_values, null),
                    }
                )
            rows.append(
                {
                    "stratum": stratum,
                    "subspace": "random",
                    "rank": rank,
                    "measure": measure,
                    "value": float(control_values.mean()),
                    "n_tokens": int(sums.n_grad[index]),
                    **control_stats(float(control_values.mean()), control_values, null),
                }
            )
    return rows


def isotropy_rows(sums: SiteSums, act: np.ndarray, grad: np.ndarray, sample_strata: np.ndarray, d: int) -> list[dict]:
    """Per stratum: avg_cos of activations and gradients over every valid token that has one (exact, from the unit
    sums; a zero vector has no direction and is left out), IsoScore on the sampled tokens (the gradients' on those
    with a gradient; NaN where fewer than d), the mean gradient norm over the tokens with a gradient, and the
    counts: `n_grad` tokens with a gradient (an encoder's final sites: its masked targets), `n_zero_grad` without."""
    rows = []
    has_grad = np.linalg.norm(grad, axis=1) > 0
    for index, stratum in enumerate(STRATA):
        n, n_grad, n_act = (int(x[index]) for x in (sums.n, sums.n_grad, sums.n_act))
        keep = np.ones(len(act), bool) if index == 0 else sample_strata == index - 1
        values = {
            "act_avg_cos": (geometry.avg_cos_from_sums(sums.act_unit[index], n_act), n_act),
            "grad_avg_cos": (geometry.avg_cos_from_sums(sums.grad_unit[index], n_grad), n_grad),
            "grad_norm_mean": (sums.grad_norm[index] / n_grad if n_grad else float("nan"), n_grad),
            "act_isoscore": (geometry.isoscore(act[keep]) if keep.sum() >= d else float("nan"), n),
            "grad_isoscore": (_isoscore(grad[keep & has_grad], d), n_grad),
            "n_sampled": (int(keep.sum()), n),
            "n_grad": (n_grad, n),
            "n_zero_grad": (n - n_grad, n),
        }
        rows += [
            {"stratum": stratum, "measure": m, "value": float(v), "n_tokens": count} for m, (v, count) in values.items()
        ]
    return rows


def _isoscore(x: np.ndarray, d: int) -> float:
    return geometry.isoscore(x) if len(x) >= d else float("nan")
