"""Figures of the gradient analysis, from gradients_sweep.parquet: shares per site, per stratum, the fixed
subspaces and the token-embedding change.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from anisweep.plots.kit import legend_beside, panel_grid, pyplot, save_figure, step_axis, sweep_title

#: the figures of one model, `figures/{name}`: the plot_gradients rule's outputs, in this order
GRADIENT_FIGURES = ("gradients.png", "gradients_strata.png")


#: with gradients.subspaces fixed | both, and with gradients.embedding_change
FIXED_FIGURE, EMBEDDING_FIGURE = "gradients_fixed.png", "embedding_change.png"


STRATUM_COLOURS = {"frequent": "tab:red", "middle": "tab:orange", "rare": "tab:blue"}


SUBSPACE_COLOURS = {"seminmf": "tab:green", "pca": "tab:purple", "pca_uncentred": "tab:brown"}


#: markers that keep coinciding lines apart (semi-NMF's subspace is often uncentred PCA's)
SUBSPACE_MARKERS = {"seminmf": "o", "pca": "s", "pca_uncentred": "x"}


#: a share whose z against the random controls is below this is drawn with an open marker: not distinguishable
#: from random subspaces of the same rank
SIGNIFICANT_Z = 2.0


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


def _fit_of(sweep: pl.DataFrame) -> str:
    """The fit the per-checkpoint figures draw: "checkpoint", or "fixed" where the sweep has no per-checkpoint
    shares (gradients.subspaces: fixed)."""
    if "fit" not in sweep.columns:
        return "checkpoint"
    shares = sweep.filter(pl.col("measure") == "energy_share")
    return "fixed" if shares.height and (shares["fit"] == "fixed").all() else "checkpoint"


def fit_window(sweep: pl.DataFrame) -> str | None:
    """The fixed subspaces' fit window as the rows name it (`window`, anisweep.tangent.fixed.window_label); None
    where the table does not carry it."""
    if "window" not in sweep.columns or "fit" not in sweep.columns:
        return None
    windows = sweep.filter(pl.col("fit") == "fixed")["window"].drop_nulls().unique().sort().to_list()
    return "; ".join(windows) or None


def _fixed_label(sweep: pl.DataFrame) -> str:
    window = fit_window(sweep)
    return f"fitted once on the pooled activations of {window}" if window else "fitted once on gradients.fit_window"


def _fit_description(sweep: pl.DataFrame, fit: str) -> str:
    return "fitted per checkpoint" if fit == "checkpoint" else f"held fixed, {_fixed_label(sweep)}"


def shares_figure(sweep: pl.DataFrame, path: Path) -> None:
    """Per site (columns) and measure (rows): semi-NMF and PCA shares against the random controls' band."""
    fit = _fit_of(sweep)
    title = f"LM-loss gradient captured by activation subspaces ({_fit_description(sweep, fit)}) vs random controls"
    _shares_panels(sweep, path, {fit: "-" if fit == "checkpoint" else "--"}, title)


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
                    if lines.height:
                        marker = {"marker": SUBSPACE_MARKERS[subspace], "markersize": 3}
                        ax.plot(lines["step"], lines["value"], style, **marker, color=colour, label=name)
            if part.height:
                ax.axhline(part["chance"].drop_nulls()[0], color="black", linestyle=":", linewidth=0.8, label="k / d")
            ax.set_title(_site_label(layer, site), fontsize=9)
            if col == 0:
                ax.set_ylabel(f"{label} (k = {rank})", fontsize=8)
            step_axis(ax, sweep)
    legend_beside(fig, axes, fontsize=8, handlelength=3)
    fig.suptitle(f"{sweep_title(sweep)}: {title}")
    save_figure(fig, path)


def strata_figure(sweep: pl.DataFrame, path: Path) -> None:
    """Per site (columns): the gradient's energy and anisotropy shares in the semi-NMF subspace per frequency
    stratum against chance k / d (open markers: z < SIGNIFICANT_Z against the random controls), and isotropy per
    stratum. Enrichment is read from the share (all strata of a site share k and d, so one chance line), never
    from z: z also scales with each stratum's control spread, which differs between strata."""
    sites, rank, fit = _sites(sweep), int(sweep["rank"].drop_nulls().min()), _fit_of(sweep)
    panels = {
        ("energy_share", "value"): "gradient energy share",
        ("anisotropy_share", "value"): "gradient anisotropy share",
        ("act_avg_cos", "value"): "activations: mean pairwise cosine",
        ("act_isoscore", "value"): "activations: IsoScore",
        ("grad_avg_cos", "value"): "gradients: mean pairwise cosine",
    }
    fig, axes = panel_grid(len(panels) * len(sites), len(sites), size=(3.2, 2.4))
    axes = list(axes)
    for row, ((measure, column), label) in enumerate(panels.items()):
        share = measure.endswith("_share")
        for col, (layer, site) in enumerate(sites):
            ax = axes[row * len(sites) + col]
            part = _rows(sweep, layer, site, all_fits=share, measure=measure)
            if share:
                part = part.filter((pl.col("subspace") == "seminmf") & (pl.col("rank") == rank))
                if "fit" in part.columns:
                    part = part.filter(pl.col("fit").fill_null("checkpoint") == fit)
            for stratum, colour in STRATUM_COLOURS.items():
                lines = part.filter(pl.col("stratum") == stratum)
                if not lines.height:
                    continue
                ax.plot(lines["step"], lines[column], marker="" if share else ".", color=colour, label=stratum)
                if share:
                    _significance_markers(ax, lines, colour)
            if share and part.height:
                ax.axhline(part["chance"].drop_nulls()[0], color="black", linestyle=":", linewidth=0.8)
                ax.set_ylim(bottom=0)
            if row == 0:
                ax.set_title(_site_label(layer, site), fontsize=9)
            if col == 0:
                ax.set_ylabel(label, fontsize=8)
            step_axis(ax, sweep)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        from matplotlib.lines import Line2D

        handles += [
            Line2D([], [], color="black", linestyle=":", linewidth=0.8),
            Line2D([], [], color="grey", marker="o", linestyle="", markerfacecolor="white", markersize=4),
        ]
        labels += ["chance k / d", f"z < {SIGNIFICANT_Z:g} vs random"]
        legend_beside(fig, axes, handles=handles, labels=labels, fontsize=8, title="token frequency")
    fig.suptitle(
        f"{sweep_title(sweep)}: gradient share in the semi-NMF subspace (k = {rank}, {_fit_description(sweep, fit)}, "
        "on all tokens) per frequency stratum vs chance k / d;\nenrichment = share above k / d (filled: z >= "
        f"{SIGNIFICANT_Z:g} vs random subspaces, open: not significant); isotropy per stratum below"
    )
    save_figure(fig, path)


def _significance_markers(ax, lines: pl.DataFrame, colour: str) -> None:
    """The share's points: filled where z >= SIGNIFICANT_Z, open where below (or unknown)."""
    z = lines["z"].fill_null(float("nan")).to_numpy()
    significant = np.nan_to_num(z, nan=-np.inf) >= SIGNIFICANT_Z
    steps, values = lines["step"].to_numpy(), lines["value"].to_numpy()
    ax.scatter(steps[significant], values[significant], s=14, color=colour, zorder=3)
    ax.scatter(steps[~significant], values[~significant], s=14, facecolors="white", edgecolors=colour, zorder=3)


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
    title = f"gradient in subspaces fitted per checkpoint (solid) vs held fixed (dashed: {_fixed_label(sweep)})"
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
                    marker = {"marker": SUBSPACE_MARKERS[subspace], "markersize": 3, "color": colour}
                    share_ax.plot(lines["step"], lines["value"], style, **marker, label=f"{subspace} ({fit})")
                    z_ax.plot(lines["step"], lines["z"], style, **marker)
        share_ax.axhline(part["chance"].drop_nulls()[0], color="black", linestyle=":", linewidth=0.8, label="k / d")
        z_ax.axhline(0, color="grey", linewidth=0.8)
        share_ax.set_title(f"{stratum} tokens", fontsize=9)
        for ax in (share_ax, z_ax):
            step_axis(ax, sweep)
        if col == 0:
            share_ax.set_ylabel(f"share of ΔE in layer-0 subspace (k = {rank})", fontsize=8)
            z_ax.set_ylabel("z vs random subspaces", fontsize=8)
    legend_beside(fig, axes, fontsize=8)
    fixed = f";\nfixed (dashed): {_fixed_label(sweep)}" if (change["fit"] == "fixed").any() else ""
    fig.suptitle(
        f"{sweep_title(sweep)}: token-embedding change from the previous analysed step vs layer-0 subspaces "
        f"(solid: fitted at the previous step){fixed}"
    )
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
