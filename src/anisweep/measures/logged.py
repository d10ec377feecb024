"""The per-layer metrics a training's own loggers receive (anisweep.live.AnisweepCallback sends them through the
Trainer's logging, so every `report_to` integration gets them), and the names they have there:
`geometry/<metric>/<site>/layer_<n>`, the value of metrics.parquet's per-layer row (head null) of that metric,
site and layer, on the Trainer's step axis. The glossary (docs/metrics.md, Trainer loggers) lists them.
"""

from __future__ import annotations

import math

import polars as pl

PREFIX = "geometry"

#: (metric, the sites it is logged at): one scalar per layer of each.
LOGGED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("avg_cos", ("resid", "final_ln_out")),
    ("entropy_mean", ("attention",)),
    ("sink_first_mass", ("attention",)),
    ("rogue_top1_share", ("resid",)),
    ("massive_ratio", ("resid",)),
    ("massive_top_first_share", ("resid",)),
    ("isoscore", ("final_ln_out",)),
)

#: The built-in table measures (anisweep.measures.metrics) whose rows hold the logged metrics.
LOGGED_MEASURES = (
    "attention",
    "stream_geometry",
    "sample_geometry",
    "rogue_dimensions",
    "massive_activations",
    "attention_sinks",
)

_PER_LAYER_NULLS = ("head", "subspace", "fit", "rank", "stratum")


def scalar_name(metric: str, site: str, layer: int | str) -> str:
    return f"{PREFIX}/{metric}/{site}/layer_{layer}"


def logged_scalars(metrics: pl.DataFrame) -> dict[str, float]:
    """The logged metrics' per-layer rows of `metrics` (metrics.parquet's layout) as {name: value}, in layer
    order; a NaN value stays NaN (the loggers draw a gap)."""
    wanted = pl.concat(
        [pl.DataFrame({"metric": [metric] * len(sites), "site": list(sites)}) for metric, sites in LOGGED]
    )
    rows = metrics.filter(
        pl.col("layer").is_not_null(), *[pl.col(c).is_null() for c in _PER_LAYER_NULLS if c in metrics.columns]
    ).join(wanted, on=["metric", "site"], how="semi")
    rows = rows.sort("metric", "site", "layer")
    return {
        scalar_name(r["metric"], r["site"], r["layer"]): math.nan if r["value"] is None else float(r["value"])
        for r in rows.select("metric", "site", "layer", "value").iter_rows(named=True)
    }
