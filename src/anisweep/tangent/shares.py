"""Pure numpy: PCA and random bases, the energy and anisotropy shares of a subspace, the random controls and
the rows of gradients.parquet from one site's sums.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from anisweep.measures import geometry

if TYPE_CHECKING:
    from anisweep.tangent.sums import SiteSums

STRATA = ("all", "frequent", "middle", "rare")  # `all` is the strata's sum


# --------------------------------------------------------------------------- subspaces and shares
def pca_basis(x: np.ndarray, rank: int) -> np.ndarray:
    """The top-`rank` principal axes (d, rank) of the centred rows of x."""
    x = np.asarray(x, np.float64)
    _, _, vt = np.linalg.svd(x - x.mean(0), full_matrices=False)
    return vt[:rank].T


def random_bases(d: int, rank: int, n: int, seed: int) -> list[np.ndarray]:
    """`n` orthonormal bases of seeded Gaussian rank-`rank` subspaces of R^d (uniform on the Grassmannian)."""
    rng = np.random.default_rng(seed)
    return [np.linalg.qr(rng.standard_normal((d, rank)))[0] for _ in range(n)]


def energy_share(basis: np.ndarray, second_moment: np.ndarray) -> float:
    """tr(U^T M U) / tr(M) = sum_t ||P g_t||^2 / sum_t ||g_t||^2 for M = sum_t g_t g_t^T."""
    total = float(np.trace(second_moment))
    return float(np.einsum("ij,ik,kj->", basis, second_moment, basis) / total) if total > 0 else float("nan")


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


def control_stats(value: float, controls: np.ndarray) -> dict:
    mean, sd = float(controls.mean()), float(controls.std(ddof=1)) if len(controls) > 1 else float("nan")
    z = (value - mean) / sd if sd > 0 else float("nan")
    return {"control_mean": mean, "control_sd": sd, "z": z}


def moments(sums: SiteSums, index: int) -> tuple[np.ndarray, np.ndarray]:
    """(second moment M, centred covariance C) of stratum `index`'s gradients."""
    n = max(int(sums.n[index]), 1)
    mean = sums.grad_sum[index] / n
    return sums.grad_second[index], sums.grad_second[index] / n - np.outer(mean, mean)


def share_rows(bases: dict[str, np.ndarray], controls: list[np.ndarray], sums: SiteSums, rank: int) -> list[dict]:
    """energy_share and anisotropy_share of each fitted basis, per stratum, against the random controls."""
    rows = []
    for index, stratum in enumerate(STRATA):
        if sums.n[index] < 2:
            continue
        second, covariance = moments(sums, index)
        values, vectors = top_eigenpairs(covariance, rank)
        measures = {
            "energy_share": lambda u, second=second: energy_share(u, second),
            "anisotropy_share": lambda u, values=values, vectors=vectors: anisotropy_share(u, values, vectors),
        }
        for measure, share in measures.items():
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
                        "n_tokens": int(sums.n[index]),
                        **control_stats(value, control_values),
                    }
                )
            rows.append(
                {
                    "stratum": stratum,
                    "subspace": "random",
                    "rank": rank,
                    "measure": measure,
                    "value": float(control_values.mean()),
                    "n_tokens": int(sums.n[index]),
                    "control_mean": float(control_values.mean()),
                    "control_sd": float(control_values.std(ddof=1)) if len(control_values) > 1 else float("nan"),
                    "z": 0.0,
                }
            )
    return rows


def isotropy_rows(sums: SiteSums, act: np.ndarray, grad: np.ndarray, sample_strata: np.ndarray, d: int) -> list[dict]:
    """Per stratum: avg_cos of activations and gradients over every valid token (exact, from the unit sums),
    IsoScore on the sampled tokens (NaN where the stratum has fewer sampled tokens than d), mean gradient norm."""
    rows = []
    for index, stratum in enumerate(STRATA):
        n = int(sums.n[index])
        keep = np.ones(len(act), bool) if index == 0 else sample_strata == index - 1
        values = {
            "act_avg_cos": geometry.avg_cos_from_sums(sums.act_unit[index], n),
            "grad_avg_cos": geometry.avg_cos_from_sums(sums.grad_unit[index], n),
            "grad_norm_mean": sums.grad_norm[index] / n if n else float("nan"),
            "act_isoscore": geometry.isoscore(act[keep]) if keep.sum() >= d else float("nan"),
            "grad_isoscore": geometry.isoscore(grad[keep]) if keep.sum() >= d else float("nan"),
            "n_sampled": int(keep.sum()),
        }
        rows += [{"stratum": stratum, "measure": m, "value": float(v), "n_tokens": n} for m, v in values.items()]
    return rows
