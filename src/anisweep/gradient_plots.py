"""One model's gradient tables across training (anisweep.gradients): the per-model table and its figures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from .plots import _grid, _pyplot, _save, _step_axis, _title

#: the figures of one model, `figures/{name}`: the plot_gradients rule's outputs, in this order
GRADIENT_FIGURES = ("gradients.png", "gradients_strata.png")
STRATUM_COLOURS = {"frequent": "tab:red", "middle": "tab:orange", "rare": "tab:blue"}


def gradients_sweep(paths: list[Path]) -> pl.DataFrame:
    """Every checkpoint's gradients.parquet of one model, in one table sorted by step."""
    if not paths:
        raise ValueError("gradients-sweep: no gradients.parquet given")
    return pl.concat([pl.read_parquet(p) for p in paths], how="diagonal_relaxed").sort("step", "layer", "site")


def _site_label(layer, site) -> str:
    return f"layer {layer}" if site == "resid" else f"{site} (layer {layer})"


def _sites(sweep: pl.DataFrame) -> list[tuple[int, str]]:
    sites = sweep.filter(pl.col("site") != "lm").select("layer", "site").unique().rows()
    order = {"resid": 0, "final_ln_in": 1, "final_ln_out": 2}
    return sorted(sites, key=lambda s: (order.get(s[1], 3), s[0]))


def _rows(sweep, layer, site, **equal) -> pl.DataFrame:
    rows = sweep.filter((pl.col("layer") == layer) & (pl.col("site") == site))
    for column, value in equal.items():
        rows = rows.filter(pl.col(column) == value)
    return rows.sort("step")


def shares_figure(sweep: pl.DataFrame, path: Path) -> None:
    """Per site (columns) and measure (rows): semi-NMF and PCA shares against the random controls' band."""
    sites, rank = _sites(sweep), int(sweep["rank"].drop_nulls().min())
    measures = {"energy_share": "gradient energy share", "anisotropy_share": "gradient anisotropy share"}
    fig, axes = _grid(len(measures) * len(sites), len(sites), size=(3.2, 2.6))
    axes = list(axes)
    for row, (measure, label) in enumerate(measures.items()):
        for col, (layer, site) in enumerate(sites):
            ax = axes[row * len(sites) + col]
            part = _rows(sweep, layer, site, stratum="all", measure=measure, rank=rank)
            random = part.filter(pl.col("subspace") == "random")
            if random.height:
                mean, sd = random["control_mean"].to_numpy(), np.nan_to_num(random["control_sd"].to_numpy())
                ax.fill_between(random["step"], mean - 2 * sd, mean + 2 * sd, color="grey", alpha=0.3)
                ax.plot(random["step"], mean, color="grey", label="random (mean ± 2 sd)")
            for subspace, colour in (("seminmf", "tab:green"), ("pca", "tab:purple")):
                lines = part.filter(pl.col("subspace") == subspace)
                ax.plot(lines["step"], lines["value"], marker=".", color=colour, label=subspace)
            if part.height:
                ax.axhline(part["chance"][0], color="black", linestyle=":", linewidth=0.8, label="k / d")
            ax.set_title(_site_label(layer, site), fontsize=9)
            if col == 0:
                ax.set_ylabel(f"{label} (k = {rank})", fontsize=8)
            _step_axis(ax, sweep)
    axes[0].legend(fontsize=6)
    fig.suptitle(f"{_title(sweep)}: LM-loss gradient captured by activation subspaces vs random controls")
    _save(fig, path)


def strata_figure(sweep: pl.DataFrame, path: Path) -> None:
    """Per site (columns): the semi-NMF subspace's z against the controls, and isotropy, per frequency stratum."""
    sites, rank = _sites(sweep), int(sweep["rank"].drop_nulls().min())
    panels = {
        ("energy_share", "z"): "energy share: z vs random",
        ("anisotropy_share", "z"): "anisotropy share: z vs random",
        ("act_avg_cos", "value"): "activations avg_cos",
        ("act_isoscore", "value"): "activations IsoScore",
        ("grad_avg_cos", "value"): "gradients avg_cos",
    }
    fig, axes = _grid(len(panels) * len(sites), len(sites), size=(3.2, 2.4))
    axes = list(axes)
    for row, ((measure, column), label) in enumerate(panels.items()):
        for col, (layer, site) in enumerate(sites):
            ax = axes[row * len(sites) + col]
            part = _rows(sweep, layer, site, measure=measure)
            if column == "z":
                part = part.filter((pl.col("subspace") == "seminmf") & (pl.col("rank") == rank))
            for stratum, colour in STRATUM_COLOURS.items():
                lines = part.filter(pl.col("stratum") == stratum)
                ax.plot(lines["step"], lines[column], marker=".", color=colour, label=stratum)
            if row == 0:
                ax.set_title(_site_label(layer, site), fontsize=9)
            if col == 0:
                ax.set_ylabel(label, fontsize=8)
            _step_axis(ax, sweep)
    axes[0].legend(fontsize=6, title="token frequency", title_fontsize=6)
    fig.suptitle(f"{_title(sweep)}: tangent enrichment (semi-NMF, k = {rank}) and isotropy per frequency stratum")
    _save(fig, path)


def plot_gradients(sweep: pl.DataFrame, out_dir: Path) -> list[Path]:
    """Every figure of GRADIENT_FIGURES into `out_dir`."""
    _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, draw in zip(GRADIENT_FIGURES, (shares_figure, strata_figure), strict=True):
        draw(sweep, out_dir / name)
        paths.append(out_dir / name)
    return paths
