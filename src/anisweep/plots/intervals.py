"""The Multi-Bootstrap's intervals (bootstrap.parquet, anisweep.measures.sample_bootstrap) as bands around the curves
a figure draws: a band from `low` to `high` wherever the tables hold an interval for the drawn (metric, layer, site,
step) of the drawn model (or group of seeds), nothing anywhere else, so that a figure without intervals is drawn as
before. Any metric the tables hold is drawn where a figure plots it; the tables' other metrics are left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import polars as pl

#: what identifies an interval beside its (metric, layer, site, step); `head` where the tables have one
WHERE = ("metric", "layer", "site", "step")
#: the bands' collections carry this gid: legend_beside names them once, with their level and design
BAND_GID = "bootstrap-interval"
BAND_ALPHA = 0.2
DESIGN_WORDS = {"units": "over sequences", "seeds and units": "over seeds and sequences"}


def read_intervals(paths: Iterable[str | Path]) -> pl.DataFrame | None:
    """The intervals of bootstrap tables (their rows with `against` null and a finite low and high): family, model
    (null for a group), group, n_seeds, design, level, metric, layer, site, step, tokens_seen, estimate, low, high,
    and head where a table has it. None where no path is given."""
    from anisweep.tables import read_parquet

    frames = [read_parquet(path) for path in paths]
    if not frames:
        return None
    table = pl.concat(frames, how="diagonal_relaxed")
    keep = ["family", "model", "group", "n_seeds", "design", "level", *WHERE, "tokens_seen", "estimate", "low", "high"]
    keep += ["head"] if "head" in table.columns else []
    return table.filter(pl.col("against").is_null(), pl.col("low").is_finite(), pl.col("high").is_finite()).select(keep)


def read_pair_intervals(paths: Iterable[str | Path]) -> pl.DataFrame | None:
    """The intervals of the comparisons of two steps in bootstrap tables (rows with `against` and `ref_step` and no
    p: anisweep.measures.pair_bootstrap), as `role` (compare.parquet's: final, previous) and `ref_step` beside
    read_intervals' columns. None where no path is given."""
    from anisweep.tables import read_parquet

    frames = [read_parquet(path) for path in paths]
    if not frames:
        return None
    table = pl.concat(frames, how="diagonal_relaxed")
    pairs = table.filter(
        pl.col("against").is_not_null(), pl.col("p").is_null(), pl.col("low").is_finite(), pl.col("high").is_finite()
    )
    keep = ["family", "model", "n_seeds", "design", "level", *WHERE, "ref_step", "estimate", "low", "high"]
    return pairs.select(*keep, role=pl.col("against"))


def attach_pairs(rows: pl.DataFrame, intervals: pl.DataFrame | None) -> pl.DataFrame:
    """compare.parquet's `rows` with `low`, `high` and `band` where `intervals` (read_pair_intervals) has one for the
    row's model, role, reference step, metric, layer, site and step; null elsewhere."""
    if intervals is None:
        return rows
    keys = ["family", "model", "role", "ref_step", *WHERE]
    bands = with_band_label(intervals).select(*keys, "low", "high", "band").unique(keys, keep="first")
    bands = bands.with_columns(pl.col(k).cast(rows.schema[k]) for k in keys)
    return rows.join(bands, on=keys, how="left", nulls_equal=True)


def band_label(level: float, design: str) -> str:
    """The legend's words for a band: its level and what was resampled."""
    return f"{level:.0%} interval, Multi-Bootstrap {DESIGN_WORDS.get(design, 'over ' + design)}"


def with_band_label(intervals: pl.DataFrame) -> pl.DataFrame:
    """`intervals` with `band`: each row's band_label."""
    kinds = intervals.select("level", "design").unique()
    words = [band_label(level, design) for level, design in kinds.iter_rows()]
    return intervals.join(kinds.with_columns(band=pl.Series(words, dtype=pl.String)), on=["level", "design"])


def attach(rows: pl.DataFrame, intervals: pl.DataFrame | None) -> pl.DataFrame:
    """`rows` (a sweep's) with `low`, `high` and `band` (band_label) where `intervals` has one for the row's model,
    metric, layer, site and step (and head: per-head rows get none from per-layer intervals); null elsewhere. Rows
    as they are where there are no intervals."""
    if intervals is None or not {"family", "model", *WHERE} <= set(rows.columns):
        return rows
    models = intervals.filter(pl.col("model").is_not_null())
    if "head" not in models.columns:
        models = models.with_columns(head=pl.lit(None, pl.Int64))
    if "head" not in rows.columns:  # rows of layers alone: per-layer intervals alone
        models = models.filter(pl.col("head").is_null())
    keys = ["family", "model", *WHERE] + (["head"] if "head" in rows.columns else [])
    if "seed" in rows.columns and "seed" in models.columns:
        keys.append("seed")
    bands = with_band_label(models).select(*keys, "low", "high", "band").unique(keys, keep="first")
    bands = bands.with_columns(pl.col(k).cast(rows.schema[k]) for k in keys)
    return rows.drop("low", "high", "band", strict=False).join(bands, on=keys, how="left", nulls_equal=True)


def group_curves(intervals: pl.DataFrame | None, family: str, metric: str, site: str) -> list[pl.DataFrame]:
    """The intervals of each group of seeds of `family` at (metric, site), one frame per (group, layer), by step:
    the group's estimate (the mean of its seeds' values) and its interval over seeds and sequences."""
    if intervals is None:
        return []
    rows = intervals.filter(
        pl.col("group").is_not_null(), pl.col("family") == family, pl.col("metric") == metric, pl.col("site") == site
    )
    if "head" in rows.columns:
        rows = rows.filter(pl.col("head").is_null())
    rows = with_band_label(rows)
    by_group = rows.sort("group", "layer").group_by("group", "layer", maintain_order=True)
    return [part.sort("step") for _, part in by_group]


def band(ax, x, rows: pl.DataFrame, colour) -> bool:
    """A translucent band from `low` to `high` of `rows` (drawn at `x`, one per row) in `colour`, where rows have
    intervals; whether one was drawn."""
    if "low" not in rows.columns or rows["low"].null_count() == rows.height:
        return False
    low = rows["low"].cast(pl.Float64).fill_null(np.nan).to_numpy()
    high = rows["high"].cast(pl.Float64).fill_null(np.nan).to_numpy()
    x = np.asarray(x, dtype=float)
    shown = np.isfinite(low) & np.isfinite(high) & np.isfinite(x)
    label = rows.filter(pl.col("band").is_not_null())["band"][0]
    ax.fill_between(x, low, high, where=shown, color=colour, alpha=BAND_ALPHA, lw=0, gid=BAND_GID, label=f"_{label}")
    if shown.sum() == 1:  # fill_between draws no area over one point: a bar there instead
        (j,) = np.flatnonzero(shown)
        ax.vlines(x[j], low[j], high[j], color=colour, alpha=0.6, lw=3, gid=BAND_GID, label=f"_{label}")
    return True


def band_handles(fig, labels: list[str]) -> list[tuple[object, str]]:
    """A grey patch per kind of band that `fig` draws (band_label), for the legend: those not in `labels` yet."""
    from matplotlib.patches import Patch

    found = []
    for ax in fig.axes:
        for artist in (*ax.collections, *ax.patches):
            if artist.get_gid() == BAND_GID:
                text = artist.get_label().removeprefix("_")
                if text not in labels and text not in found:
                    found.append(text)
    return [(Patch(color="grey", alpha=0.35, lw=0, label=text), text) for text in found]
