"""Figures of the q/k distributions across training of one model: the arrow plots of qk_svd (Godey et al. 2024,
Fig. 11/12, 19-22) and the pre-softmax score histograms over training (Fig. 7 followed across steps)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from anisweep.mechanism.qk_svd import BASES, select_heads
from anisweep.plots.kit import legend_beside, panel_grid, pyplot, save_figure

BASIS_LABEL = {
    "common": "SVD of queries and keys together",
    "q": "SVD of the queries only",
    "k": "SVD of the keys only",
}
POINTS_SHOWN = 150  # sampled vectors drawn per step and side, of the first and the final step


def _arrows(ax, xy: np.ndarray, cmap, label: str) -> None:
    colours = cmap(np.linspace(0.35, 1.0, len(xy)))
    for i in range(len(xy) - 1):
        ax.annotate(
            "",
            xy=xy[i + 1],
            xytext=xy[i],
            arrowprops={"arrowstyle": "->", "color": colours[i + 1], "lw": 1.3, "shrinkA": 0, "shrinkB": 0},
        )
    ax.scatter(xy[:, 0], xy[:, 1], s=9, color=colours, zorder=3, label=label)


def qk_svd_figure(table: pl.DataFrame, extras: dict, basis: str, heads, path: Path) -> None:
    """One panel per chosen head: each step's mean query (blue) and mean key (red) projected on the basis's
    first two directions, joined by arrows from step to step (darker: later); faint points are sampled
    vectors of the first (light) and final (dark) steps."""
    plt = pyplot()
    chosen = select_heads(extras["final_qk"], heads)
    rope = "post" if "post" in extras["final_qk"]["rope"].to_list() else "pre"
    fig, axes = panel_grid(len(chosen), min(4, len(chosen)), size=(3.4, 3.2))
    rng = np.random.default_rng(0)
    for ax, (layer, head) in zip(axes, chosen):
        rows = table.filter(
            (pl.col("layer") == layer)
            & (pl.col("head") == head)
            & (pl.col("rope") == rope)
            & (pl.col("basis") == basis)
        ).sort("step")
        bases, q_by_step, k_by_step = extras["vectors"][(layer, head, rope)]
        v = bases[basis]
        steps = sorted(q_by_step)
        for step, alpha in ((steps[0], 0.12), (steps[-1], 0.3)):
            for vectors, colour in ((q_by_step[step], "tab:blue"), (k_by_step[step], "tab:red")):
                shown = vectors[rng.permutation(len(vectors))[:POINTS_SHOWN]] @ v.T
                ax.scatter(shown[:, 0], shown[:, 1], s=3, color=colour, alpha=alpha, linewidths=0)
        _arrows(ax, rows.select("q_1", "q_2").to_numpy(), plt.get_cmap("Blues"), "mean query")
        _arrows(ax, rows.select("k_1", "k_2").to_numpy(), plt.get_cmap("Reds"), "mean key")
        ax.scatter([0], [0], marker="+", color="black", s=40, zorder=4)
        cos = extras["final_qk"].filter(
            (pl.col("layer") == layer) & (pl.col("head") == head) & (pl.col("rope") == rope)
        )["qk_cos"][0]
        ax.set_title(f"layer {layer}, head {head}: final qk cos {cos:+.2f}", fontsize=8)
        ax.set_xlabel(f"direction 1 ({rows['sv_share_1'][0]:.0%} of singular values)", fontsize=7)
        ax.set_ylabel(f"direction 2 ({rows['sv_share_2'][0]:.0%})", fontsize=7)
        ax.tick_params(labelsize=6)
    _explain_marks(fig, axes, steps)
    fig.suptitle(
        f"{table['family'][0]} / {table['model'][0]}: mean q and k from step {steps[0]} to {steps[-1]}, "
        f"{BASIS_LABEL[basis]} ({rope}-rotary)",
        fontsize=9,
    )
    save_figure(fig, path)


def _explain_marks(fig, axes, steps: list[int]) -> None:
    """One legend beside the panels naming every mark: the arrows' colour runs from light (the first step) to
    dark (the final one), the faint points, the origin."""
    from matplotlib.lines import Line2D

    plt = pyplot()
    light, dark = (f"step {steps[0]}", f"step {steps[-1]}")
    handles = [
        Line2D([], [], color=plt.get_cmap("Blues")(0.35), marker="o", ms=3, label=f"mean query, {light} (light)"),
        Line2D([], [], color=plt.get_cmap("Blues")(1.0), marker="o", ms=3, label=f"mean query, {dark} (dark)"),
        Line2D([], [], color=plt.get_cmap("Reds")(0.35), marker="o", ms=3, label=f"mean key, {light} (light)"),
        Line2D([], [], color=plt.get_cmap("Reds")(1.0), marker="o", ms=3, label=f"mean key, {dark} (dark)"),
        Line2D([], [], color="grey", marker=".", ls="", alpha=0.4, label="faint: sampled q / k vectors of the"),
        Line2D([], [], ls="", label=f"  first (fainter) and final steps ({light}, {dark})"),
        Line2D([], [], color="black", marker="+", ls="", ms=7, label="the origin"),
    ]
    for ax in axes:
        legend = ax.get_legend()
        if legend is not None:
            legend.remove()
    legend_beside(fig, axes, handles=handles, fontsize=6.5)


def qk_svd_figures(table: pl.DataFrame, extras: dict, heads, out_dir: Path) -> list[Path]:
    paths = []
    for basis in BASES:
        path = Path(out_dir) / f"qk_svd_{basis}.png"
        if table.is_empty():  # nothing to decompose: the figure says why
            nothing_to_draw(path, f"q/k SVD ({basis})", extras["why"])
        else:
            qk_svd_figure(table, extras, basis, heads, path)
        paths.append(path)
    return paths


def nothing_to_draw(path: Path, what: str, why: str) -> None:
    fig, axes = panel_grid(1, 1, size=(6.0, 2.0))
    axes[0].text(0.5, 0.5, f"{what}:\n{why}", ha="center", va="center", wrap=True)
    axes[0].set_axis_off()
    save_figure(fig, path)


def _step_ranges(runs: list[list[int]]) -> str:
    """[[0, 1, 2, 4], [16]] -> "steps 0-4, 16" (runs of consecutive entries of the step grid)."""
    return "steps " + ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}" for run in runs)


def _outside_words(below: float, above: float, low: float, high: float) -> str:
    """How many scores fall outside the binned range, in words."""
    if below == 0 and above == 0:
        return f"scores outside the bins ({low:g} to {high:g}): none"
    parts = [
        f"{f'{share:.2%}' if share else 'none'} {side} {edge:g}"
        for share, side, edge in ((below, "below", low), (above, "above", high))
    ]
    return "scores outside the bins: " + ", ".join(parts)


UNRESOLVED_BINS = 3  # a step whose scores all fall in this many bins or fewer is named in the panel as unresolved


def score_hist_panel_data(hist: pl.DataFrame, layer: int) -> dict:
    """What one layer's panel draws: per step the share of visible pairs in each inner bin (the shares of the
    under- and overflow bins apart), the bin edges, the displayed x range (the bins any step occupies, one bin
    of margin each side), and the steps whose scores all fall in UNRESOLVED_BINS bins or fewer (the bins are
    too wide to show their shape)."""
    part = hist.filter(pl.col("layer") == layer)
    steps = sorted(part["step"].unique().to_list())
    shares, below, above, occupied, unresolved = {}, {}, {}, [], []
    edges = None
    for step in steps:
        rows = part.filter(pl.col("step") == step).sort("bin")
        count = rows["count"].to_numpy().astype(np.float64)
        share = count / max(count.sum(), 1.0)
        inner = rows[1:-1]
        edges = np.append(inner["bin_lo"].to_numpy(), inner["bin_hi"].to_numpy()[-1])
        shares[step], below[step], above[step] = share[1:-1], float(share[0]), float(share[-1])
        filled = np.flatnonzero(share[1:-1] > 0)
        if len(filled):
            occupied += [filled.min(), filled.max()]
            if len(filled) <= UNRESOLVED_BINS and below[step] == 0 and above[step] == 0:
                unresolved.append((step, edges[filled.min()], edges[filled.max() + 1], len(filled)))
    n = len(edges) - 1
    lo, hi = (max(min(occupied) - 1, 0), min(max(occupied) + 1, n - 1)) if occupied else (0, n - 1)
    return {
        "steps": steps,
        "edges": edges,
        "shares": shares,
        "below": below,
        "above": above,
        "xlim": (float(edges[lo]), float(edges[hi + 1])),
        "unresolved": unresolved,
    }


def _unresolved_words(unresolved: list[tuple], steps: list[int], width: float) -> str:
    if not unresolved:
        return ""
    index = {s: i for i, s in enumerate(steps)}
    runs: list[list[int]] = []
    for step, *_ in unresolved:
        if runs and index[step] == index[runs[-1][-1]] + 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    lo, hi = min(u[1] for u in unresolved), max(u[2] for u in unresolved)
    most = max(u[3] for u in unresolved)
    return (
        f"{_step_ranges(runs)}: every score in [{lo:g}, {hi:g}),\n"
        f"{'at most ' if most > 1 else ''}{most} bin{'s' if most > 1 else ''} of width {width:g}: "
        "too narrow to show a shape"
    )


def score_hist_figure(hist: pl.DataFrame, path: Path) -> None:
    """Per layer, the share of visible (query, key) pairs in each score bin at each step (a step histogram per
    step, darker: earlier, yellow: later), zoomed to the bins any step occupies. Each panel says in words how
    many scores fall outside the binned range (at any step) and which steps put every score in a few bins, too
    few to show their distribution's shape."""
    plt = pyplot()
    layers = sorted(hist["layer"].unique().to_list())
    steps = sorted(hist["step"].unique().to_list())
    colours = dict(zip(steps, plt.get_cmap("viridis")(np.linspace(0, 0.95, len(steps)))))
    fig, axes = panel_grid(len(layers), min(4, len(layers)), size=(3.8, 3.2))
    width = None
    for ax, layer in zip(axes, layers):
        data = score_hist_panel_data(hist, layer)
        edges = data["edges"]
        width = float(np.diff(edges).max())
        for step in data["steps"]:
            share = np.where(data["shares"][step] > 0, data["shares"][step], np.nan)
            ax.stairs(share, edges, color=colours[step], lw=1.1, baseline=None, label=f"step {step}")
        ax.set_yscale("log")
        ax.set_xlim(*data["xlim"])
        below, above = max(data["below"].values()), max(data["above"].values())
        words = _outside_words(below, above, edges[0], edges[-1])
        if below or above:
            final = data["steps"][-1]
            words = "final step: " + _outside_words(data["below"][final], data["above"][final], edges[0], edges[-1])
        unresolved = _unresolved_words(data["unresolved"], data["steps"], width)
        ax.text(
            0.02,
            0.98,
            words + ("\n" + unresolved if unresolved else ""),
            transform=ax.transAxes,
            fontsize=6.5,
            va="top",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
        )
        ax.set_ylim(top=ax.get_ylim()[1] * 30)  # room for the words above the peak
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.set_xlabel(f"pre-softmax score (bins of width {width:g})", fontsize=8)
        ax.set_ylabel("share of visible (query, key) pairs", fontsize=8)
    legend_beside(fig, axes, fontsize=7, title="checkpoint", title_fontsize=7)
    fig.suptitle(
        f"{hist['family'][0]} / {hist['model'][0]}: pre-softmax attention scores over training, all heads "
        "(score_hist.parquet)",
        fontsize=9,
    )
    save_figure(fig, path)
