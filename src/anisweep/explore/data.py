"""The explorer: one self-contained HTML page (results/explore.html) that draws any per-layer metric of a results
folder over training, model by model, or across models at their last step (Godey et al. 2024's Fig. 1-4 layout),
with Plotly's JavaScript inline, so that it opens from disk with no server and no network.

What it holds: the sweeps' per-layer rows (head null, no gradient-analysis parameters) of the steps the figures
draw (status ok), one float32 per (model, seed, step, layer, site, metric), never a token or a head. A sweep
whose rows pass `max_values` keeps, for every model alike, evenly spaced checkpoints of its own (its first and
last kept), so that the page stays under ~20 MB: the page says how many of each model's steps it shows.
"""

from __future__ import annotations

import base64
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from anisweep.measures.sweep import analysed

KEY = ("family", "model", "seed")
SERIES = (*KEY, "site", "metric", "layer")
_PARAMETERS = ("head", "subspace", "fit", "rank", "stratum")
#: What bad input raises (a missing or empty folder, a damaged sweep.parquet, sweeps without a row to draw): the
#: command prints its message alone (anisweep.cli.explore).
INPUT_ERRORS = (OSError, ValueError, pl.exceptions.PolarsError)
#: Values kept (float32, 4 bytes, base64 in the page): 2.4 million are some 13 MB beside plotly.js, 1.2 MB.
MAX_VALUES = 2_400_000


def read_sweeps(sources: Sequence[str | os.PathLike]) -> pl.DataFrame:
    """The sweep tables of `sources`: a results folder (every model's sweep.parquet under it, anisweep.results.scan)
    or sweep.parquet files."""
    from anisweep.results import scan
    from anisweep.tables import scan_parquet

    frames = []
    for source in map(Path, sources):
        if source.is_dir() and not any(source.glob("*/*/sweep.parquet")):
            raise FileNotFoundError(
                f"explore: no sweep.parquet under {str(source)!r} (each model's is "
                f"{source}/{{family}}/{{model}}/sweep.parquet): run the sweep first, or name the folder it wrote "
                "(results/)"
            )
        if source.is_dir():
            frames.append(scan(source, "sweep"))
        elif source.is_file():
            frames.append(scan_parquet(source))
        else:
            raise FileNotFoundError(
                f"explore: {str(source)!r} is neither a results folder nor a sweep.parquet file: run the sweep first,"
                " or name the folder it wrote (results/)"
            )
    return pl.concat(frames, how="diagonal_relaxed").collect()


def per_layer_rows(sweeps: pl.DataFrame) -> pl.DataFrame:
    """The rows the page draws: analysed steps, one value per (model, seed, step, layer, site, metric)."""
    kept = analysed(sweeps).filter(
        pl.col("layer").is_not_null(), *[pl.col(c).is_null() for c in _PARAMETERS if c in sweeps.columns]
    )
    return kept.select(*KEY, "step", "tokens_seen", "layer", "site", "metric", "value").unique(
        [*SERIES, "step"], keep="first", maintain_order=True
    )


def thinned(rows: pl.DataFrame, max_values: int = MAX_VALUES) -> pl.DataFrame:
    """`rows` with at most about `max_values` values: each model keeps the same share of its checkpoints, evenly
    spaced in its own list of steps, the first and the last among them."""
    if rows.height <= max_values:
        return rows
    share = max_values / rows.height
    kept = []
    for row in rows.group_by(KEY).agg(pl.col("step").unique().sort()).iter_rows(named=True):
        steps = row["step"]
        n = max(2, math.floor(share * len(steps)))
        picked = sorted({steps[int(round(i))] for i in np.linspace(0, len(steps) - 1, min(n, len(steps)))})
        kept.append(pl.DataFrame({**{k: [row[k]] * len(picked) for k in KEY}, "step": picked}))
    keep = pl.concat(kept).cast({k: rows.schema[k] for k in (*KEY, "step")})
    return rows.join(keep, on=[*KEY, "step"], how="semi", nulls_equal=True)


def page_data(rows: pl.DataFrame, all_steps: dict | None = None) -> dict:
    """The page's data: the models (family, model, seed, steps, tokens seen), the series (model, site, metric,
    layer: one value per step of its model, NaN where it has none) and their values, float32 base64."""
    keys = rows.select(KEY).unique().sort(KEY, nulls_last=True)
    keys = keys.with_row_index("k")
    steps = rows.select(*KEY, "step", "tokens_seen").unique([*KEY, "step"]).sort([*KEY, "step"], nulls_last=True)
    steps = steps.join(keys, on=list(KEY), nulls_equal=True)
    sites, metrics = sorted(rows["site"].unique()), sorted(rows["metric"].unique())
    series = (
        rows.select(SERIES)
        .unique()
        .join(keys, on=list(KEY), nulls_equal=True)
        .with_columns(
            pl.col("site").replace_strict(sites, list(range(len(sites)))).alias("s"),
            pl.col("metric").replace_strict(metrics, list(range(len(metrics)))).alias("m"),
        )
        .sort("k", "s", "m", "layer")
        .with_row_index("i")
    )
    grid = series.join(steps.select("k", "step"), on="k").join(
        rows.join(keys, on=list(KEY), nulls_equal=True).select("k", "site", "metric", "layer", "step", "value"),
        on=["k", "site", "metric", "layer", "step"],
        how="left",
    )
    values = grid.sort("i", "step")["value"].fill_null(float("nan")).to_numpy().astype("<f4")
    models = []
    for key in keys.iter_rows(named=True):
        own = steps.filter(pl.col("k") == key["k"])
        name = (key["family"], key["model"], key["seed"])
        models.append(
            {
                "family": key["family"],
                "model": key["model"],
                "seed": key["seed"],
                "steps": own["step"].to_list(),
                "tokens": own["tokens_seen"].to_list(),
                "all_steps": (all_steps or {}).get(name, own.height),
            }
        )
    return {
        "models": models,
        "sites": sites,
        "metrics": metrics,
        "series": {
            "model": series["k"].to_list(),
            "site": series["s"].to_list(),
            "metric": series["m"].to_list(),
            "layer": series["layer"].to_list(),
        },
        "values": base64.b64encode(values.tobytes()).decode("ascii"),
    }


def explore_data(sweeps: pl.DataFrame, max_values: int = MAX_VALUES) -> dict:
    rows = per_layer_rows(sweeps)
    if rows.is_empty():
        raise ValueError(
            "explore: the sweeps hold no analysed per-layer row (status ok): run the sweep to its end, or check "
            "that its steps are not all duplicate or nonfinite (sweep.parquet's status)"
        )
    counts = {tuple(r[:3]): r[3] for r in rows.group_by(KEY).agg(pl.col("step").n_unique()).iter_rows()}
    return page_data(thinned(rows, max_values), counts)


def write_explore(sweeps: pl.DataFrame, out: str | os.PathLike, max_values: int = MAX_VALUES) -> Path:
    """Write the explorer page of `sweeps` to `out` (atomically)."""
    from anisweep.atomic import write_text
    from anisweep.explore.page import page

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(page(json.dumps(explore_data(sweeps, max_values), separators=(",", ":"))), out)
    return out
