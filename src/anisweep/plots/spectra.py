"""The normalised singular-value spectra of one model over training (spectra.parquet of every checkpoint),
against the spectrum an isotropic Gaussian sample of the same shape would have. The figure is this project's
own: Godey et al. 2024 show no spectra (their Fig. 17/18 are cosine-similarity distributions of isotropic
Gaussians, the baseline of anisweep.measures.geometry's avg_cos band, not of this figure).

The baseline is the Marchenko-Pastur law (V. A. Marchenko and L. A. Pastur 1967, "Distribution of eigenvalues
for some sets of random matrices", Math. USSR-Sbornik 1(4):457-483): for an n x d matrix of i.i.d. N(0, 1)
entries (n >= d), the eigenvalues of X^T X / n fill [(1 - sqrt(g))^2, (1 + sqrt(g))^2], g = d / n, with density
sqrt((b - x)(x - a)) / (2 pi g x); the k-th largest of the d singular values is about sqrt(n) times the square
root of the law's upper (k - 1/2)/d quantile. Normalised like spectra.parquet (each over their sum), the scale
drops out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
from matplotlib.ticker import MaxNLocator

from anisweep.plots.kit import legend_beside, pyplot, save_figure

SPECTRA_FIGURES = ("spectra.png",)
STEPS_SHOWN = 6  # at most, spread over the swept steps in log(step + 1); the first and the last always
_QUADRATURE_POINTS = 20_001


def isotropic_shares(n: int, d: int) -> np.ndarray:
    """The normalised singular values (descending, summing to 1) that an n x d isotropic Gaussian sample has
    in the large-sample limit at its aspect ratio (Marchenko-Pastur quantiles; min(n, d) values)."""
    n, d = max(n, d), min(n, d)  # X and X^T have the same singular values
    ratio = d / n
    lo, hi = (1 - np.sqrt(ratio)) ** 2, (1 + np.sqrt(ratio)) ** 2
    # x = lo + (hi - lo)(1 - cos t)/2 takes the square-root edges away: the integrand is smooth in t
    t = np.linspace(0.0, np.pi, _QUADRATURE_POINTS)
    x = lo + (hi - lo) * (1 - np.cos(t)) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        density_dt = ((hi - lo) / 2) ** 2 * np.sin(t) ** 2 / (2 * np.pi * ratio * x)
    density_dt[0] = density_dt[1] if not np.isfinite(density_dt[0]) else density_dt[0]  # ratio 1: x = 0 at t = 0
    cdf = np.concatenate([[0.0], np.cumsum((density_dt[1:] + density_dt[:-1]) / 2 * np.diff(t))])
    cdf /= cdf[-1]
    upper = (np.arange(d) + 0.5) / d  # the k-th largest: upper quantile (k - 1/2)/d
    quantile_t = np.interp(1 - upper, cdf, t)  # in t, where the cdf is smooth, then back to x
    eigenvalues = lo + (hi - lo) * (1 - np.cos(quantile_t)) / 2
    singular = np.sqrt(np.clip(eigenvalues, 0, None))
    return singular / singular.sum()


def chosen_steps(steps: list[int], at_most: int = STEPS_SHOWN) -> list[int]:
    """At most `at_most` of the steps, nearest to an even spread in log(step + 1), the first and last included."""
    steps = sorted(set(steps))
    if len(steps) <= at_most:
        return steps
    logs = np.log1p(steps)
    targets = np.linspace(logs[0], logs[-1], at_most)
    return sorted({steps[int(np.argmin(np.abs(logs - target)))] for target in targets})


def _spread(values: list[int]) -> list[int]:
    """First, middle and last of sorted distinct values."""
    values = sorted(set(values))
    return sorted({values[0], values[len(values) // 2], values[-1]})


def hidden_panels(spectra: pl.DataFrame) -> list[tuple[int, str, str]]:
    """(layer, site, title) of the hidden-state panels: the embedding output, a middle block's output, and the
    final LayerNorm's input and output (the last block's output where the model has no final LayerNorm)."""
    hidden = spectra.filter(pl.col("vectors") == "hidden")
    resid = sorted(hidden.filter(pl.col("site") == "resid")["layer"].unique().to_list())
    panels = [(resid[0], "resid", f"layer {resid[0]} (embedding output)")]
    if len(resid) > 2:
        panels.append((resid[len(resid) // 2], "resid", f"layer {resid[len(resid) // 2]} (residual stream)"))
    finals = hidden.filter(pl.col("site").is_in(["final_ln_in", "final_ln_out"]))
    if finals.height:
        last = int(finals["layer"].max())
        panels += [(last, "final_ln_in", f"layer {last}, before the final LayerNorm")]
        panels += [(last, "final_ln_out", f"layer {last}, after the final LayerNorm")]
    elif len(resid) > 1:
        panels.append((resid[-1], "resid", f"layer {resid[-1]} (last block's output)"))
    return panels


def _head_mean(rows: pl.DataFrame) -> pl.DataFrame:
    """(index, share, n): the share of each singular value averaged over heads (heads of one layer share d_head
    and the sampled tokens, so n)."""
    return rows.group_by("index").agg(pl.col("share").mean(), pl.col("n").first()).sort("index")


def _baseline(ax, n: int, count: int) -> None:
    # count singular values: d when n > count; n = count (so d unknown, taken = n) otherwise
    shares = isotropic_shares(n, count)
    ax.plot(np.arange(1, len(shares) + 1), shares, color="tab:red", ls="--", lw=1.2, label=f"isotropic N(0, I), n={n}")


def spectra_figure(spectra: pl.DataFrame, path: Path) -> None:
    """Top row: the hidden-state spectra of a few sites; then a row for queries and one for keys at the first,
    a middle and the last layer, averaged over heads, as attention sees them (post-rotary where rotary). A line
    per chosen step (darker: later), the isotropic Gaussian baseline dashed; log y."""
    plt = pyplot()
    steps = chosen_steps(spectra["step"].unique().to_list())
    colours = dict(zip(steps, plt.get_cmap("viridis")(np.linspace(0, 0.92, len(steps)))))
    hidden = hidden_panels(spectra)
    qk = spectra.filter(pl.col("vectors").is_in(["q", "k"]))
    qk_site = "qk_post" if "qk_post" in qk["site"].unique().to_list() else "qk_pre"
    qk_layers = _spread(qk.filter(pl.col("site") == qk_site)["layer"].to_list()) if qk.height else []
    rows = [("hidden", [(layer, site, title) for layer, site, title in hidden])]
    for which in ("q", "k"):
        rows.append((which, [(layer, qk_site, f"{which} of layer {layer}, mean of heads") for layer in qk_layers]))
    rows = [(vectors, panels) for vectors, panels in rows if panels]
    ncols = max(len(panels) for _, panels in rows)
    fig, axes = plt.subplots(
        len(rows), ncols, figsize=(3.3 * ncols, 2.8 * len(rows)), squeeze=False, constrained_layout=True
    )
    for ax in axes.flat:
        ax.set_visible(False)
    for r, (vectors, panels) in enumerate(rows):
        for c, (layer, site, title) in enumerate(panels):
            ax = axes[r, c]
            ax.set_visible(True)
            part = spectra.filter(
                (pl.col("vectors") == vectors) & (pl.col("layer") == layer) & (pl.col("site") == site)
            )
            shape = None
            for step in steps:
                line = _head_mean(part.filter(pl.col("step") == step))
                if line.height:
                    ax.plot(line["index"], line["share"], color=colours[step], lw=1.1, label=f"step {step}")
                    shape = (int(line["n"][0]), line.height)
            if shape:
                _baseline(ax, *shape)
            ax.set_yscale("log")
            ax.set_title(title, fontsize=8)
            ax.set_xlabel("singular value index", fontsize=7)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel("s_i / sum s" if c == 0 else "", fontsize=7)
            ax.tick_params(which="both", labelsize=6)
    legend_beside(fig, list(axes.flat), fontsize=7)
    rope = {"qk_post": "post-rotary", "qk_pre": "as attention sees them"}[qk_site]
    fig.suptitle(
        f"{spectra['family'][0]} / {spectra['model'][0]}: normalised singular values of the sampled hidden states "
        f"(top) and queries / keys ({rope}) over training",
        fontsize=9,
    )
    save_figure(fig, path)
