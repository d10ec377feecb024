"""The measures built of sums, recomputed from a checkpoint's `units.parquet` (each resampling unit's sums, kept by
extract: anisweep.extract.streaming.Units) for any weighting of its units: the Multi-Bootstrap's `SumBuilt` measures
(anisweep.measures.bootstrap). At unit weights (every unit once) each equals the value metrics.parquet holds, up to
float64 rounding (tests/measures/test_sum_bootstrap.py), since the streamed statistics are the units' sums.

A measure here is its statistics per unit (units x k) and a function of their weighted sums, shape (..., k) to (...),
which is how the resampling reads it; a function is the same for every seed of a group (its statistics carry what
differs). The norms' spread is taken about a fixed centre c (the seed's full-sample mean norm): each unit's sum of
(||x|| - c)^2 is its M2 plus n (mean - c)^2, so a weighted sum of them gives the weighted M2 as
sum (||x|| - c)^2 - N (mean - c)^2, which cancels only as much as the weighted mean moves from c.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from anisweep.measures.sinks import EPSILON
from anisweep.tables import read_parquet

#: the measures recomputed here (metrics.parquet's names), by the table whose units' sums they read
HIDDEN_MEASURES = ("avg_cos", "drift_norm", "drift_ratio", "norm_mean", "norm_std", "norm_cv")
ATTENTION_MEASURES = ("entropy_mean", "entropy_norm_mean", "p_max_mean", "p_median_mean", "p_min_mean")
SINK_MEASURES = ("sink_first_mass", "sink1_eps")
QK_MEASURES = ("qk_cos", "qk_mean_score", "q_norm_mean", "k_norm_mean", "qk_cos_abs_mean")
#: at the sites with the outlier statistics (rogue.ROGUE_SITES), whose units keep sum u_j^2 per dimension
ROGUE_MEASURES = ("rogue_top1_share", "rogue_top3_share", "rogue_top10_share", "rogue_dims_90")
MEASURES = HIDDEN_MEASURES + ROGUE_MEASURES + ATTENTION_MEASURES + SINK_MEASURES + QK_MEASURES


class UnitsError(ValueError):
    """A checkpoint's units.parquet cannot give the measures asked for."""


@dataclass(frozen=True)
class SumMeasure:
    """One measure at one (layer, site, head) of one checkpoint: `per_unit` (units x k) and `of_sums`, a function of
    weighted sums (..., k) to values (...)."""

    metric: str
    layer: int
    site: str
    head: int | None
    per_unit: np.ndarray
    of_sums: Callable[[np.ndarray], np.ndarray]

    @property
    def key(self) -> tuple[str, int, str, int | None]:
        return (self.metric, self.layer, self.site, self.head)

    @property
    def value(self) -> float:
        """The full sample's value: every unit once."""
        return float(self.of_sums(self.per_unit.sum(axis=0)))


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _avg_cos(s: np.ndarray) -> np.ndarray:
    """[n, n_zero, sum_unit...]: (||sum u||^2 - m) / (m (m - 1)), m the nonzero vectors (geometry.avg_cos_from_sums)."""
    m = s[..., 0] - s[..., 1]
    unit = s[..., 2:]
    return _ratio(np.einsum("...i,...i->...", unit, unit) - m, np.where(m >= 2, m * (m - 1.0), 0.0))


def _sum_norm_over(s: np.ndarray) -> np.ndarray:
    """[c, sum_x...]: ||sum x|| / c; c = n gives drift_norm, ||mean x||, and c = sum ||x|| drift_ratio, ||mean x|| /
    mean ||x|| (geometry.drift_from_sums)."""
    return _ratio(np.linalg.norm(s[..., 1:], axis=-1), s[..., 0])


def _norm_std(s: np.ndarray) -> np.ndarray:
    """[n, sum_norm, sum (||x|| - c)^2, n c]: the population std of the norms (c, the centre, is the last column's
    weighted sum over n's: each seed's own, carried in its statistics)."""
    n, total, about_centre = s[..., 0], s[..., 1], s[..., 2]
    centre = _ratio(s[..., 3], n)
    mean = _ratio(total, n)
    m2 = np.maximum(about_centre - n * (mean - centre) ** 2, 0.0)
    return np.sqrt(_ratio(m2, n))


def _rogue(metric: str) -> Callable[[np.ndarray], np.ndarray]:
    """[n, n_zero, sum u (d), sum u^2 (d)] to rogue.summary's `metric`: each dimension's term of avg_cos, c_j =
    ((sum u_j)^2 - sum u_j^2) / (m (m - 1)) over the m nonzero vectors (rogue.contributions, whose M2 is
    sum u_j^2 - (sum u_j)^2 / m), largest first; NaN where avg_cos = sum c_j is not positive or m < 2."""

    from anisweep.measures.rogue import SHARE_TARGET  # not at import: the workflow's planning reads MEASURES here

    def of_sums(s: np.ndarray) -> np.ndarray:
        m = s[..., 0] - s[..., 1]
        d = (s.shape[-1] - 2) // 2
        total_u, squares = s[..., 2 : 2 + d], s[..., 2 + d :]
        pairs = np.where(m >= 2, m * (m - 1.0), np.nan)[..., None]
        c = (total_u * total_u - squares) / pairs
        total = c.sum(axis=-1)
        positive = np.where(total > 0, total, np.nan)
        if metric == "rogue_dims_90":
            with np.errstate(invalid="ignore", divide="ignore"):
                cumulative = np.cumsum(-np.sort(-c, axis=-1), axis=-1) / positive[..., None]
            reached = cumulative >= SHARE_TARGET - 1e-12
            first = np.where(reached.any(axis=-1), reached.argmax(axis=-1) + 1.0, float(d))
            return np.where(np.isfinite(cumulative[..., 0]), first, np.nan)
        k = min(int(metric.removeprefix("rogue_top").removesuffix("_share")), d)
        largest = -np.partition(-c, k - 1, axis=-1)[..., :k]  # the k largest c_j, in any order
        with np.errstate(invalid="ignore", divide="ignore"):
            return largest.sum(axis=-1) / positive

    return of_sums


def _hidden(layer: int, site: str, stats: dict[str, np.ndarray], metric: str) -> SumMeasure:
    n, n_zero, sum_norm = stats["n"], stats["n_zero"], stats["sum_norm"]
    column = lambda *parts: np.concatenate(parts, axis=1)  # noqa: E731
    if metric == "avg_cos":
        return SumMeasure(metric, layer, site, None, column(n, n_zero, stats["sum_unit"]), _avg_cos)
    if metric == "drift_norm":
        return SumMeasure(metric, layer, site, None, column(n, stats["sum_x"]), _sum_norm_over)
    if metric == "drift_ratio":
        return SumMeasure(metric, layer, site, None, column(sum_norm, stats["sum_x"]), _sum_norm_over)
    if metric in ROGUE_MEASURES:
        per_unit = column(n, n_zero, stats["sum_unit"], stats["sum_unit_sq"])
        return SumMeasure(metric, layer, site, None, per_unit, _rogue(metric))
    if metric == "norm_mean":
        return SumMeasure(metric, layer, site, None, column(n, sum_norm), lambda s: _ratio(s[..., 1], s[..., 0]))
    centre = float(sum_norm.sum() / max(n.sum(), 1.0))
    unit_mean = _ratio(sum_norm, n)
    about_centre = stats["m2_norm"] + n * np.nan_to_num(unit_mean - centre) ** 2
    per_unit = column(n, sum_norm, about_centre, n * centre)
    if metric == "norm_std":
        return SumMeasure(metric, layer, site, None, per_unit, _norm_std)
    return SumMeasure(metric, layer, site, None, per_unit, lambda s: _ratio(_norm_std(s), _ratio(s[..., 1], s[..., 0])))


def _attention(layer: int, stats: dict, heads: list[int], metric: str) -> list[SumMeasure]:
    """Per head its mean over its rows, and per layer the mean over heads of the heads' means (metrics.attention_rows,
    sinks.sink_rows); entropy_norm over the rows with more than one visible key; sink_first_mass the mean over rows
    of p on their sequence's first valid key; sink1_eps the share of sequences whose first key's importance exceeds
    sinks.EPSILON (`above` and `finite`, each unit's count of those and of sequences with an importance)."""
    if metric == "sink1_eps":
        field, rows = "above", {head: stats[(head, "finite")] for head in heads}
    else:
        field = {"sink_first_mass": "first_received"}.get(metric, metric.removesuffix("_mean"))
        counts = stats[(None, "n_rows_norm" if field == "entropy_norm" else "n_rows")]
        rows = {head: counts for head in heads}
    per_head = [np.concatenate([rows[head], stats[(head, field)]], axis=1) for head in heads]
    out = [
        SumMeasure(metric, layer, "attention", head, per_unit, lambda s: _ratio(s[..., 1], s[..., 0]))
        for head, per_unit in zip(heads, per_head)
    ]
    whole = np.concatenate(per_head, axis=1)

    def mean_over_heads(s: np.ndarray) -> np.ndarray:
        pairs = s.reshape(*s.shape[:-1], len(heads), 2)
        return _ratio(pairs[..., 1], pairs[..., 0]).mean(-1)

    out.append(SumMeasure(metric, layer, "attention", None, whole, mean_over_heads))
    return out


def _with_sink_shares(grouped: dict, sinks: pl.DataFrame, epsilon: float) -> None:
    """Add to each layer's attention statistics, per head and unit, the sequences whose first valid key's importance
    (sinks.parquet's `first_importance`, one per sequence) is finite (`finite`) and above `epsilon` (`above`)."""
    for row in sinks.iter_rows(named=True):
        stats = grouped.get(("attention", row["layer"], "attention"))
        if stats is None or (None, "n_seqs") not in stats:
            continue
        unit = np.repeat(np.arange(len(stats[(None, "n_seqs")])), stats[(None, "n_seqs")][:, 0].astype(int))
        importance = np.asarray(row["first_importance"], dtype=np.float64)
        if len(importance) != len(unit):
            raise UnitsError(
                f"sinks.parquet holds {len(importance)} sequences' importances where units.parquet's units hold "
                f"{len(unit)} sequences: the two files are of different runs; rerun this checkpoint's extract"
            )
        finite = np.isfinite(importance)
        n_units = len(stats[(None, "n_seqs")])
        stats[(row["head"], "finite")] = np.bincount(unit, weights=finite, minlength=n_units)[:, None]
        above = finite & (np.nan_to_num(importance, nan=-np.inf) > epsilon)
        stats[(row["head"], "above")] = np.bincount(unit, weights=above, minlength=n_units)[:, None]


def _cosine(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    return _ratio(np.einsum("...i,...i->...", q, k), np.linalg.norm(q, axis=-1) * np.linalg.norm(k, axis=-1))


def _qk(layer: int, site: str, stats: dict, heads: list[int], metric: str) -> list[SumMeasure]:
    n, k_n = stats[(None, "n")], stats[(None, "k_n")]
    if metric == "qk_cos_abs_mean":
        width, n_heads = stats[(heads[0], "q_sum")].shape[1], len(heads)
        whole = np.concatenate([np.concatenate([stats[(h, "q_sum")], stats[(h, "k_sum")]], axis=1) for h in heads], 1)

        def abs_mean(s: np.ndarray) -> np.ndarray:
            pairs = s.reshape(*s.shape[:-1], n_heads, 2, width)
            return np.abs(_cosine(pairs[..., 0, :], pairs[..., 1, :])).mean(-1)

        return [SumMeasure(metric, layer, site, None, whole, abs_mean)]
    out = []
    for head in heads:
        q, k = stats[(head, "q_sum")], stats[(head, "k_sum")]
        d = q.shape[1]
        if metric == "qk_cos":  # the means' cosine is the sums'
            per_unit, fn = np.concatenate([q, k], 1), lambda s, d=d: _cosine(s[..., :d], s[..., d:])
        elif metric == "qk_mean_score":
            per_unit = np.concatenate([n, k_n, q, k], 1)

            def fn(s: np.ndarray, d=d) -> np.ndarray:
                q_mean = s[..., 2 : 2 + d] / s[..., :1]
                k_mean = s[..., 2 + d :] / s[..., 1:2]
                return np.einsum("...i,...i->...", q_mean, k_mean) / np.sqrt(d)

        elif metric == "q_norm_mean":
            per_unit, fn = np.concatenate([n, stats[(head, "q_norm_sum")]], 1), lambda s: _ratio(s[..., 1], s[..., 0])
        else:  # k_norm_mean
            per_unit, fn = np.concatenate([k_n, stats[(head, "k_norm_sum")]], 1), lambda s: _ratio(s[..., 1], s[..., 0])
        out.append(SumMeasure(metric, layer, site, head, per_unit, fn))
    return out


def _grouped(units: pl.DataFrame) -> dict[tuple[str, int, str], dict[tuple[int | None, str], np.ndarray]]:
    """{(table, layer, site): {(head, stat): (units x width) array}}."""
    out: dict = {}
    flat = units["values"].explode().to_numpy().astype(np.float64, copy=False)  # every row's values, end to end
    ends = np.cumsum(units["values"].list.len().to_numpy())
    keys = units.select("table", "layer", "site", "head", "stat", "width").rows()
    for (table, layer, site, head, stat, width), start, end in zip(keys, [0, *ends[:-1].tolist()], ends.tolist()):
        out.setdefault((table, layer, site), {})[(head, stat)] = flat[start:end].reshape(-1, width)
    return out


def measures_of(
    units: pl.DataFrame,
    metrics: tuple[str, ...] | list[str],
    sinks: pl.DataFrame | None = None,
    epsilon: float = EPSILON,
) -> list[SumMeasure]:
    """Every one of `metrics` (of MEASURES) at every layer, site and head the units' table has sums for; sink1_eps
    reads `sinks` (the checkpoint's sinks.parquet) too, with metrics' `epsilon` (config sinks.epsilon)."""
    unknown = sorted(set(metrics) - set(MEASURES))
    if unknown:
        raise UnitsError(f"measures {unknown}: not built of sums here; choose among {list(MEASURES)}")
    grouped = _grouped(units)
    if "sink1_eps" in metrics:
        if sinks is None:
            raise UnitsError("sink1_eps reads each sequence's first-key importance: give the checkpoint's sinks table")
        _with_sink_shares(grouped, sinks, epsilon)
    rogue_sites = [key for key, stats in grouped.items() if (None, "sum_unit_sq") in stats]
    if set(metrics) & set(ROGUE_MEASURES) and not rogue_sites:
        raise UnitsError(
            "the rogue dimensions' shares need each unit's sum of squared unit vectors, which units.parquet keeps at "
            "the sampled sites; this one was written by older extract code: rerun this checkpoint's extract"
        )
    out: list[SumMeasure] = []
    for (table, layer, site), stats in sorted(grouped.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        heads = sorted({head for head, _ in stats if head is not None})
        for metric in metrics:
            if table == "hidden_stats" and metric in HIDDEN_MEASURES + ROGUE_MEASURES:
                flat = {stat: values for (_, stat), values in stats.items()}
                if metric in HIDDEN_MEASURES or "sum_unit_sq" in flat:
                    out.append(_hidden(layer, site, flat, metric))
            elif table == "attention" and metric in ATTENTION_MEASURES + SINK_MEASURES and heads:
                out += _attention(layer, stats, heads, metric)
            elif table == "qk" and metric in QK_MEASURES and heads:
                out += _qk(layer, site, stats, heads, metric)
    return out


def read_units(
    folder: str | Path, metrics: tuple[str, ...] | list[str], epsilon: float = EPSILON
) -> tuple[int, list[SumMeasure]]:
    """(the number of units, the measures) of a checkpoint folder's units.parquet (and sinks.parquet for
    sink1_eps, with `epsilon`)."""
    path = Path(folder) / "units.parquet"
    if not path.exists():
        raise UnitsError(
            f"{path}: missing; the measures built of sums are resampled from each unit's sums, which extract writes "
            "since extract tables format 4: rerun this checkpoint's extract"
        )
    units = read_parquet(path)
    if units.is_empty():
        raise UnitsError(
            f"{path}: no units (extract.units was 0); set extract.units above 1 and rerun extract, or resample only "
            "the sampled vectors' measures (bootstrap.measures)"
        )
    first = units.row(0, named=True)
    n_units = len(first["values"]) // first["width"]
    if n_units < 2:
        raise UnitsError(f"{path}: {n_units} unit; resampling needs at least 2 (extract.units and n_sequences >= 2)")
    sinks = read_parquet(Path(folder) / "sinks.parquet") if "sink1_eps" in metrics else None
    return n_units, measures_of(units, metrics, sinks, epsilon)
