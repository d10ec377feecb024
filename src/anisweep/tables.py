"""Parquet files of the output contract: which tables there are, the identity columns every row carries, and
writing them atomically (see `atomic`)."""

from __future__ import annotations

import os

import polars as pl

from anisweep import atomic

IDENTITY = ("family", "model", "seed", "step", "tokens_seen")

#: The tables extract writes per checkpoint, `{name}.parquet` (the extract rule's outputs and
#: `extract.tables()`'s keys, in this order).
EXTRACT_TABLES = ("qk", "attention", "hidden", "hidden_stats", "layernorm", "embeddings", "qk_sample", "score_hist")

#: The tables of the untrained-block experiment (anisweep.mechanism.untrained), `results/untrained/{name}.parquet`.
UNTRAINED_TABLES = ("untrained", "histogram", "summary")

#: attention.parquet's statistics, one value per (layer, head): what extract writes and metrics reads.
ATTENTION_STATISTICS = (
    "entropy_mean",
    "entropy_norm_mean",
    "p_max_mean",
    "p_median_mean",
    "p_min_mean",
    "score_mean",
    "score_std",
)

METRIC_SCHEMA = {
    "family": pl.String,
    "model": pl.String,
    "seed": pl.Int64,
    "step": pl.Int64,
    "tokens_seen": pl.Int64,
    "layer": pl.Int64,
    "head": pl.Int64,
    "site": pl.String,
    "metric": pl.String,
    "value": pl.Float64,
}


def with_identity(df: pl.DataFrame, ident: dict) -> pl.DataFrame:
    """Prepend family, model, seed, step, tokens_seen to every row."""
    columns = [
        pl.lit(ident["family"], pl.String).alias("family"),
        pl.lit(ident["model"], pl.String).alias("model"),
        pl.lit(ident.get("seed"), pl.Int64).alias("seed"),
        pl.lit(ident["step"], pl.Int64).alias("step"),
        pl.lit(ident.get("tokens_seen"), pl.Int64).alias("tokens_seen"),
    ]
    return df.select([*columns, *[c for c in df.columns if c not in IDENTITY]])


def write_atomic(df: pl.DataFrame, path: str | os.PathLike) -> None:
    """Write a parquet file under a temporary name, then rename it: a reader never sees half a file."""
    atomic.write_with(df.write_parquet, path)


def empty_metrics() -> pl.DataFrame:
    return pl.DataFrame(schema=METRIC_SCHEMA)


def metric_rows(ident: dict, rows: list[dict]) -> pl.DataFrame:
    """Tidy metric rows (layer, head, site, metric, value) with the identity columns, in METRIC_SCHEMA."""
    if not rows:
        return empty_metrics()
    df = pl.DataFrame(
        [
            {
                "layer": r.get("layer"),
                "head": r.get("head"),
                "site": r.get("site"),
                "metric": r["metric"],
                "value": None if r["value"] is None else float(r["value"]),
            }
            for r in rows
        ],
        schema={k: METRIC_SCHEMA[k] for k in ("layer", "head", "site", "metric", "value")},
    )
    return with_identity(df, ident).cast(METRIC_SCHEMA)
