"""RankMe and alpha-ReQ per layer over training, with the phases their model's summary curve traces shaded
(anisweep.measures.phases; Li et al. 2025, Fig. 1's reading): from sweep.parquet and phases.parquet only."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from anisweep.measures.sweep import analysed
from anisweep.plots.intervals import attach, band
from anisweep.plots.kit import (
    legend_beside,
    lines_by,
    not_measured,
    panel_grid,
    save_figure,
    select_rows,
    step_axis,
    sweep_title,
)

PHASES_FIGURES = ("spectral_phases.png",)
#: the panels, top to bottom: metric -> y label
PANELS = {
    "rankme_cov": "RankMe of the covariance\n(Li et al.)",
    "alpha_req": "alpha-ReQ (eigenvalue decay)",
    "rankme": "RankMe of the singular values\n(Garrido et al.)",
}
SITE = "resid"  # a line per layer of the residual stream
PHASE_COLOURS = {"warmup": "0.6", "entropy_seeking": "tab:blue", "compression_seeking": "tab:orange"}
#: what the shading claims: the phases are the rule's reading of a curve's shape, not a finding tested against noise
DESCRIPTIVE = "the phases are descriptive: a curve's shape read by a stated rule, no turn tested against noise"
PHASE_WORDS = {
    "warmup": "warm-up collapse",
    "entropy_seeking": "entropy-seeking",
    "compression_seeking": "compression-seeking",
}


def shade_phases(ax, phases: pl.DataFrame) -> None:
    """The model's phases of one metric as bands over their steps."""
    for row in phases.filter(pl.col("phase").is_not_null()).iter_rows(named=True):
        ax.axvspan(
            row["start_step"],
            row["end_step"],
            color=PHASE_COLOURS[row["phase"]],
            alpha=0.18,
            lw=0,
            label=PHASE_WORDS[row["phase"]],
        )


def mark_turns(ax, rows: pl.DataFrame, layer_phases: pl.DataFrame) -> None:
    """Each layer's own turns (the steps its phases end at a turn) as open circles on its line."""
    turns = layer_phases.filter(pl.col("ends_at_turn").fill_null(False)).select("layer", step="end_step")
    points = rows.join(turns, on=["layer", "step"])
    if points.height:
        ax.scatter(
            points["step"],
            points["value"],
            s=40,
            facecolors="none",
            edgecolors="black",
            lw=0.9,
            zorder=3,
            label="a layer's turn",
        )


def summary_line(ax, sweep: pl.DataFrame, metric: str, phases: pl.DataFrame) -> None:
    """The curve the model's phases are read from (its last hidden state), dashed black, where it is not one of the
    per-layer lines already."""
    model = phases.filter((pl.col("scope") == "model") & pl.col("site").is_not_null())
    if not model.height or model["site"][0] == SITE:
        return
    layer, site = model["layer"][0], model["site"][0]
    rows = select_rows(sweep, metric, site).filter(pl.col("layer") == layer)
    ax.plot(rows["step"], rows["value"], color="black", ls="--", lw=1.4, label=f"{site}, layer {layer} (the model)")
    band(ax, rows["step"], rows, "black")


def phases_note(phases: pl.DataFrame) -> str:
    """Why the model's curve has no phases, where its row says so."""
    said = phases.filter((pl.col("scope") == "model") & pl.col("reason").is_not_null())
    return said["reason"][0] if said.height else ""


def spectral_phases(
    sweep: pl.DataFrame, phases: pl.DataFrame, path: Path, intervals: pl.DataFrame | None = None
) -> None:
    """The figure; with `intervals` (anisweep.plots.intervals.read_intervals of the model's bootstrap.parquet) a band
    around each curve they hold an interval for (RankMe)."""
    sweep = attach(analysed(sweep), intervals)
    panels = {metric: label for metric, label in PANELS.items() if select_rows(sweep, metric, SITE).height}
    if not panels:
        not_measured(sweep, path, "RankMe and alpha-ReQ")
        return
    fig, axes = panel_grid(len(panels), 1, size=(9.0, 2.9))
    for ax, (metric, label) in zip(axes, panels.items()):
        of_metric = phases.filter(pl.col("metric") == metric)
        shade_phases(ax, of_metric.filter(pl.col("scope") == "model"))
        rows = select_rows(sweep, metric, SITE)
        lines_by(ax, rows, "layer", "layer {}")
        summary_line(ax, sweep, metric, of_metric)
        mark_turns(ax, rows, of_metric.filter((pl.col("scope") == "layer") & (pl.col("site") == SITE)))
        note = phases_note(of_metric)
        if note:
            ax.set_title(f"no phases for the model: {note}", fontsize=8, loc="left")
        ax.set_ylabel(label)
        step_axis(ax, sweep, label=ax is axes[len(panels) - 1])
    handles = {}
    for ax in axes[: len(panels)]:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(text, handle)
    legend_beside(fig, axes, handles=list(handles.values()), labels=list(handles), fontsize=8)
    fig.suptitle(
        f"{sweep_title(sweep)}: RankMe and alpha-ReQ per layer of the residual stream, phases shaded\n({DESCRIPTIVE})"
    )
    save_figure(fig, path)
