"""Figures of what carries the anisotropy, from one model's sweep.parquet: rogue dimensions, avg_cos before and
after standardising each dimension, massive activations and their dimensions over training, attention sinks per
layer and head, LayerNorm outlier dimensions (anisweep.measures.rogue, massive, sinks, ln_outliers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from anisweep.measures.massive import dimension_identity
from anisweep.plots.kit import (
    lines_by,
    not_measured,
    panel_grid,
    pyplot,
    save_figure,
    select_rows,
    step_axis,
    sweep_title,
)

SHARES = {"rogue_top1_share": "top 1", "rogue_top3_share": "top 3", "rogue_top10_share": "top 10"}
STYLES = ("-", "--", ":")
FINAL_SITES = {"final_ln_in": "before final norm", "final_ln_out": "after final norm"}


def _has(sweep: pl.DataFrame, metric: str) -> bool:
    return sweep.filter(pl.col("metric") == metric).height > 0


def rogue_dim_at_last_step(sweep: pl.DataFrame, site: str) -> dict[int, int]:
    """layer -> the dimension with the largest share of avg_cos (`rogue_dim_1`) at `site`, at the last step that
    names one."""
    rows = select_rows(sweep, "rogue_dim_1", site).filter(pl.col("value").is_finite())
    last = rows.filter(pl.col("step") == rows["step"].max())
    return {int(layer): int(dim) for layer, dim in last.select("layer", "value").iter_rows()}


def rogue_dimensions(sweep: pl.DataFrame, path: Path) -> None:
    """Per residual layer, the share of avg_cos the top 1 / 3 / 10 dimensions make, and how many make 90%, over
    training; the same shares before and after the final norm. The legend and the final-norm panels' titles name
    each layer's top dimension at the last step."""
    if not _has(sweep, "rogue_top1_share"):
        not_measured(sweep, path, "rogue dimensions")
        return
    panels = [*SHARES.items(), ("rogue_dims_90", "dimensions that make 90%")]
    named = {layer: f"layer {layer}: dim {dim}" for layer, dim in rogue_dim_at_last_step(sweep, "resid").items()}
    fig, axes = panel_grid(len(panels) + 2, 3)
    for ax, (metric, label) in zip(axes, panels):
        lines_by(ax, select_rows(sweep, metric, "resid"), "layer", "layer {}", labels=named)
        if metric != "rogue_dims_90":
            ax.set_ylim(-0.05, 1.05)
            ax.set_ylabel(f"share of avg_cos, {label} dims")
        else:
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0)
        ax.set_title(f"residual stream: {label}", fontsize=9)
        step_axis(ax, sweep)
    for ax, (site, where) in zip(axes[len(panels) :], FINAL_SITES.items()):
        for metric, style in zip(SHARES, STYLES):
            rows = select_rows(sweep, metric, site)
            ax.plot(rows["step"], rows["value"], style, marker=".", color="black")
        ax.set_ylim(-0.05, 1.05)
        ax.set_ylabel("share of avg_cos")
        top = rogue_dim_at_last_step(sweep, site)
        ax.set_title(f"{where}, top 1 / 3 / 10" + (f"\ntop: dim {max(top.items())[1]}" if top else ""), fontsize=9)
        step_axis(ax, sweep)
    from matplotlib.lines import Line2D

    handles, _ = axes[0].get_legend_handles_labels()
    handles += [
        Line2D([], [], color="black", ls=style, label=f"final norm: top {label.split()[-1]} dims")
        for (_, label), style in zip(SHARES.items(), STYLES)
    ]
    fig.legend(handles=handles, loc="outside right center", fontsize=8)
    fig.suptitle(
        f"{sweep_title(sweep)}: how much of avg_cos the few largest dimensions make (rogue dimensions; dim: the top"
        " one at the last step)"
    )
    save_figure(fig, path)


def avg_cos_standardised(sweep: pl.DataFrame, path: Path) -> None:
    """Per layer: avg_cos over every token (raw), over the token sample (raw), and over the sample after
    standardising each dimension; then the same before and after the final norm."""
    if not _has(sweep, "avg_cos_standardised"):
        not_measured(sweep, path, "avg_cos after standardising each dimension")
        return
    plt = pyplot()
    layers = sorted(select_rows(sweep, "avg_cos_standardised", "resid")["layer"].unique().to_list())
    colours = dict(zip(layers, plt.get_cmap("viridis")(np.linspace(0, 0.9, max(len(layers), 1)))))
    fig, axes = panel_grid(3, 3, size=(4.2, 3.2))
    lines = (("avg_cos", "-", "raw, every token"), ("avg_cos_standardised", "--", "standardised, sample"))
    for metric, style, _ in lines:
        for layer in layers:
            rows = select_rows(sweep, metric, "resid").filter(pl.col("layer") == layer)
            axes[0].plot(rows["step"], rows["value"], style, marker=".", color=colours[layer])
    axes[0].set_title("residual stream, a colour per layer", fontsize=9)
    for ax, (site, where) in zip(axes[1:], FINAL_SITES.items()):
        for metric, style, label in (*lines, ("avg_cos_sample", ":", "raw, sample")):
            rows = select_rows(sweep, metric, site)
            ax.plot(rows["step"], rows["value"], style, marker=".", color="black", label=label)
        ax.set_title(where, fontsize=9)
    for ax in axes:
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_ylabel("mean pairwise cosine")
        step_axis(ax, sweep)
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color="black", ls=style, label=label)
        for _, style, label in (*lines, ("avg_cos_sample", ":", "raw, sample (final norm panels)"))
    ]
    handles += [Line2D([], [], color=colours[layer], label=f"layer {layer}") for layer in layers]
    fig.legend(handles=handles, loc="outside right center", fontsize=8)
    fig.suptitle(f"{sweep_title(sweep)}: avg_cos raw and after standardising each dimension")
    save_figure(fig, path)


def _identity_panel(ax, fig, identity: pl.DataFrame, steps: list[int]) -> None:
    """Layer x checkpoint cells: the dimension of the largest activation written in each, green where it is the
    last checkpoint's dimension, grey where not."""
    from matplotlib.colors import ListedColormap

    layers = sorted(identity["layer"].unique().to_list())
    grid = np.full((len(layers), len(steps)), np.nan)
    for r in identity.iter_rows(named=True):
        i, j = layers.index(r["layer"]), steps.index(r["step"])
        grid[i, j] = float(r["same_as_last"])
        ax.text(j, i, str(r["dim"]), ha="center", va="center", fontsize=8)
    ax.imshow(grid, aspect="auto", origin="lower", cmap=ListedColormap(["#dddddd", "#8fd18f"]), vmin=0, vmax=1)
    ax.set_xticks(range(len(steps)), steps, rotation=90, fontsize=8)
    ax.set_yticks(range(len(layers)), layers)
    ax.set_xlabel("optimizer step (checkpoints, evenly spaced)")
    ax.set_ylabel("layer")
    ax.set_title("dimension of the largest |activation| (green: the last checkpoint's)", fontsize=9)


def massive_activations(sweep: pl.DataFrame, path: Path) -> None:
    """Per residual layer over training: the largest |activation| over the median, the largest itself, the share of
    the top tokens that are first tokens or delimiters, and the dimension that holds the largest."""
    if not _has(sweep, "massive_ratio"):
        not_measured(sweep, path, "massive activations")
        return
    panels = (
        ("massive_ratio", "largest |x| / median |x|", True),
        ("massive_max", "largest |x|", True),
        ("massive_top_first_share", "share of top tokens: first token", False),
        ("massive_top_delimiter_share", "share of top tokens: delimiters", False),
    )
    fig, axes = panel_grid(len(panels) + 2, 3, size=(4.0, 3.0))
    for ax, (metric, label, log) in zip(axes, panels):
        lines_by(ax, select_rows(sweep, metric, "resid"), "layer", "layer {}")
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
        else:
            ax.set_ylim(-0.05, 1.05)
        step_axis(ax, sweep)
    identity = dimension_identity(sweep, "resid")
    steps = sorted(identity["step"].unique().to_list())
    wide = fig.add_subplot(axes[len(panels)].get_subplotspec().get_gridspec()[-1, 1:])
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    _identity_panel(wide, fig, identity, steps)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=8)
    fig.suptitle(f"{sweep_title(sweep)}: massive activations in the residual stream (Sun et al. 2024)")
    save_figure(fig, path)


def _heatmap(ax, fig, rows: pl.DataFrame, title: str, vmax: float | None = 1.0) -> None:
    table = rows.with_columns(pl.format("L{} H{}", "layer", "head").alias("where")).sort("layer", "head", "step")
    wide = table.pivot(on="step", index=["layer", "head", "where"], values="value", aggregate_function="first")
    wide = wide.sort("layer", "head")
    steps = [c for c in wide.columns if c not in ("layer", "head", "where")]
    image = ax.imshow(wide.select(steps).to_numpy(), aspect="auto", origin="lower", cmap="magma", vmin=0, vmax=vmax)
    ax.set_xticks(range(len(steps)), steps, rotation=90, fontsize=8)
    ax.set_yticks(range(wide.height), wide["where"].to_list(), fontsize=8)
    ax.set_xlabel("optimizer step (checkpoints, evenly spaced)")
    ax.set_ylabel("layer, head")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax)


def attention_sinks(sweep: pl.DataFrame, path: Path) -> None:
    """Heat maps (layer, head) x checkpoint of the mean attention on the first key and on each row's most-attended
    key."""
    first = select_rows(sweep, "sink_first_mass", "attention", per_head=True)
    if not first.height:
        not_measured(sweep, path, "attention sinks")
        return
    n_rows = first.select("layer", "head").unique().height
    fig, axes = panel_grid(2, 2, size=(4.6, max(3.0, 0.22 * n_rows + 1.5)))
    _heatmap(axes[0], fig, first, "mean attention on the first key")
    _heatmap(
        axes[1],
        fig,
        select_rows(sweep, "sink_row_max_mass", "attention", per_head=True),
        "mean attention on each row's most-attended key",
    )
    fig.suptitle(f"{sweep_title(sweep)}: attention sinks per layer and head over training (Xiao et al. 2024)")
    save_figure(fig, path)


def _count_grid(ax, fig, rows: pl.DataFrame, norms: list[tuple[str, int]], steps: list, title: str) -> None:
    """Norm x checkpoint cells of one count, the count written in each (blank where the norm has none: no bias)."""
    grid = np.full((len(norms), len(steps)), np.nan)
    for site, layer, step, value in rows.select("site", "layer", "step", "value").iter_rows():
        grid[norms.index((site, layer)), steps.index(step)] = value
    top = max(1.0, float(np.nanmax(grid))) if np.isfinite(grid).any() else 1.0
    image = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis", vmin=0, vmax=top)
    if len(steps) <= COUNTS_WRITTEN_UP_TO:
        for (i, j), value in np.ndenumerate(grid):
            if np.isfinite(value):
                colour = "black" if value > 0.6 * top else "white"
                ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=7, color=colour)
    every = -(-len(steps) // COUNTS_WRITTEN_UP_TO)  # a label for at most that many checkpoints
    ax.set_xticks(range(0, len(steps), every), steps[::every], rotation=90, fontsize=8)
    ax.set_yticks(range(len(norms)), [f"{site} {layer}" for site, layer in norms], fontsize=8)
    ax.set_xlabel("optimizer step (checkpoints, evenly spaced)")
    ax.set_title(title, fontsize=9)
    from matplotlib.ticker import MaxNLocator

    fig.colorbar(image, ax=ax).ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts


#: a grid with more checkpoints than this has no room for the counts in its cells: the colour alone says them
COUNTS_WRITTEN_UP_TO = 30


def layernorm_outliers(sweep: pl.DataFrame, path: Path) -> None:
    """Per norm (a row per norm and layer) and checkpoint: gain and bias entries beyond 3 standard deviations, and
    how many of them are among the top 10 rogue dimensions of the residual stream at the norm's layer. A heat map
    with the counts written in, where lines of equal counts would hide each other."""
    rows = sweep.filter(pl.col("metric").str.starts_with("ln_") & pl.col("head").is_null())
    if not rows.height:
        not_measured(sweep, path, "LayerNorm outlier dimensions", "no norm with a gain in this model")
        return
    panels = (
        ("ln_gain_outliers", "gain entries > 3 sd from their mean"),
        ("ln_bias_outliers", "bias entries > 3 sd from their mean"),
        ("ln_outliers_in_rogue", "outlier dims among resid's top 10 rogue dims"),
    )
    # by layer, a layer's final norm after its blocks' norms
    norms = sorted(rows.select("site", "layer").unique().rows(), key=lambda n: (n[1], "final" in n[0], n[0]))
    steps = sorted(rows["step"].unique().to_list())
    width = min(8.0, max(3.6, 0.3 * len(steps) + 2.0))
    fig, axes = panel_grid(len(panels), 3, size=(width, max(2.8, 0.28 * len(norms) + 1.6)))
    for ax, (metric, title) in zip(axes, panels):
        _count_grid(ax, fig, rows.filter(pl.col("metric") == metric), norms, steps, title)
    axes[0].set_ylabel("norm, layer")
    fig.suptitle(f"{sweep_title(sweep)}: LayerNorm outlier dimensions (a row per norm and layer)")
    save_figure(fig, path)


PLOTTERS = {
    "rogue_dimensions.png": rogue_dimensions,
    "avg_cos_standardised.png": avg_cos_standardised,
    "massive_activations.png": massive_activations,
    "attention_sinks.png": attention_sinks,
    "layernorm_outliers.png": layernorm_outliers,
}
