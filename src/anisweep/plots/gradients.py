"""Figures of the gradient analysis, from gradients_sweep.parquet: shares per site, per stratum, the fixed
subspaces and the token-embedding change.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from anisweep.plots.kit import panel_grid, pyplot, save_figure, step_axis, sweep_title

#: the figures of one model, `figures/{name}`: the plot_gradients rule's outputs, in this order
GRADIENT_FIGURES = ("gradients.png", "gradients_strata.png")


#: with gradients.subspaces fixed | both, and with gradients.embedding_change
FIXED_FIGURE, EMBEDDING_FIGURE = "gradients_fixed.png", "embedding_change.png"


STRATUM_COLOURS = {"frequent": "tab:red", "middle": "tab:orange", "rare": "tab:blue"}


SUBSPACE_COLOURS = {"seminmf": "tab:green", "pca": "tab:purple"}


def gradient_figures(settings: dict) -> list[str]:
    """The figures of one model under the config's gradients section, in the order plot_gradients draws them."""
    names = list(GRADIENT_FIGURES)
    if settings.get("subspaces", "per_checkpoint") != "per_checkpoint":
        names.append(FIXED_FIGURE)
    if settings.get("embedding_change", False):
        names.append(EMBEDDING_FIGURE)
    return names


def _site_label(layer, site) -> str:
    return f"layer {layer}" if site == "resid" else f"{site} (layer {layer})"


def _sites(sweep: pl.DataFrame) -> list[tuple[int, str]]:
    sites = sweep.filter(pl.col("site") != "lm").select("layer", "site").unique().rows()
    order = {"resid": 0, "final_ln_in": 1, "final_ln_out": 2}
    return sorted(sites, key=lambda s: (order.get(s[1], 3), s[0]))


def _rows(sweep, layer, site, all_fits: bool = False, **equal) -> pl.DataFrame:
    """The rows of one site with the given column values; the per-checkpoint fits only unless `all_fits`."""
    rows = sweep.filter((pl.col("layer") == layer) & (pl.col("site") == site))
    if "fit" in rows.columns and not all_fits:  # the per-checkpoint fits (and rows without a fit)
        rows = rows.filter(pl.col("fit").is_null() | (pl.col("fit") == "checkpoint"))
    if "step_from" in rows.columns:  # the embedding-change rows are drawn apart
        rows = rows.filter(pl.col("step_from").is_null())
    for column, value in equal.items():
        rows = rows.filter(pl.col(column) == value)
    return rows.sort("step")


def shares_figure(sweep: pl.DataFrame, path: Path) -> None:
    """Per site (columns) and measure (rows): semi-NMF and PCA shares against the random controls' band."""
    _shares_panels(
        sweep, path, {"checkpoint": "-"}, "LM-loss gradient captured by activation subspaces vs random controls"
    )


def _shares_panels(sweep: pl.DataFrame, path: Path, fits: dict[str, str], title: str) -> None:
    """The shares in the subspaces of each of `fits` (fit: line style) against the random controls' band."""
    sites, rank = _sites(sweep), int(sweep["rank"].drop_nulls().min())
    measures = {"energy_share": "gradient energy share", "anisotropy_share": "gradient anisotropy share"}
    fig, axes = panel_grid(len(measures) * len(sites), len(sites), size=(3.2, 2.6))
    axes = list(axes)
    for row, (measure, label) in enumerate(measures.items()):
        for col, (layer, site) in enumerate(sites):
            ax = axes[row * len(sites) + col]
            part = _rows(sweep, layer, site, all_fits=True, stratum="all", measure=measure, rank=rank)
            fit_of = pl.col("fit").fill_null("checkpoint") if "fit" in part.columns else pl.lit("checkpoint")
            part = part.with_columns(fit=fit_of)  # a table from before fixed subspaces has per-checkpoint fits only
            _band(ax, part.filter((pl.col("subspace") == "random") & (pl.col("fit") == next(iter(fits)))))
            for fit, style in fits.items():
                for subspace, colour in SUBSPACE_COLOURS.items():
                    lines = part.filter((pl.col("subspace") == subspace) & (pl.col("fit") == fit))
                    name = subspace if len(fits) == 1 else f"{subspace} ({fit})"
                    ax.plot(lines["step"], lines["value"], style, marker=".", color=colour, label=name)
            if part.height:
                ax.axhline(part["chance"].drop_nulls()[0], color="black", linestyle=":", linewidth=0.8, label="k / d")
            ax.set_title(_site_label(layer, site), fontsize=9)
            if col == 0:
                ax.set_ylabel(f"{label} (k = {rank})", fontsize=8)
            step_axis(ax, sweep)
    axes[0].legend(fontsize=6, handlelength=3)
    fig.suptitle(f"{sweep_title(sweep)}: {title}")
    save_figure(fig, path)


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
    fig, axes = panel_grid(len(panels) * len(sites), len(sites), size=(3.2, 2.4))
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
            step_axis(ax, sweep)
    axes[0].legend(fontsize=6, title="token frequency", title_fontsize=6)
    fig.suptitle(f"{sweep_title(sweep)}: tangent enrichment (semi-NMF, k = {rank}) and isotropy per frequency stratum")
    save_figure(fig, path)


def _band(ax, random: pl.DataFrame, x: str = "step", label: str = "random (mean ± 2 sd)") -> None:
    if random.height:
        mean, sd = random["control_mean"].to_numpy(), np.nan_to_num(random["control_sd"].to_numpy())
        ax.fill_between(random[x], mean - 2 * sd, mean + 2 * sd, color="grey", alpha=0.3)
        ax.plot(random[x], mean, color="grey", label=label)


def fixed_figure(sweep: pl.DataFrame, path: Path) -> None:
    """Per site (columns) and measure (rows): shares in the subspaces fitted per checkpoint (solid) and in those
    fitted once on the early window and held fixed (dashed), against the random controls' band."""
    if "fit" not in sweep.columns or not (sweep["fit"] == "fixed").any():
        raise ValueError(f"{path.name}: the gradient sweep has no fixed-subspace rows (gradients.subspaces: both)")
    title = "gradient in subspaces fitted per checkpoint (solid) vs fixed early (dashed)"
    _shares_panels(sweep, path, {"checkpoint": "-", "fixed": "--"}, title)


def embedding_figure(sweep: pl.DataFrame, path: Path) -> None:
    """Per stratum (columns): the share of the token-embedding change ΔE = E(t2) - E(t1) in the layer-0
    subspaces (at t1, solid; fixed, dashed) against random subspaces, at t2; below, z against the controls."""
    change = sweep.filter(pl.col("measure") == "embedding_change_share") if "step_from" in sweep.columns else None
    if change is None or not change.height:
        raise ValueError(f"{path.name}: the gradient sweep has no embedding-change rows (gradients.embedding_change)")
    rank = int(change["rank"].min())
    change = change.filter(pl.col("rank") == rank).sort("step")
    strata = [s for s in ("all", *STRATUM_COLOURS) if (change["stratum"] == s).any()]
    fig, axes = panel_grid(2 * len(strata), len(strata), size=(3.2, 2.6))
    axes = list(axes)
    for col, stratum in enumerate(strata):
        part = change.filter(pl.col("stratum") == stratum)
        share_ax, z_ax = axes[col], axes[len(strata) + col]
        _band(share_ax, part.filter(pl.col("subspace") == "random"))
        for fit, style in (("checkpoint", "-"), ("fixed", "--")):
            for subspace, colour in SUBSPACE_COLOURS.items():
                lines = part.filter((pl.col("subspace") == subspace) & (pl.col("fit") == fit))
                if lines.height:
                    share_ax.plot(
                        lines["step"], lines["value"], style, marker=".", color=colour, label=f"{subspace} ({fit})"
                    )
                    z_ax.plot(lines["step"], lines["z"], style, marker=".", color=colour)
        share_ax.axhline(part["chance"].drop_nulls()[0], color="black", linestyle=":", linewidth=0.8, label="k / d")
        z_ax.axhline(0, color="grey", linewidth=0.8)
        share_ax.set_title(f"{stratum} tokens", fontsize=9)
        for ax in (share_ax, z_ax):
            step_axis(ax, sweep)
        if col == 0:
            share_ax.set_ylabel(f"share of ΔE in layer-0 subspace (k = {rank})", fontsize=8)
            z_ax.set_ylabel("z vs random subspaces", fontsize=8)
    axes[0].legend(fontsize=6)
    fig.suptitle(f"{sweep_title(sweep)}: token-embedding change from the previous analysed step vs layer-0 subspaces")
    save_figure(fig, path)


DRAW = {
    "gradients.png": shares_figure,
    "gradients_strata.png": strata_figure,
    FIXED_FIGURE: fixed_figure,
    EMBEDDING_FIGURE: embedding_figure,
}


def plot_gradients(sweep: pl.DataFrame, out_dir: Path, names: list[str] | None = None) -> list[Path]:
    """The figures `names` (default: GRADIENT_FIGURES, and the fixed / embedding-change ones where the sweep
    has their rows) into `out_dir`."""
    pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    if not names:
        names = list(GRADIENT_FIGURES)
        if "fit" in sweep.columns and (sweep["fit"] == "fixed").any():
            names.append(FIXED_FIGURE)
        if "step_from" in sweep.columns and sweep["step_from"].is_not_null().any():
            names.append(EMBEDDING_FIGURE)
    unknown = sorted(set(names) - set(DRAW))
    if unknown:
        raise ValueError(f"plot-gradients: unknown figures {unknown}; choose among {sorted(DRAW)}")
    paths = []
    for name in names:
        DRAW[name](sweep, out_dir / name)
        paths.append(out_dir / name)
    return paths
