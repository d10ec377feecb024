"""A measure's figure from one model's sweep: its own (`figure=` in its decorator) or the default, a panel per
metric and site, its value over training with a line per layer (per-head rows averaged over heads)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import polars as pl

from anisweep.measures.registry import Measure, MeasureError
from anisweep.measures.sweep import analysed
from anisweep.plots.kit import (
    legend_beside,
    lines_by,
    not_measured,
    panel_grid,
    reasons_not_measured,
    save_figure,
    step_axis,
    sweep_title,
)
from anisweep.tables import METRIC_PARAMETERS

PANEL = ("metric", "site", *METRIC_PARAMETERS)


def plot_measure(measure: Measure, sweep: pl.DataFrame, path: Path) -> None:
    """Draw `measure`'s figure of `sweep` (a model's sweep.parquet) to `path`."""
    rows = analysed(sweep).filter(pl.col("measure") == measure.name)
    if measure.figure is not None:
        try:
            measure.figure(rows, path)
        except Exception as error:
            raise MeasureError(
                f"measure {measure.name!r} ({measure.entry}): its figure failed: {type(error).__name__}: {error}"
            ) from error
        if not Path(path).is_file():
            raise MeasureError(f"measure {measure.name!r} ({measure.entry}): its figure function wrote no {path}")
        return
    if rows.is_empty():
        not_measured(sweep, path, f"measure {measure.name}", why_not_drawn(sweep, measure.name))
        return
    default_figure(measure, sweep, rows, path)


def why_not_drawn(sweep: pl.DataFrame, name: str) -> str:
    """Why a measure's figure has nothing to draw: its rows are all NaN or inf, or it has none in this sweep."""
    rows = sweep.filter(pl.col("measure") == name)
    if rows.is_empty():
        return "not in this sweep's metrics"
    said = reasons_not_measured(rows, name)
    if said is not None and rows.filter(pl.col("metric") != name).is_empty():
        return said
    statuses = ", ".join(f"{n} {status}" for status, n in sorted(rows["status"].value_counts().iter_rows()))
    if set(rows["status"]) == {"nan"}:
        return f"every one of its {rows.height} rows is NaN or inf\n(status nan in sweep.parquet)"
    return f"none of its {rows.height} rows is ok\n(status: {statuses})"


def default_figure(measure: Measure, sweep: pl.DataFrame, rows: pl.DataFrame, path: Path) -> None:
    panels = rows.select(PANEL).unique().sort(PANEL, nulls_last=True).rows(named=True)
    fig, axes = panel_grid(len(panels), min(3, len(panels)), size=(4.0, 3.0))
    for ax, panel in zip(axes, panels):
        part = rows.filter(pl.all_horizontal(_same(column, value) for column, value in panel.items()))
        per_head = part["head"].is_not_null().any()
        part = part.group_by("step", "layer").agg(pl.col("value").mean())
        if part["layer"].is_null().all():
            ax.plot(*part.sort("step").select("step", "value"), marker=".", color="tab:blue", label="whole model")
        else:
            lines_by(ax, part, "layer", "layer {}")
        ax.set_ylabel(panel["metric"] + ("\n(mean over heads)" if per_head else ""), fontsize=9)
        where = ", ".join(f"{v}" for k, v in panel.items() if k != "metric" and v is not None)
        ax.set_title(where, fontsize=9)
        step_axis(ax, sweep)
    legend_beside(fig, list(axes), fontsize=8)
    definition = textwrap.fill(textwrap.shorten(measure.definition, 240), 60 * min(3, len(panels)))
    fig.suptitle(f"{sweep_title(sweep)}: measure {measure.name}\n{definition}", fontsize=9)
    save_figure(fig, path)


def _same(column: str, value) -> pl.Expr:
    return pl.col(column).is_null() if value is None else pl.col(column) == value
