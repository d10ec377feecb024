"""The figure kit every plot module shares: pyplot without a display, the step axis (symlog when the grid spans
orders of magnitude, tokens seen on top), panel grids, titles and the atomic save.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from anisweep.atomic import replacing


def qk_sites(sweep: pl.DataFrame) -> list[str]:
    return sorted(sweep.filter(pl.col("site").str.starts_with("qk_"))["site"].unique().to_list(), reverse=True)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def select_rows(sweep: pl.DataFrame, metric: str, site: str | None = None, per_head: bool = False) -> pl.DataFrame:
    rows = sweep.filter(pl.col("metric") == metric)
    if site is not None:
        rows = rows.filter(pl.col("site") == site)
    rows = rows.filter(pl.col("head").is_not_null() if per_head else pl.col("head").is_null())
    return rows.sort("step")


def log_spaced(steps) -> bool:
    nonzero = [s for s in steps if s > 0]
    return len(nonzero) >= 3 and max(nonzero) / min(nonzero) >= 100


def human_number(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def step_axis(ax, sweep: pl.DataFrame, label: bool = True) -> None:
    """Steps below (symlog for log-spaced grids, from 0), tokens seen above at the same ticks.

    Call after plotting: the top axis copies the finished limits and ticks.
    """
    from matplotlib.ticker import FuncFormatter, NullLocator

    steps = sweep["step"].unique().to_list()
    scale = {}
    if log_spaced(steps):
        scale = {"value": "symlog", "linthresh": max(1, min(s for s in steps if s > 0))}
        ax.set_xscale(**scale)
    ax.set_xlim(0, max(max(steps) * (1.15 if scale else 1.02), 1))
    if label:
        ax.set_xlabel("optimizer step")
    per_step = sweep.filter(pl.col("step") > 0).select(pl.col("tokens_seen") / pl.col("step")).drop_nulls()
    if per_step.height:
        tokens = float(per_step.item(0, 0))
        top = ax.twiny()
        if scale:
            top.set_xscale(**scale)
        top.set_xlim(ax.get_xlim())
        top.set_xticks([t for t in ax.get_xticks() if 0 <= t <= ax.get_xlim()[1]])
        top.xaxis.set_minor_locator(NullLocator())
        top.xaxis.set_major_formatter(FuncFormatter(lambda s, _: human_number(s * tokens)))
        top.set_xlabel("tokens seen", fontsize=8)
        top.tick_params(labelsize=7)


def lines_by(ax, rows: pl.DataFrame, by: str, label_fmt: str, cmap: str = "viridis") -> None:
    plt = pyplot()
    groups = sorted(rows[by].unique().drop_nulls().to_list())
    colours = plt.get_cmap(cmap)(np.linspace(0, 0.9, max(len(groups), 1)))
    for colour, group in zip(colours, groups):
        part = rows.filter(pl.col(by) == group).sort("step")
        ax.plot(part["step"], part["value"], marker=".", color=colour, label=label_fmt.format(group))


def sweep_title(sweep: pl.DataFrame) -> str:
    return f"{sweep['family'][0]} / {sweep['model'][0]}"


def save_figure(fig, path: Path) -> None:
    try:
        with replacing(path, keep_suffix=True) as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight")
    finally:
        pyplot().close(fig)


def panel_grid(n: int, ncols: int, size=(3.4, 2.8)):
    plt = pyplot()
    nrows = int(np.ceil(n / ncols))
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False, constrained_layout=True
    )
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes.flat


def per_head_panels(sweep: pl.DataFrame, path: Path, rows_spec: list[tuple[str, str, str]], title: str) -> None:
    """A row of panels per (metric, site, y label) in `rows_spec`, a panel per layer, a line per head."""
    rows_spec = [(m, site, label) for m, site, label in rows_spec if select_rows(sweep, m, site, per_head=True).height]
    rotary = "qk_post" in qk_sites(sweep)
    if not rows_spec:
        not_measured(sweep, path, title)
        return
    layers = sorted(
        sweep.filter(pl.col("head").is_not_null() & pl.col("site").str.starts_with("qk_"))["layer"].unique()
    )
    plt = pyplot()
    fig, axes = plt.subplots(
        len(rows_spec),
        len(layers),
        figsize=(3.0 * len(layers), 2.6 * len(rows_spec)),
        squeeze=False,
        sharey="row",
        constrained_layout=True,
    )
    for i, (metric, site, label) in enumerate(rows_spec):
        rows = select_rows(sweep, metric, site, per_head=True)
        for j, layer in enumerate(layers):
            ax = axes[i, j]
            lines_by(ax, rows.filter(pl.col("layer") == layer), "head", "head {}", "tab10")
            ax.axhline(0, color="grey", lw=0.5)
            ax.set_title(
                f"layer {layer}, {site.removeprefix('qk_')}-rotary" if rotary else f"layer {layer}", fontsize=9
            )
            step_axis(ax, sweep, label=i == len(rows_spec) - 1)
        axes[i, 0].set_ylabel(label)
    axes[0, -1].legend(fontsize=6, ncol=2)
    fig.suptitle(f"{sweep_title(sweep)}: {title}")
    save_figure(fig, path)


def not_measured(sweep: pl.DataFrame, path: Path, what: str) -> None:
    """A figure saying so, for metrics a sweep lacks (metrics computed before they were added): rerun metrics."""
    fig, axes = panel_grid(1, 1)
    axes[0].text(0.5, 0.5, f"{what}:\nnot in this sweep's metrics", ha="center", va="center")
    axes[0].set_axis_off()
    fig.suptitle(sweep_title(sweep))
    save_figure(fig, path)


def lines_per_layer(
    sweep: pl.DataFrame,
    path: Path,
    site: str,
    panels: dict[str, str],
    title: str,
    ncols: int = 3,
    log_y: tuple[str, ...] = (),
    bands: dict[str, tuple[float, float, str]] | None = None,
) -> None:
    """A panel per metric (`panels`: metric -> y label), a line per layer, against the step; `bands`: metric ->
    (low, high, label) of a grey reference band."""
    fig, axes = panel_grid(len(panels), ncols)
    for ax, (metric, label) in zip(axes, panels.items()):
        if metric in (bands or {}):
            low, high, band_label = bands[metric]
            ax.axhspan(low, high, color="grey", alpha=0.2, lw=0, label=band_label)
        lines_by(ax, select_rows(sweep, metric, site), "layer", "layer {}")
        ax.set_ylabel(label)
        if metric in log_y:
            ax.set_yscale("log")
        step_axis(ax, sweep)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{sweep_title(sweep)}: {title}")
    save_figure(fig, path)
