"""The figure kit every plot module shares: pyplot without a display, the step axis (symlog when the grid is
log-spaced, tokens seen on top), panel grids, titles, legends beside the data, metric names in words and the
atomic save (which lifts every tick label to a readable size).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import polars as pl

from anisweep.atomic import replacing
from anisweep.plots.intervals import band, band_handles


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


#: metric names (the tables' ``metric`` column) in words, for axis labels; captions name the metric
METRIC_WORDS = {
    "avg_cos": "mean pairwise cosine",
    "centred_avg_cos": "mean pairwise cosine, centred",
    "drift_ratio": "drift ratio ||mean x|| / mean ||x||",
    "isoscore": "IsoScore (1 = isotropic)",
    "top_eig_share": "top eigenvalue's share of variance",
}


def metric_words(metric: str) -> str:
    return METRIC_WORDS.get(metric, metric.replace("_", " "))


#: the smallest font size (points) of any tick label in a saved figure (save_figure lifts smaller ones)
MIN_TICK_LABEL_SIZE = 8.0
#: the resolution of every saved figure
FIGURE_DPI = 110
#: how PIL writes the PNGs: zlib's level 3 makes files the size its default (6) makes, in two thirds of the time
PNG_OPTIONS = {"compress_level": 3}


def symlog_position(steps, linthresh: float) -> np.ndarray:
    """Where steps sit on a symlog axis (linscale 1, base 10): linear up to linthresh, one unit per decade above."""
    s = np.asarray(steps, dtype=float)
    return np.where(s <= linthresh, s / linthresh, 1 + np.log10(np.maximum(s, linthresh) / linthresh))


def log_spaced(steps) -> bool:
    """Whether the steps spread more evenly on a symlog axis (from 0, linear up to the smallest nonzero step) than
    on a linear one: the largest gap between neighbouring steps, as a share of the axis, is the smaller one.
    Checkpoint grids of the kind 0, 1, 2, 4, ..., 512, 1000 and the gradient steps 0, 16, 64, 1000 are; evenly
    spaced ones (0, 1000, 2000, ...) are not."""
    nonzero = sorted({float(s) for s in steps if s > 0})
    if len(nonzero) < 2:
        return False
    grid = np.array(sorted({0.0, *nonzero}) if any(s == 0 for s in steps) else nonzero)

    def widest_gap(x: np.ndarray) -> float:
        return float(np.diff(x).max() / (x[-1] - x[0]))

    return widest_gap(symlog_position(grid, nonzero[0])) < widest_gap(grid)


def symlog_ticks(linthresh: float, top: float) -> list[float]:
    """The labelled ticks of a symlog axis from 0 up to `top`: 0, then the powers of ten at least half a decade's
    width from it (linthresh / 2 and up). A power of ten deep in the linear part sits next to 0, their labels on
    top of each other (10 beside 0 where the first step is 64)."""
    first = int(np.ceil(np.log10(linthresh / 2)))
    last = int(np.floor(np.log10(top))) if top > 0 else first - 1
    return [0.0, *(10.0**k for k in range(first, last + 1))]


def set_symlog_ticks(ax, linthresh: float) -> None:
    """`symlog_ticks` on the x axis of `ax`, up to its current right limit (which stays as it is), labelled as
    plain numbers (1, 10, 100, 1k), as the tokens-seen axis above is: matplotlib's powers of ten are mathtext,
    and parsing them took a sixth of a figure's time."""
    from matplotlib.ticker import FixedLocator, FuncFormatter

    ax.xaxis.set_major_locator(FixedLocator(symlog_ticks(linthresh, ax.get_xlim()[1])))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: human_number(value)))


def human_number(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def step_axis(ax, sweep: pl.DataFrame, label: bool = True) -> None:
    """Steps below (symlog for log-spaced grids, from 0), tokens seen above at the same ticks, on the panels of
    the grid's top row only: every panel of a figure shares its step axis, and a second axis above each panel
    of the lower rows repeated the top row's (a third of the figure's axes to lay out and draw).

    Call after plotting: the top axis copies the finished limits and ticks.
    """
    from matplotlib.ticker import FuncFormatter, NullLocator

    steps = sweep["step"].unique().to_list()
    scale = {}
    if log_spaced(steps):
        scale = {"value": "symlog", "linthresh": max(1, min(s for s in steps if s > 0))}
        ax.set_xscale(**scale)
    ax.set_xlim(0, max(max(steps) * (1.15 if scale else 1.02), 1))
    if scale:
        set_symlog_ticks(ax, scale["linthresh"])
    if label:
        ax.set_xlabel("optimizer step")
    spec = ax.get_subplotspec()
    if spec is not None and not spec.is_first_row():
        return
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
        top.set_xlabel("tokens seen", fontsize=9)
        top.tick_params(labelsize=MIN_TICK_LABEL_SIZE)


def progress_axis(rows: pl.DataFrame) -> tuple[str, str]:
    """The column and axis label of a figure that puts several models on one x axis: tokens seen where every
    row has them, else the optimizer step for all (a local run without tokens_per_step has no token count, and
    two units on one axis would compare nothing)."""
    if rows.height and rows["tokens_seen"].null_count() == 0:
        return "tokens_seen", "tokens seen"
    return "step", "optimizer step"


def set_progress_scale(ax, rows: pl.DataFrame, column: str, label: str) -> None:
    """A symlog x axis from 0 whose linear part ends at the first positive value of `column`."""
    linthresh = max(1.0, float(rows.filter(pl.col(column) > 0)[column].min() or 1))
    ax.set_xscale("symlog", linthresh=linthresh)
    set_symlog_ticks(ax, linthresh)
    ax.set_xlabel(label)


def lines_by(
    ax, rows: pl.DataFrame, by: str, label_fmt: str, cmap: str = "viridis", labels: dict | None = None
) -> None:
    """A line per value of `by` against the step, labelled `label_fmt` with the value or, where `labels` has it,
    that label; a band around it where `rows` carry intervals (anisweep.plots.intervals.attach)."""
    plt = pyplot()
    groups = sorted(rows[by].unique().drop_nulls().to_list())
    colours = plt.get_cmap(cmap)(np.linspace(0, 0.9, max(len(groups), 1)))
    for colour, group in zip(colours, groups):
        part = rows.filter(pl.col(by) == group).sort("step")
        label = (labels or {}).get(group, label_fmt.format(group))
        ax.plot(part["step"], part["value"], marker=".", color=colour, label=label)
        band(ax, part["step"], part, colour)


def sweep_title(sweep: pl.DataFrame) -> str:
    return f"{sweep['family'][0]} / {sweep['model'][0]}"


def readable_ticks(fig, size: float = MIN_TICK_LABEL_SIZE) -> None:
    """Lift every tick label of `fig` (major and minor, colour bars included) smaller than `size` to `size`.

    Each axis's first major and minor tick carry the size its labels are given (tick_params and set_ticklabels
    set it on every tick, and new ticks copy it): reading them creates one tick each, where the labels themselves
    (get_ticklabels) would place and format every tick once more before the draw does."""
    for ax in fig.axes:
        for which, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            sizes = [ticks[0].label1.get_fontsize() for ticks in (axis.majorTicks, axis.minorTicks)]
            if min(sizes) < size:
                ax.tick_params(axis=which, which="both", labelsize=size)


def legend_beside(fig, axes, source=None, handles=None, labels=None, **kwargs) -> None:
    """The legend of `source` (default: the first axes), or of `handles` made by hand (labelled by `labels` or
    their own), and a patch for each kind of interval band the figure draws, where it covers no data: in the first
    unused panel of `axes` (a panel_grid's hidden ones), else outside the panels on the right."""
    if handles is not None:
        labels = labels if labels is not None else [h.get_label() for h in handles]
    else:
        handles, labels = (source if source is not None else axes[0]).get_legend_handles_labels()
    bands = band_handles(fig, list(labels))
    handles, labels = [*handles, *(h for h, _ in bands)], [*labels, *(text for _, text in bands)]
    if not handles:
        return
    spare = next((ax for ax in axes if not ax.get_visible()), None)
    if spare is not None:
        spare.set_visible(True)
        spare.set_axis_off()
        spare.legend(handles, labels, loc="center", **kwargs)
    else:
        fig.legend(handles, labels, loc="outside right center", **kwargs)


def save_figure(fig, path: Path) -> None:
    """`fig` as a PNG at FIGURE_DPI, its tick labels readable, closed.

    A figure whose layout engine fits it to its canvas (constrained layout: every panel_grid) is drawn once and
    written as drawn, where everything it drew lies on the canvas: savefig would draw it twice, once to lay it out
    and once to render it. Constrained layout fits the panels, their tick labels, titles and legends, not the
    width of a suptitle, of a figure's text or of an axis label; where one of those sticks out, and for any other
    figure, the figure is cropped to what it draws (savefig's bbox_inches="tight", two more draws)."""
    from matplotlib.image import imsave
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    try:
        readable_ticks(fig)
        with replacing(path, keep_suffix=True) as tmp:
            if isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine) and Path(path).suffix == ".png":
                fig.set_dpi(FIGURE_DPI)
                share_font_caches(fig.canvas.get_renderer())
                fig.canvas.draw()
                if not sticks_out(fig):
                    imsave(tmp, fig.canvas.buffer_rgba(), format="png", dpi=FIGURE_DPI, pil_kwargs=PNG_OPTIONS)
                    return
            png = {"pil_kwargs": PNG_OPTIONS} if Path(path).suffix == ".png" else {}
            fig.savefig(tmp, dpi=FIGURE_DPI, bbox_inches="tight", **png)
    finally:
        pyplot().close(fig)


def share_font_caches(renderer) -> None:
    """Give `renderer` the process's mathtext parser and font height metrics, which matplotlib would work out
    again for every figure (the parser) or every text it measures (the metrics)."""
    renderer.mathtext_parser = _mathtext_parser()
    renderer._get_font_height_metrics = functools.partial(font_height_metrics, dpi=renderer.dpi)


def font_height_metrics(prop, dpi: float) -> tuple[float | None, float | None, float | None]:
    """The ascent, descent and line gap (pixels at `dpi`) of the font `prop` names, as matplotlib's Text takes
    them from the font's tables each time it measures a text (a third of laying out a tick label, from matplotlib
    3.11): a renderer that has this method is asked instead (backends that measure fonts their own way have one).
    (None, None, None) lets Text measure them itself."""
    return _font_height_metrics(prop.copy(), dpi)  # a copy: the caller may change its properties later


@functools.lru_cache(maxsize=256)
def _font_height_metrics(prop, dpi: float) -> tuple[float | None, float | None, float | None]:
    from matplotlib.font_manager import fontManager, get_font

    font = get_font(fontManager._find_fonts_by_props(prop))  # the font Text measures (matplotlib.text)
    tables = (("OS/2", "sTypoLineGap", "sTypoAscender", "sTypoDescender"), ("hhea", "lineGap", "ascent", "descent"))
    for name, gap_key, ascent_key, descent_key in tables:
        table = font.get_sfnt_table(name)
        if table is None:
            continue
        scale = 1 / font.get_sfnt_table("head")["unitsPerEm"] * prop.get_size_in_points() * dpi / 72
        return table[ascent_key] * scale, -table[descent_key] * scale, table[gap_key] * scale
    return None, None, None


@functools.cache
def _mathtext_parser():
    """One mathtext parser for every figure of the process. Matplotlib gives each figure's renderer its own, and
    its cache of parsed labels is keyed by the parser: each figure parsed its log axes' powers of ten again, a
    sixth of its time."""
    from matplotlib.mathtext import MathTextParser

    return MathTextParser("path")  # what RendererAgg makes its own of


def sticks_out(fig, tolerance: float = 1.0) -> bool:
    """Whether a drawn figure's texts, axis labels or legends (what its layout engine may leave off the canvas)
    reach beyond it by more than `tolerance` pixels."""
    renderer = fig.canvas.get_renderer()
    artists = [*fig.texts, *fig.legends]
    for ax in fig.axes:
        if ax.get_visible():
            artists += [ax.xaxis.label, ax.yaxis.label, ax.title, ax.get_legend()]
    canvas = fig.bbox.padded(tolerance)
    for artist in artists:
        if artist is None or not artist.get_visible() or (hasattr(artist, "get_text") and not artist.get_text()):
            continue
        box = artist.get_window_extent(renderer)
        if box.x0 < canvas.x0 or box.y0 < canvas.y0 or box.x1 > canvas.x1 or box.y1 > canvas.y1:
            return True
    return False


def panel_grid(n: int, ncols: int, size=(3.4, 2.8)):
    plt = pyplot()
    nrows = int(np.ceil(n / ncols))
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False, constrained_layout=True
    )
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


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
    legend_beside(fig, list(axes.flat), axes[0, 0], fontsize=8)
    fig.suptitle(f"{sweep_title(sweep)}: {title}")
    save_figure(fig, path)


def not_measured(sweep: pl.DataFrame, path: Path, what: str, why: str = "not in this sweep's metrics") -> None:
    """A figure saying so, for metrics a sweep lacks (metrics computed before they were added: rerun metrics), or
    `why` they cannot be drawn."""
    fig, axes = panel_grid(1, 1)
    axes[0].text(0.5, 0.5, f"{what}:\n{why}", ha="center", va="center", wrap=True)
    axes[0].set_axis_off()
    fig.suptitle(sweep_title(sweep))
    save_figure(fig, path)


def reasons_not_measured(rows: pl.DataFrame, measure: str) -> str | None:
    """Why `measure` could not run, from its rows that say so (anisweep.tables.unmeasured_row: metric = its name, a
    reason): each reason once with the steps it holds at; None where no row says so."""
    if "reason" not in rows.columns:
        return None
    said = rows.filter((pl.col("measure") == measure) & (pl.col("metric") == measure) & pl.col("reason").is_not_null())
    if said.height == 0:
        return None
    lines = []
    for (reason,), group in said.sort("step").group_by("reason", maintain_order=True):
        steps = group["step"].unique().sort().to_list()
        shown = ", ".join(map(str, steps[:6])) + (", ..." if len(steps) > 6 else "")
        lines.append(f"step{'s' if len(steps) > 1 else ''} {shown}: {reason}")
    return "\n".join(lines)


def lines_per_layer(
    sweep: pl.DataFrame,
    path: Path,
    site: str,
    panels: dict[str, str],
    title: str,
    ncols: int = 3,
    log_y: tuple[str, ...] = (),
    bands: dict[str, tuple[float, float, str]] | None = None,
    derived: dict | None = None,
) -> None:
    """A panel per metric (`panels`: metric -> y label), a line per layer, against the step; `bands`: metric ->
    (low, high, label) of a grey reference band; `derived`: metric -> function(sweep) giving its per-layer rows
    where they are computed here rather than read. The legend sits in a spare panel (or beside the grid)."""

    def rows_of(sweep, metric, site):
        return derived[metric](sweep) if metric in (derived or {}) else select_rows(sweep, metric, site)

    fig, axes = panel_grid(len(panels), ncols)
    for ax, (metric, label) in zip(axes, panels.items()):
        if metric in (bands or {}):
            low, high, band_label = bands[metric]
            ax.axhspan(low, high, color="grey", alpha=0.2, lw=0, label=band_label)
        lines_by(ax, rows_of(sweep, metric, site), "layer", "layer {}")
        ax.set_ylabel(label)
        if metric in log_y:
            ax.set_yscale("log")
        step_axis(ax, sweep)
    legend_beside(fig, list(axes), fontsize=8)
    fig.suptitle(f"{sweep_title(sweep)}: {title}")
    save_figure(fig, path)
