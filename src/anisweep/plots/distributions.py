"""Figures of the q/k distributions across training of one model: the arrow plots of qk_svd (Godey et al. 2024,
Fig. 11/12, 19-22) and the pre-softmax score histograms over training (Fig. 7 followed across steps)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from anisweep.mechanism.qk_svd import BASES, select_heads
from anisweep.plots.kit import panel_grid, pyplot, save_figure

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
    axes[0].legend(fontsize=6, loc="best")
    fig.suptitle(
        f"{table['family'][0]} / {table['model'][0]}: mean q and k from step {steps[0]} to {steps[-1]}, "
        f"{BASIS_LABEL[basis]} ({rope}-rotary)",
        fontsize=9,
    )
    save_figure(fig, path)


def qk_svd_figures(table: pl.DataFrame, extras: dict, heads, out_dir: Path) -> list[Path]:
    paths = []
    for basis in BASES:
        path = Path(out_dir) / f"qk_svd_{basis}.png"
        qk_svd_figure(table, extras, basis, heads, path)
        paths.append(path)
    return paths


def score_hist_figure(hist: pl.DataFrame, path: Path) -> None:
    """Per layer, the share of visible (query, key) pairs in each score bin at each step (a line per step, darker:
    later); the under- and overflow shares are written in each panel's corner for the final step."""
    plt = pyplot()
    layers = sorted(hist["layer"].unique().to_list())
    steps = sorted(hist["step"].unique().to_list())
    colours = plt.get_cmap("viridis")(np.linspace(0, 0.95, len(steps)))
    fig, axes = panel_grid(len(layers), min(4, len(layers)), size=(3.4, 2.8))
    for ax, layer in zip(axes, layers):
        for colour, step in zip(colours, steps):
            rows = hist.filter((pl.col("layer") == layer) & (pl.col("step") == step)).sort("bin")
            share = rows["count"].to_numpy() / max(rows["count"].sum(), 1)
            inner = rows[1:-1]
            centres = (inner["bin_lo"].to_numpy() + inner["bin_hi"].to_numpy()) / 2
            ax.plot(centres, share[1:-1], color=colour, lw=1, label=f"step {step}")
        ax.set_yscale("log")
        ax.text(
            0.02,
            0.97,
            f"final: {share[0]:.1%} below, {share[-1]:.1%} above",
            transform=ax.transAxes,
            fontsize=6,
            va="top",
        )
        ax.set_title(f"layer {layer}", fontsize=8)
        ax.set_xlabel("pre-softmax score", fontsize=7)
        ax.set_ylabel("share of visible pairs", fontsize=7)
        ax.tick_params(labelsize=6)
    axes[0].legend(fontsize=5, ncol=2)
    fig.suptitle(f"{hist['family'][0]} / {hist['model'][0]}: attention scores over training", fontsize=9)
    save_figure(fig, path)
