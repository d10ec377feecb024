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

Intervals: where the models' bootstrap.parquet tables (anisweep.plots.intervals) hold an interval for a drawn
(model, seed, site, metric, layer, step), the page holds its low and high (float32) beside the value, and draws them
as a band its checkbox shows or hides.
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


def _blocks(rows: pl.DataFrame, intervals: pl.DataFrame | None = None) -> list[dict]:
    """Each seed of one model's rows as the page holds it: its steps and tokens seen, its series (site, metric,
    layer, sorted) and their values, float32, one row of the matrix per series, a column per step, NaN where a
    series has no value at a step; with `intervals` (anisweep.plots.intervals.read_intervals), `low` and `high`
    matrices of the same shape (NaN where there is no interval) and each series' band words (null: none)."""
    from anisweep.plots.intervals import attach

    if intervals is not None:
        rows = attach(rows, intervals)
    blocks = []
    for (seed,), own in rows.sort("seed", nulls_last=True).group_by("seed", maintain_order=True):
        steps = own.select("step", "tokens_seen").unique("step", keep="first", maintain_order=True)
        steps = steps.sort("step", nulls_last=True).with_row_index("j")
        series = own.select("site", "metric", "layer").unique().sort("site", "metric", "layer").with_row_index("i")
        at = own.join(series, on=["site", "metric", "layer"])
        at = at.join(steps.select("step", "j"), on="step", nulls_equal=True)
        values = np.full((series.height, steps.height), np.nan, dtype="<f4")
        values[at["i"].to_numpy(), at["j"].to_numpy()] = at["value"].fill_null(float("nan")).to_numpy()
        block = {
            "key": (own["family"][0], own["model"][0], seed),
            "steps": steps["step"].to_list(),
            "tokens": steps["tokens_seen"].to_list(),
            "series": series.drop("i"),
            "values": values,
        }
        if "band" in at.columns and at["band"].null_count() < at.height:
            banded = at.filter(pl.col("band").is_not_null())
            for end in ("low", "high"):
                block[end] = np.full_like(values, np.nan)
                block[end][banded["i"].to_numpy(), banded["j"].to_numpy()] = banded[end].to_numpy()
            words = banded.group_by("i").agg(pl.col("band").first())
            block["bands"] = dict(words.iter_rows())
        blocks.append(block)
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
    data = {"models": models, "sites": sites, "metrics": metrics, "series": series, "values": _base64(values)}
    intervals = _intervals(blocks)
    return data | ({"intervals": intervals} if intervals["series"] else {})


def _base64(values: np.ndarray) -> str:
    return base64.b64encode(values.astype("<f4").tobytes()).decode("ascii")


def _intervals(blocks: list[dict]) -> dict:
    """The series that have intervals (their index in page_data's series), each one's band words (an index into
    `labels`), and their low and high, float32 base64, laid out as the values: one per step of the series' model.
    page_data leaves the key out where no series has one: the page of sweeps alone is as it was."""
    found = {"series": [], "label": [], "labels": [], "low": [], "high": []}
    first = 0
    for block in blocks:
        for i, words in sorted(block.get("bands", {}).items()):
            if words not in found["labels"]:
                found["labels"].append(words)
            found["series"].append(first + i)
            found["label"].append(found["labels"].index(words))
            found["low"].append(block["low"][i])
            found["high"].append(block["high"][i])
        first += block["series"].height
    for end in ("low", "high"):
        found[end] = _base64(np.concatenate(found[end]) if found[end] else np.empty(0, "<f4"))
    return found


def explore_data(
    sweeps: pl.LazyFrame | pl.DataFrame, max_values: int = MAX_VALUES, intervals: pl.DataFrame | None = None
) -> dict:
    """The page's data (page_data) of `sweeps`, read one model at a time (the module's docstring), with the
    `intervals` (anisweep.plots.intervals.read_intervals) of its drawn series."""
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
            blocks += _blocks(rows, intervals)
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
            blocks += _blocks(_model_rows(drawn, family, model, keep), intervals)
    return page_data(blocks, all_steps)


def bootstrap_tables(sources: Sequence[str | os.PathLike]) -> list[Path]:
    """The models' bootstrap.parquet beside the sweeps of `sources` (a results folder, or sweep.parquet files)."""
    found = []
    for source in map(Path, sources):
        found += sorted(source.glob("*/*/bootstrap.parquet")) if source.is_dir() else []
        found += [source.parent / "bootstrap.parquet"] if source.is_file() else []
    return [path for path in found if path.is_file()]


def write_explore(
    sweeps: pl.DataFrame,
    out: str | os.PathLike,
    max_values: int = MAX_VALUES,
    bootstrap: Sequence[str | os.PathLike] = (),
) -> Path:
    """Write the explorer page of `sweeps` to `out` (atomically), with the intervals of the `bootstrap` tables."""
    from anisweep.atomic import write_text
    from anisweep.explore.page import page
    from anisweep.plots.intervals import read_intervals

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = explore_data(sweeps, max_values, read_intervals(bootstrap))
    write_text(page(json.dumps(data, separators=(",", ":"))), out)
    return out
