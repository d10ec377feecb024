"""The explorer: one self-contained HTML page (results/explore.html) that draws any per-layer metric of a results
folder over training, model by model, or across models at their last step (Godey et al. 2024's Fig. 1-4 layout),
with Plotly's JavaScript inline, so that it opens from disk with no server and no network.

What it holds: the sweeps' per-layer rows (head null, no gradient-analysis parameters) of the steps the figures
draw (status ok), one float32 per (model, seed, step, layer, site, metric), never a token or a head. A sweep
whose rows pass `max_values` keeps, for every model alike, evenly spaced checkpoints of its own (its first and
last kept), so that the page stays under ~20 MB: the page says how many of each model's steps it shows.

How it reads: lazily, one model at a time. The sweeps are Parquet scans; the filter of the rows drawn and the
columns the page needs go down into the scan, so a head's row, a rank's, a step not analysed is never decoded
into memory, and each model's drawn rows become its float32 block before the next model is read: the peak
memory is one model's drawn rows and the page's values, whatever the number of models (docs/performance.md).
Past `max_values` a first pass counts each model's drawn rows and steps, a second reads the kept steps alone.
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


def scan_sweeps(sources: Sequence[str | os.PathLike]) -> pl.LazyFrame:
    """The sweep tables of `sources`, as one lazy frame (nothing read yet): a results folder (every model's
    sweep.parquet under it, anisweep.results.scan) or sweep.parquet files."""
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
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")


def drawn_rows(sweeps: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """The rows the page draws, lazily: analysed steps (status ok), a layer, no head and no gradient-analysis
    parameter; the columns it reads."""
    sweeps = sweeps.lazy()
    names = sweeps.collect_schema().names()
    kept = analysed(sweeps).filter(
        pl.col("layer").is_not_null(), *[pl.col(c).is_null() for c in _PARAMETERS if c in names]
    )
    return kept.select(*KEY, "step", "tokens_seen", "layer", "site", "metric", "value")


def _equal(column: str, value: object) -> pl.Expr:
    return pl.col(column).is_null() if value is None else pl.col(column) == value


def _models(drawn: pl.LazyFrame) -> list[tuple[str, str]]:
    """(family, model) of every model with a drawn row, in the page's order; a streaming pass over the filter's
    columns alone."""
    found = drawn.select("family", "model").unique().collect(engine="streaming")
    return list(found.sort("family", "model", nulls_last=True).iter_rows())


def _model_rows(drawn: pl.LazyFrame, family: str, model: str, keep: pl.DataFrame | None = None) -> pl.DataFrame:
    """One model's drawn rows (all its seeds), one per (seed, site, metric, layer, step): the first where sources
    repeat one; with `keep` (seed, step), those steps alone."""
    rows = drawn.filter(_equal("family", family), _equal("model", model))
    if keep is not None:
        rows = rows.filter(pl.col("step").is_in(keep["step"].unique().implode())).join(
            keep.lazy(), on=["seed", "step"], how="semi", nulls_equal=True
        )
    return rows.collect().unique([*SERIES, "step"], keep="first", maintain_order=True)


def kept_steps(steps: list[int], share: float) -> list[int]:
    """The `share` of `steps` (sorted) a thinned page keeps: evenly spaced, the first and the last among them."""
    n = max(2, math.floor(share * len(steps)))
    return sorted({steps[int(round(i))] for i in np.linspace(0, len(steps) - 1, min(n, len(steps)))})


def _blocks(rows: pl.DataFrame) -> list[dict]:
    """Each seed of one model's rows as the page holds it: its steps and tokens seen, its series (site, metric,
    layer, sorted) and their values, float32, one row of the matrix per series, a column per step, NaN where a
    series has no value at a step."""
    blocks = []
    for (seed,), own in rows.sort("seed", nulls_last=True).group_by("seed", maintain_order=True):
        steps = own.select("step", "tokens_seen").unique("step", keep="first", maintain_order=True)
        steps = steps.sort("step", nulls_last=True).with_row_index("j")
        series = own.select("site", "metric", "layer").unique().sort("site", "metric", "layer").with_row_index("i")
        at = own.join(series, on=["site", "metric", "layer"])
        at = at.join(steps.select("step", "j"), on="step", nulls_equal=True)
        values = np.full((series.height, steps.height), np.nan, dtype="<f4")
        values[at["i"].to_numpy(), at["j"].to_numpy()] = at["value"].fill_null(float("nan")).to_numpy()
        blocks.append(
            {
                "key": (own["family"][0], own["model"][0], seed),
                "steps": steps["step"].to_list(),
                "tokens": steps["tokens_seen"].to_list(),
                "series": series.drop("i"),
                "values": values,
            }
        )
    return blocks


def page_data(blocks: list[dict], all_steps: dict | None = None) -> dict:
    """The page's data from each model's and seed's block (in the page's order): the models (family, model, seed,
    steps, tokens seen), the series (model, site, metric, layer: one value per step of its model, NaN where it has
    none) and their values, float32 base64."""
    sites = sorted({s for block in blocks for s in block["series"]["site"].unique()})
    metrics = sorted({m for block in blocks for m in block["series"]["metric"].unique()})
    site_at, metric_at = {s: i for i, s in enumerate(sites)}, {m: i for i, m in enumerate(metrics)}
    models, series = [], {"model": [], "site": [], "metric": [], "layer": []}
    for k, block in enumerate(blocks):
        family, model, seed = block["key"]
        models.append(
            {
                "family": family,
                "model": model,
                "seed": seed,
                "steps": block["steps"],
                "tokens": block["tokens"],
                "all_steps": (all_steps or {}).get(block["key"], len(block["steps"])),
            }
        )
        own = block["series"]
        series["model"] += [k] * own.height
        series["site"] += [site_at[s] for s in own["site"]]
        series["metric"] += [metric_at[m] for m in own["metric"]]
        series["layer"] += own["layer"].to_list()
    values = np.concatenate([block["values"].ravel() for block in blocks]) if blocks else np.empty(0, "<f4")
    return {
        "models": models,
        "sites": sites,
        "metrics": metrics,
        "series": series,
        "values": base64.b64encode(values.astype("<f4").tobytes()).decode("ascii"),
    }


def explore_data(sweeps: pl.LazyFrame | pl.DataFrame, max_values: int = MAX_VALUES) -> dict:
    """The page's data (page_data) of `sweeps`, read one model at a time (the module's docstring)."""
    drawn = drawn_rows(sweeps)
    schema = drawn.collect_schema()
    models = _models(drawn)
    counted, blocks, total = [], [], 0
    for family, model in models:
        rows = _model_rows(drawn, family, model)
        total += rows.height
        steps = rows.group_by("seed").agg(pl.col("step").unique().sort())
        counted.append((family, model, {seed: own for seed, own in steps.iter_rows()}))
        if total <= max_values:
            blocks += _blocks(rows)
    if not total:
        raise ValueError(
            "explore: the sweeps hold no analysed per-layer row (status ok): run the sweep to its end, or check "
            "that its steps are not all duplicate or nonfinite (sweep.parquet's status)"
        )
    all_steps = {(f, m, seed): len(own) for f, m, seeds in counted for seed, own in seeds.items()}
    if total > max_values:
        share, blocks = max_values / total, []
        for family, model, seeds in counted:
            keep = pl.DataFrame(
                [(seed, step) for seed, own in seeds.items() for step in kept_steps(own, share)],
                schema={"seed": schema["seed"], "step": schema["step"]},
                orient="row",
            )
            blocks += _blocks(_model_rows(drawn, family, model, keep))
    return page_data(blocks, all_steps)


def write_explore(sweeps: pl.DataFrame, out: str | os.PathLike, max_values: int = MAX_VALUES) -> Path:
    """Write the explorer page of `sweeps` to `out` (atomically)."""
    from anisweep.atomic import write_text
    from anisweep.explore.page import page

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(page(json.dumps(explore_data(sweeps, max_values), separators=(",", ":"))), out)
    return out
