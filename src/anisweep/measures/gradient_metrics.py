"""The gradient analysis's key numbers as tidy rows of metrics.parquet, so that sweep.parquet carries them next to
every other metric.

One row per (layer, site, subspace, fit, rank, stratum) of gradients.parquet's fitted subspaces and per
statistic, with the parameters in metrics.parquet's own columns (`anisweep.tables.METRIC_PARAMETERS`), never in
the metric's name:

    metric = grad_{measure}[_control_mean | _z]

measure: energy_share | anisotropy_share. Without a suffix the value is the share itself; `_control_mean` is the
matched-rank random controls' mean and `_z` the z against them. subspace: seminmf | pca; fit: checkpoint (fitted
on the checkpoint's own activations) | fixed (held fixed from an early window); rank: k; stratum: all | frequent
| middle | rare.
"""

from __future__ import annotations

import polars as pl

MEASURES = ("energy_share", "anisotropy_share")

#: gradients.parquet's column -> the suffix of the metric that carries it.
STATISTICS = {"value": "", "control_mean": "_control_mean", "z": "_z"}

#: Every metric name gradient_metric_rows writes.
GRADIENT_METRICS = tuple(f"grad_{measure}{suffix}" for measure in MEASURES for suffix in STATISTICS.values())


def gradient_metric_rows(table: pl.DataFrame) -> list[dict]:
    """Rows (layer, site, metric, subspace, fit, rank, stratum, value) of gradients.parquet's fitted subspaces'
    shares: the share, the controls' mean and z. Tables written before the `fit` column count as per-checkpoint
    fits."""
    if "fit" not in table.columns:
        table = table.with_columns(pl.lit("checkpoint").alias("fit"))
    shares = table.filter(pl.col("measure").is_in(MEASURES) & (pl.col("subspace") != "random"))
    rows = []
    for r in shares.sort("layer", "site", "fit", "subspace", "rank", "stratum", "measure").iter_rows(named=True):
        for column, suffix in STATISTICS.items():
            rows.append(
                {
                    "layer": r["layer"],
                    "site": r["site"],
                    "metric": f"grad_{r['measure']}{suffix}",
                    "subspace": r["subspace"],
                    "fit": r["fit"],
                    "rank": r["rank"],
                    "stratum": r["stratum"],
                    "value": r[column],
                }
            )
    return rows


def gradient_metric_frame(table: pl.DataFrame) -> pl.DataFrame:
    """`gradient_metric_rows` of a table spanning checkpoints (with identity columns), in METRIC_SCHEMA."""
    from anisweep.tables import IDENTITY, METRIC_SCHEMA

    frames = [
        pl.DataFrame([{**dict(zip(IDENTITY, key, strict=True)), **r} for r in gradient_metric_rows(rows)])
        for key, rows in table.group_by(list(IDENTITY), maintain_order=True)
    ]
    frames = [f for f in frames if f.height]
    if not frames:
        return pl.DataFrame(schema=METRIC_SCHEMA)
    frame = pl.concat(frames, how="diagonal_relaxed")
    frame = frame.with_columns(pl.lit("gradients", pl.String).alias("measure"))  # metrics.GRADIENT_MEASURE
    absent = [pl.lit(None, dtype).alias(name) for name, dtype in METRIC_SCHEMA.items() if name not in frame.columns]
    return frame.with_columns(absent).select(list(METRIC_SCHEMA)).cast(METRIC_SCHEMA)
