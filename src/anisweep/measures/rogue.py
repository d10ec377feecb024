"""Rogue dimensions (Timkey & van Schijndel 2021): how much of avg_cos a few coordinates make, from the streamed
unit-vector sums of hidden_stats.parquet, exactly; and avg_cos after standardising each dimension.

For n unit vectors u_i, avg_cos = (||sum_i u_i||^2 - n) / (n (n - 1)) = sum_j c_j, with the coordinate j's term

    c_j = ((sum_i u_ij)^2 - sum_i u_ij^2) / (n (n - 1)) = mean_j^2 - M2_j / (n (n - 1))

(sum_j sum_i u_ij^2 = n; mean_j and M2_j, the sum of squared deviations from it, of u_j over the n unit vectors):
each dimension's contribution to the mean pairwise cosine, which Timkey & van Schijndel average over pairs as
u_ij u_kj. A rogue dimension is one whose c_j is a large share of avg_cos.

Standardising (their post-processing: z_ij = (x_ij - mean_j) / std_j) needs each token's norm after the shift and
scaling, which the one streamed pass cannot know in advance: the mean and std of each dimension are exact, over
every valid token (from sum x_j and M2 of x_j, each mini-batch's about its own mean, merged without cancellation:
anisweep.moments), and the cosines are averaged exactly over all pairs of the seeded token sample (hidden.parquet)
standardised with them. `avg_cos_sample` is the raw avg_cos of the same sample, the
like-for-like comparison; `avg_cos` (stream_geometry) is the raw value over every token.
"""

from __future__ import annotations

import numpy as np

from anisweep.measures import geometry
from anisweep.measures.sites import SAMPLED_SITES

#: The sites the rogue-dimension rows are written for: the residual stream and the final norm's input and output.
ROGUE_SITES = SAMPLED_SITES
TOP = (1, 3, 10)
SHARE_TARGET = 0.9
N_DIMS_NAMED = 3
_SHARES = (*(f"rogue_top{k}_share" for k in TOP), "rogue_dims_90")


def contributions(sum_unit, m2_unit, n: int) -> np.ndarray:
    """c_j for n unit vectors (zero vectors left out of n) from their sums sum_i u_ij and the M2s sum_i (u_ij -
    mean_j)^2; sums to avg_cos. NaN with fewer than two vectors."""
    s, m2 = np.asarray(sum_unit, np.float64), np.asarray(m2_unit, np.float64)
    if n < 2:
        return np.full(s.shape, np.nan)
    mean = s / n
    return mean * mean - m2 / (n * (n - 1.0))


def summary(c: np.ndarray) -> dict[str, float]:
    """The top-1/3/10 dimensions' share of avg_cos = sum c, the number of dimensions (largest c first) that make
    SHARE_TARGET of it, and the N_DIMS_NAMED dimensions with the largest c. Shares are NaN where avg_cos <= 0 (no
    anisotropy to share out)."""
    total = float(np.sum(c))
    nan = float("nan")
    if not np.isfinite(total):  # fewer than two tokens, or a non-finite sum: nothing to rank
        return {**{f"rogue_dim_{i + 1}": nan for i in range(N_DIMS_NAMED)}, **dict.fromkeys(_SHARES, nan)}
    order = np.argsort(-c, kind="stable")
    values = {f"rogue_dim_{i + 1}": float(order[i]) for i in range(min(N_DIMS_NAMED, len(order)))}
    if total <= 0:
        return {**values, **dict.fromkeys(_SHARES, nan)}
    cumulative = np.cumsum(c[order]) / total
    values |= {f"rogue_top{k}_share": float(cumulative[min(k, len(c)) - 1]) for k in TOP}
    reached = np.nonzero(cumulative >= SHARE_TARGET - 1e-12)[0]
    values["rogue_dims_90"] = float(reached[0] + 1) if len(reached) else float(len(c))
    return values


def standardise(x: np.ndarray, sum_x, m2_x, n: int) -> np.ndarray:
    """x (tokens, d) shifted by each dimension's mean and divided by its std (population), both over the n tokens
    whose sums sum_i x_ij and M2s sum_i (x_ij - mean_j)^2 are given; a dimension with std 0 becomes 0."""
    mean = np.asarray(sum_x, np.float64) / n
    std = np.sqrt(np.asarray(m2_x, np.float64) / n)
    scale = np.divide(1.0, std, out=np.zeros_like(std), where=std > 0)
    return (x - mean) * scale


def rogue_rows(stats, samples: dict) -> list[dict]:
    """Rows of the rogue_dimensions measure: per (layer, site) of ROGUE_SITES, from hidden_stats' rows (`stats`, a
    polars DataFrame) and the sampled vectors `samples` {(layer, site): (tokens, d) float64}."""
    rows = []
    for r in stats.iter_rows(named=True):
        if r["site"] not in ROGUE_SITES or r.get("m2_unit") is None:
            continue
        n_unit = r["n"] - (r.get("n_zero") or 0)
        values = summary(contributions(r["sum_unit"], r["m2_unit"], n_unit))
        x = samples.get((r["layer"], r["site"]))
        nan = float("nan")
        values |= {"avg_cos_standardised": nan, "avg_cos_sample": nan}
        if x is not None and r["n"] > 0:
            x = x[np.isfinite(x).all(axis=1)]
            if len(x) >= 2:
                values["avg_cos_sample"] = geometry.avg_cos(x)
                values["avg_cos_standardised"] = geometry.avg_cos(standardise(x, r["sum_x"], r["m2_x"], r["n"]))
        rows += [{"layer": r["layer"], "site": r["site"], "metric": m, "value": v} for m, v in values.items()]
    return rows


def top_dims(stats_row: dict, k: int = 10) -> list[int]:
    """The k dimensions with the largest contribution c_j at one hidden_stats row (largest first)."""
    n_unit = stats_row["n"] - (stats_row.get("n_zero") or 0)
    c = contributions(stats_row["sum_unit"], stats_row["m2_unit"], n_unit)
    return [int(j) for j in np.argsort(-c, kind="stable")[:k]]
