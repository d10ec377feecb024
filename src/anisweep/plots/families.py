"""One figure across checkpoint families (results/figures/compare_families.png): like with like.

Every panel reads ONE site that all architectures have, named on the panel: the residual stream just before the
final norm (`final_ln_in`), just after it (`final_ln_out`), and q/k at rope `pre` (the projections before any
rotation; what attention sees where there is no rotary; OLMo 2: after its own q/k norm). Attention entropy is
the normalised one, comparable between causal and bidirectional rows. The x axis is tokens seen (steps where
a model has no token count: kit.progress_axis).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from anisweep.measures.sweep import analysed
from anisweep.plots.kit import legend_beside, metric_words, panel_grid, progress_axis, save_figure, set_progress_scale

#: (panel title, site, metric)
PANELS = (
    ("avg cos before the final norm", "final_ln_in", "avg_cos"),
    ("avg cos after the final norm", "final_ln_out", "avg_cos"),
    ("IsoScore after the final norm", "final_ln_out", "isoscore"),
    ("drift ratio before the final norm", "final_ln_in", "drift_ratio"),
    ("|qk cos| at rope pre, mean over heads and layers", "qk_pre", "qk_cos_abs_mean"),
    ("normalised attention entropy, mean over layers", "attention", "entropy_norm_mean"),
)


#: y labels in words (the metric names are in the caption)
Y_LABELS = {
    "qk_cos_abs_mean": "|cos(mean q, mean k)|",
    "entropy_norm_mean": "entropy / log(visible keys)",
}


def panel_rows(sweeps: pl.DataFrame, site: str, metric: str) -> pl.DataFrame:
    """One value per (family, model, step): the metric at `site`, averaged over layers where it is per layer
    (per-head rows are left out: the per-layer summaries already average them)."""
    rows = sweeps.filter((pl.col("site") == site) & (pl.col("metric") == metric) & pl.col("head").is_null())
    return (
        rows.group_by("family", "model", "step", "tokens_seen")
        .agg(pl.col("value").mean())
        .sort("family", "model", "step")
    )


def plot_families(sweeps: pl.DataFrame, path: Path) -> None:
    """Every model of every family, a line each, on the PANELS; families told apart by colour."""
    sweeps = analysed(sweeps)
    families = sorted(sweeps["family"].unique().to_list())
    colours = {family: f"C{i % 10}" for i, family in enumerate(families)}
    x_column, x_label = progress_axis(sweeps)
    fig, axes = panel_grid(len(PANELS), 3, size=(4.2, 3.2))
    for ax, (title, site, metric) in zip(axes, PANELS, strict=False):
        rows = panel_rows(sweeps, site, metric)
        for (family, model), group in rows.group_by("family", "model", maintain_order=True):
            label = f"{family}/{model}"
            ax.plot(group[x_column], group["value"], marker=".", color=colours[family], label=label, alpha=0.85)
        set_progress_scale(ax, rows, x_column, x_label)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel(Y_LABELS.get(metric, metric_words(metric)), fontsize=9)
    legend_beside(fig, axes, fontsize=8)
    fig.suptitle(f"families compared over training: {', '.join(families)}")
    save_figure(fig, path)
