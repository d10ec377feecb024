"""Figures of the untrained-block experiment (anisweep.mechanism.untrained), from its tables only: one row of panels per
init, the bias norm N on a symlog x axis (N = 0 stays on it), lines the mean over seeds, bands their min-max."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from anisweep.plots.kit import pyplot, save_figure
from anisweep.tables import read_parquet

SITE_COLOURS = {"input": "tab:blue", "output": "tab:red", "q": "tab:green", "k": "tab:purple"}
P_COLOURS = {"p_max_mean": "tab:red", "p_median_mean": "tab:orange", "p_min_mean": "tab:blue"}


def _axes(summary: pl.DataFrame, n_panels: int, title: str):
    plt = pyplot()
    inits = summary["init"].unique(maintain_order=True).to_list()
    fig, axes = plt.subplots(
        len(inits), n_panels, figsize=(3.8 * n_panels, 3.0 * len(inits) + 0.4), squeeze=False, constrained_layout=True
    )
    fig.suptitle(f"Untrained block: {title}\n(lines: mean over seeds; bands: their min-max)", fontsize=10)
    return fig, list(zip(inits, axes))


def _norm_axis(ax, summary: pl.DataFrame) -> None:
    norms = [n for n in summary["norm"].drop_nulls().unique().to_list() if n > 0]
    ax.set_xscale("symlog", linthresh=min(norms) if norms else 1.0)
    ax.set_xlim(0, max(norms) * 1.3 if norms else 1.0)
    ax.set_xlabel("bias norm N")


def _band(ax, summary: pl.DataFrame, init: str, site: str, metric: str, label: str, colour: str) -> None:
    part = summary.filter(
        (pl.col("init") == init) & (pl.col("site") == site) & (pl.col("metric") == metric) & pl.col("head").is_null()
    )
    part = part.filter(pl.col("norm").is_not_null()).sort("norm")
    if part.height == 0:
        return
    ax.plot(part["norm"], part["mean"], marker=".", color=colour, label=label)
    ax.fill_between(part["norm"], part["min"], part["max"], color=colour, alpha=0.2, linewidth=0)


def norms(summary: pl.DataFrame, path: Path) -> None:
    """Fig. 6: avg_cos and mean norm of the block's input x + b and output T(x + b); N* marked."""
    fig, rows = _axes(summary, 2, "input x + b and output T(x + b) against the bias norm N")
    for init, (cos_ax, norm_ax) in rows:
        for site in ("input", "output"):
            _band(cos_ax, summary, init, site, "avg_cos", site, SITE_COLOURS[site])
            _band(norm_ax, summary, init, site, "norm_mean", site, SITE_COLOURS[site])
        star = summary.filter((pl.col("init") == init) & (pl.col("metric") == "fixed_point_norm"))
        if star.height and np.isfinite(star["mean"][0]):
            mean, std = star["mean"][0], star["std"][0]
            label = f"N* = {mean:.3g}" + (f" ± {std:.2g}" if std is not None and np.isfinite(std) else "")
            norm_ax.axvline(mean, color="grey", linestyle="--", label=label)
            norm_ax.axvspan(star["min"][0], star["max"][0], color="grey", alpha=0.15, linewidth=0)
        norm_ax.set_yscale("log")
        cos_ax.set_ylabel("mean pairwise cosine")
        norm_ax.set_ylabel("mean norm ||x||")
        cos_ax.set_title(f"{init}: anisotropy in and out", fontsize=9)
        norm_ax.set_title(f"{init}: norm in and out", fontsize=9)
        for ax in (cos_ax, norm_ax):
            _norm_axis(ax, summary)
            ax.legend(fontsize=7)
    save_figure(fig, path)


def _share_text(share: float) -> str:
    return f"{share:.1%}" if share >= 1e-3 else f"{share:.0e}".replace("e-0", "e-")


def score_magnitudes(histogram: pl.DataFrame) -> pl.DataFrame:
    """The histogram pooled over heads and seeds and folded onto the magnitude of the score, per (init, norm):
    one row per inner bin of |score| (lo, hi > 0) with the share of all visible pairs whose score is positive
    (`positive`) and negative (`negative`) in it; the central bin (|score| < lo of the first, sign unknown)
    and the two open-ended bins are left out, their shares in `small` and `beyond`."""
    pooled = histogram.group_by(["init", "norm", "bin_lo", "bin_hi"]).agg(pl.col("count").sum())
    total = pooled.group_by(["init", "norm"]).agg(pl.col("count").sum().alias("total"))
    pooled = pooled.join(total, on=["init", "norm"]).with_columns(share=pl.col("count") / pl.col("total"))
    inner = pl.col("bin_lo").is_finite() & pl.col("bin_hi").is_finite()
    positive = pooled.filter(inner & (pl.col("bin_lo") > 0))
    negative = pooled.filter(inner & (pl.col("bin_hi") < 0))
    negative = negative.select(
        "init", "norm", (-pl.col("bin_hi")).alias("bin_lo"), (-pl.col("bin_lo")).alias("bin_hi"), "share"
    )
    folded = positive.select("init", "norm", "bin_lo", "bin_hi", pl.col("share").alias("positive")).join(
        negative.rename({"share": "negative"}), on=["init", "norm", "bin_lo", "bin_hi"], how="full", coalesce=True
    )
    central = pooled.filter(inner & (pl.col("bin_lo") < 0) & (pl.col("bin_hi") > 0))
    beyond = pooled.filter(~inner)
    folded = folded.join(
        central.group_by(["init", "norm"]).agg(pl.col("share").sum().alias("small")), on=["init", "norm"], how="left"
    ).join(
        beyond.group_by(["init", "norm"]).agg(pl.col("share").sum().alias("beyond")), on=["init", "norm"], how="left"
    )
    return folded.with_columns(pl.col("positive", "negative", "small", "beyond").fill_null(0.0)).sort(
        "init", "norm", "bin_lo"
    )


def scores(histogram: pl.DataFrame, path: Path) -> None:
    """Fig. 7: the pre-softmax score distribution per N, pooled over heads and seeds, on the magnitude of the
    score (log x): per bin of |score| the share of all visible pairs with a positive score there (solid) and
    with a negative one (dashed). The bins are log-spaced in |score|, so a curve is a density in log |score|;
    drawn on a symlog score axis the same counts would put a zero-centred distribution's two flanks at -σ and +σ
    as two humps, which reads as bimodal. The central bin (|score| < score_min) and the open-ended outer bins
    are left out of the curves; their shares are given in the legend."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    folded = score_magnitudes(histogram)
    inits = histogram["init"].unique(maintain_order=True).to_list()
    fig, axes = plt.subplots(1, len(inits), figsize=(5.6 * len(inits), 4.0), squeeze=False, constrained_layout=True)
    fig.suptitle("Untrained block: pre-softmax scores per bias norm N, pooled over heads and seeds", fontsize=10)
    for init, ax in zip(inits, axes[0]):
        part = folded.filter(pl.col("init") == init)
        norms = part["norm"].unique().sort().to_list()
        colours = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(norms)))
        handles = []
        for colour, norm in zip(colours, norms):
            h = part.filter(pl.col("norm") == norm)
            centres = np.sqrt(h["bin_lo"].to_numpy() * h["bin_hi"].to_numpy())  # geometric: the log-axis middle
            ax.plot(centres, h["positive"].to_numpy(), color=colour, lw=1.2)
            ax.plot(centres, h["negative"].to_numpy(), color=colour, lw=1.2, ls="--")
            small, beyond = float(h["small"][0]), float(h["beyond"][0])
            notes = [f"{_share_text(small)} with |s| < {h['bin_lo'].min():g}" if small else ""]
            notes += [f"{_share_text(beyond)} with |s| > {h['bin_hi'].max():g}" if beyond else ""]
            notes = ", ".join(n for n in notes if n)
            handles.append(
                Line2D([], [], color=colour, lw=1.2, label=f"N = {norm:g}" + (f" ({notes})" if notes else ""))
            )
        handles += [
            Line2D([], [], color="black", lw=1.2, label="score > 0"),
            Line2D([], [], color="black", lw=1.2, ls="--", label="score < 0"),
        ]
        ax.set_xscale("log")
        ax.set_xlabel("|s|, magnitude of the score s = q.k / sqrt(d_head) (log scale)")
        ax.set_ylabel("share of visible pairs per bin\n(bins equal in log |score|)")
        ax.set_title(f"{init}: pre-softmax scores by magnitude and sign", fontsize=9)
        ax.legend(handles=handles, fontsize=6, ncol=2, loc="upper left")
        top = float(part.select(pl.max_horizontal("positive", "negative")).max().item() or 0.0)
        ax.set_ylim(0, top * 1.45 if top > 0 else 1.0)  # headroom for the legend
    save_figure(fig, path)


def qk(summary: pl.DataFrame, path: Path) -> None:
    """Fig. 8: avg_cos and mean norm of the queries and keys (mean over heads)."""
    fig, rows = _axes(summary, 2, "queries and keys against the bias norm N")
    for init, (cos_ax, norm_ax) in rows:
        for site in ("q", "k"):
            _band(cos_ax, summary, init, site, "avg_cos", site, SITE_COLOURS[site])
            _band(norm_ax, summary, init, site, "norm_mean", site, SITE_COLOURS[site])
        norm_ax.set_yscale("log")
        cos_ax.set_ylabel("mean pairwise cosine\n(mean over heads)")
        norm_ax.set_ylabel("mean norm ||q||, ||k||")
        cos_ax.set_title(f"{init}: query/key anisotropy", fontsize=9)
        norm_ax.set_title(f"{init}: query/key norm", fontsize=9)
        for ax in (cos_ax, norm_ax):
            _norm_axis(ax, summary)
            ax.legend(fontsize=7)
    save_figure(fig, path)


def softmax(summary: pl.DataFrame, path: Path) -> None:
    """Fig. 9: per query row the max, median and min probability, averaged over rows, heads and sequences."""
    fig, rows = _axes(summary, 1, "softmax per query row")
    for init, (ax,) in rows:
        for metric, colour in P_COLOURS.items():
            _band(ax, summary, init, "attention", metric, metric.removesuffix("_mean").replace("p_", ""), colour)
        ax.set_yscale("log")
        ax.set_ylabel("probability, mean over rows")
        ax.set_title(f"{init}: attention probabilities", fontsize=9)
        _norm_axis(ax, summary)
        ax.legend(fontsize=7)
    save_figure(fig, path)


def extremes(summary: pl.DataFrame, path: Path) -> None:
    """Fig. 10: each sequence's largest and smallest probability (over all its heads and rows), averaged over
    the sequences."""
    fig, rows = _axes(summary, 2, "each sequence's extreme probabilities")
    for init, (max_ax, min_ax) in rows:
        _band(max_ax, summary, init, "attention", "seq_p_max_mean", "max", "tab:red")
        _band(min_ax, summary, init, "attention", "seq_p_min_mean", "min", "tab:blue")
        min_ax.set_yscale("log")
        max_ax.set_ylabel("largest p in a sequence\n(mean over sequences)")
        min_ax.set_ylabel("smallest p in a sequence\n(mean over sequences)")
        max_ax.set_title(f"{init}: maximum", fontsize=9)
        min_ax.set_title(f"{init}: minimum", fontsize=9)
        for ax in (max_ax, min_ax):
            _norm_axis(ax, summary)
    save_figure(fig, path)


PLOTTERS = {
    "untrained_norms.png": ("summary", norms),
    "untrained_scores.png": ("histogram", scores),
    "untrained_qk.png": ("summary", qk),
    "untrained_softmax.png": ("summary", softmax),
    "untrained_extremes.png": ("summary", extremes),
}
#: The figures, drawn in this order: the plot_untrained rule's outputs, each with a caption
#: workflow/report/{name without .png}.rst.
UNTRAINED_FIGURES = tuple(PLOTTERS)


def plot_untrained(tables_dir: Path, out_dir: Path) -> list[Path]:
    tables_dir, out_dir = Path(tables_dir), Path(out_dir)
    tables = {name: read_parquet(tables_dir / f"{name}.parquet") for name in ("summary", "histogram")}
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (table, plotter) in PLOTTERS.items():
        plotter(tables[table], out_dir / name)
        written.append(out_dir / name)
    return written
