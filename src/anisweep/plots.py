"""Figures of one sweep (per model) and of a family (models compared), from sweep.parquet only.

The x axis is the optimizer step, symlog-scaled when the grid spans orders of magnitude (step 0 stays
on the axis), with tokens seen on a secondary axis on top.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from .atomic import replacing
from .sweep import analysed

ISOTROPY_METRICS = ("avg_cos", "centred_avg_cos", "drift_ratio", "isoscore", "top_eig_share")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _select(sweep: pl.DataFrame, metric: str, site: str | None = None, per_head: bool = False) -> pl.DataFrame:
    rows = sweep.filter(pl.col("metric") == metric)
    if site is not None:
        rows = rows.filter(pl.col("site") == site)
    rows = rows.filter(pl.col("head").is_not_null() if per_head else pl.col("head").is_null())
    return rows.sort("step")


def _log_spaced(steps) -> bool:
    nonzero = [s for s in steps if s > 0]
    return len(nonzero) >= 3 and max(nonzero) / min(nonzero) >= 100


def _human(n: float) -> str:
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"


def _step_axis(ax, sweep: pl.DataFrame, label: bool = True) -> None:
    """Steps below (symlog for log-spaced grids, from 0), tokens seen above at the same ticks.

    Call after plotting: the top axis copies the finished limits and ticks.
    """
    from matplotlib.ticker import FuncFormatter, NullLocator

    steps = sweep["step"].unique().to_list()
    scale = {}
    if _log_spaced(steps):
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
        top.xaxis.set_major_formatter(FuncFormatter(lambda s, _: _human(s * tokens)))
        top.set_xlabel("tokens seen", fontsize=8)
        top.tick_params(labelsize=7)


def _lines_by(ax, rows: pl.DataFrame, by: str, label_fmt: str, cmap: str = "viridis") -> None:
    plt = _pyplot()
    groups = sorted(rows[by].unique().drop_nulls().to_list())
    colours = plt.get_cmap(cmap)(np.linspace(0, 0.9, max(len(groups), 1)))
    for colour, group in zip(colours, groups):
        part = rows.filter(pl.col(by) == group).sort("step")
        ax.plot(part["step"], part["value"], marker=".", color=colour, label=label_fmt.format(group))


def _title(sweep: pl.DataFrame) -> str:
    return f"{sweep['family'][0]} / {sweep['model'][0]}"


def _save(fig, path: Path) -> None:
    try:
        with replacing(path, keep_suffix=True) as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight")
    finally:
        _pyplot().close(fig)


def _grid(n: int, ncols: int, size=(3.4, 2.8)):
    plt = _pyplot()
    nrows = int(np.ceil(n / ncols))
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False, constrained_layout=True
    )
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes.flat


def _per_head_panels(sweep: pl.DataFrame, path: Path, rows_spec: list[tuple[str, str, str]], title: str) -> None:
    """A row of panels per (metric, site, y label) in `rows_spec`, a panel per layer, a line per head."""
    rows_spec = [(m, site, label) for m, site, label in rows_spec if _select(sweep, m, site, per_head=True).height]
    rotary = "qk_post" in _qk_sites(sweep)
    if not rows_spec:
        _not_measured(sweep, path, title)
        return
    layers = sorted(
        sweep.filter(pl.col("head").is_not_null() & pl.col("site").str.starts_with("qk_"))["layer"].unique()
    )
    plt = _pyplot()
    fig, axes = plt.subplots(
        len(rows_spec),
        len(layers),
        figsize=(3.0 * len(layers), 2.6 * len(rows_spec)),
        squeeze=False,
        sharey="row",
        constrained_layout=True,
    )
    for i, (metric, site, label) in enumerate(rows_spec):
        rows = _select(sweep, metric, site, per_head=True)
        for j, layer in enumerate(layers):
            ax = axes[i, j]
            _lines_by(ax, rows.filter(pl.col("layer") == layer), "head", "head {}", "tab10")
            ax.axhline(0, color="grey", lw=0.5)
            ax.set_title(
                f"layer {layer}, {site.removeprefix('qk_')}-rotary" if rotary else f"layer {layer}", fontsize=9
            )
            _step_axis(ax, sweep, label=i == len(rows_spec) - 1)
        axes[i, 0].set_ylabel(label)
    axes[0, -1].legend(fontsize=6, ncol=2)
    fig.suptitle(f"{_title(sweep)}: {title}")
    _save(fig, path)


def _not_measured(sweep: pl.DataFrame, path: Path, what: str) -> None:
    """A figure saying so, for metrics a sweep lacks (metrics computed before they were added): rerun metrics."""
    fig, axes = _grid(1, 1)
    axes[0].text(0.5, 0.5, f"{what}:\nnot in this sweep's metrics", ha="center", va="center")
    axes[0].set_axis_off()
    fig.suptitle(_title(sweep))
    _save(fig, path)


def _qk_sites(sweep: pl.DataFrame) -> list[str]:
    return sorted(sweep.filter(pl.col("site").str.starts_with("qk_"))["site"].unique().to_list(), reverse=True)


def qk_alignment(sweep: pl.DataFrame, path: Path) -> None:
    """A panel per layer (and per rope variant), a line per head: signed cos(q_mean, k_mean) vs step."""
    spec = [("qk_cos", site, "cos(mean q, mean k)") for site in _qk_sites(sweep)]
    _per_head_panels(sweep, path, spec, "query-key mean alignment per head")


def qk_mean_dot(sweep: pl.DataFrame, path: Path) -> None:
    """Per head: the unscaled <mean q, mean k> (Godey Fig. 14) and the same over sqrt(d_head)."""
    spec = []
    for site in _qk_sites(sweep):
        spec += [("qk_mean_dot", site, "<mean q, mean k>"), ("qk_mean_score", site, "<mean q, mean k> / sqrt(d_head)")]
    _per_head_panels(sweep, path, spec, "scalar product of the mean query and mean key per head")


def qk_cos_concat(sweep: pl.DataFrame, path: Path) -> None:
    """Per layer: cos of the mean queries and keys concatenated over heads (Godey Fig. 23), pre/post rotary."""
    sites = [site for site in _qk_sites(sweep) if _select(sweep, "qk_cos_concat", site).height]
    if not sites:
        _not_measured(sweep, path, "qk_cos_concat")
        return
    fig, axes = _grid(len(sites), len(sites), size=(4.2, 3.2))
    for ax, site in zip(axes, sites):
        _lines_by(ax, _select(sweep, "qk_cos_concat", site), "layer", "layer {}")
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_ylim(-1.05, 1.05)
        ax.set_title(f"{site.removeprefix('qk_')}-rotary" if len(sites) > 1 else "", fontsize=9)
        ax.set_ylabel("cos(concat mean q, concat mean k)")
        _step_axis(ax, sweep)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{_title(sweep)}: mean query vs mean key, heads concatenated, per layer")
    _save(fig, path)


def _lines_per_layer(
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
    fig, axes = _grid(len(panels), ncols)
    for ax, (metric, label) in zip(axes, panels.items()):
        if metric in (bands or {}):
            low, high, band_label = bands[metric]
            ax.axhspan(low, high, color="grey", alpha=0.2, lw=0, label=band_label)
        _lines_by(ax, _select(sweep, metric, site), "layer", "layer {}")
        ax.set_ylabel(label)
        if metric in log_y:
            ax.set_yscale("log")
        _step_axis(ax, sweep)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{_title(sweep)}: {title}")
    _save(fig, path)


def attention_entropy(sweep: pl.DataFrame, path: Path) -> None:
    panels = {"entropy_mean": "entropy (nats)", "entropy_norm_mean": "entropy / log(visible keys)"}
    _lines_per_layer(sweep, path, "attention", panels, "attention entropy per layer (mean over heads)", ncols=2)


def attention_softmax(sweep: pl.DataFrame, path: Path) -> None:
    panels = {
        "p_max_mean": "p max",
        "p_median_mean": "p median",
        "p_min_mean": "p min",
        "score_mean": "score mean",
        "score_std": "score std",
    }
    _lines_per_layer(
        sweep,
        path,
        "attention",
        panels,
        "softmax max / median / min and pre-softmax scores",
        log_y=("p_max_mean", "p_median_mean", "p_min_mean"),
    )


def isotropy(sweep: pl.DataFrame, path: Path) -> None:
    from .geometry import isotropic_cos_spread  # here: geometry imports scipy, and the Snakefile imports plots

    panels = {metric: metric for metric in ISOTROPY_METRICS}
    dims = _select(sweep, "dim", "resid")["value"].drop_nulls()
    bands = {}
    if len(dims):  # the cosine spread of an isotropic normal cloud of the residual stream's dimension
        spread = isotropic_cos_spread(int(dims.max()))
        band = (-spread, spread, f"isotropic N(0, I_d): cos 0 +- 1/sqrt(d), d = {int(dims.max())}")
        bands = {"avg_cos": band, "centred_avg_cos": band}
    _lines_per_layer(
        sweep, path, "resid", panels, "isotropy of the residual stream per layer (0 = embeddings)", bands=bands
    )


def isotropy_heatmap(sweep: pl.DataFrame, path: Path) -> None:
    fig, axes = _grid(2, 2, size=(4.2, 3.2))
    for ax, metric in zip(axes, ("avg_cos", "drift_ratio")):
        rows = _select(sweep, metric, "resid")
        table = rows.pivot(on="step", index="layer", values="value", aggregate_function="first").sort("layer")
        steps = [c for c in table.columns if c != "layer"]
        image = ax.imshow(table.select(steps).to_numpy(), aspect="auto", origin="lower", cmap="magma")
        ax.set_xticks(range(len(steps)), steps, rotation=90, fontsize=7)
        ax.set_yticks(range(table.height), table["layer"].to_list())
        ax.set_xlabel("optimizer step (checkpoints, evenly spaced)")
        ax.set_ylabel("layer")
        ax.set_title(metric)
        fig.colorbar(image, ax=ax)
    fig.suptitle(f"{_title(sweep)}: layer x checkpoint")
    _save(fig, path)


def final_layernorm(sweep: pl.DataFrame, path: Path) -> None:
    fig, axes = _grid(len(ISOTROPY_METRICS), 3)
    for ax, metric in zip(axes, ISOTROPY_METRICS):
        for site, style, label in (("final_ln_in", "--", "before final LN"), ("final_ln_out", "-", "after final LN")):
            rows = _select(sweep, metric, site)
            ax.plot(rows["step"], rows["value"], style, marker=".", label=label)
        ax.set_ylabel(metric)
        _step_axis(ax, sweep)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{_title(sweep)}: the residual stream just before and after the final LayerNorm")
    _save(fig, path)


def layernorm_params(sweep: pl.DataFrame, path: Path) -> None:
    panels = [("final_ln", m) for m in ("gain_mean", "gain_std", "bias_norm", "bias_drift_share")]
    fig, axes = _grid(len(panels) + 1, 3)
    for ax, (site, metric) in zip(axes, panels):
        rows = _select(sweep, metric, site)
        ax.plot(rows["step"], rows["value"], marker=".")
        ax.set_ylabel(f"final LN {metric.replace('_', ' ')}")
        _step_axis(ax, sweep)
    ax = axes[len(panels)]
    for site in ("embed_in", "embed_out"):
        for metric, style, label in (
            ("partition_isotropy", "-", ""),
            ("partition_isotropy_centred", "--", " centred"),
            ("partition_isotropy_mm", ":", " one-sign (M&M)"),
            ("partition_isotropy_mm_centred", "-.", " centred one-sign (M&M)"),
        ):
            rows = _select(sweep, metric, site)
            if rows.height:
                ax.plot(rows["step"], rows["value"], style, marker=".", label=site + label)
    ax.set_yscale("log")
    ax.set_ylabel("I(W)")
    ax.legend(fontsize=7)
    _step_axis(ax, sweep)
    fig.suptitle(f"{_title(sweep)}: final LayerNorm parameters and embedding isotropy I(W)")
    _save(fig, path)


def drift_vs_anisotropy(sweep: pl.DataFrame, path: Path) -> None:
    fig, axes = _grid(3, 3, size=(4.2, 3.2))
    ax = axes[0]
    for name in ("spearman", "pearson"):
        rows = _select(sweep, f"drift_avg_cos_{name}_r", "resid")
        ax.plot(rows["step"], rows["value"], marker=".", label=name)
    ax.set_ylabel("correlation over layers")
    ax.set_ylim(-1.05, 1.05)
    ax.legend(fontsize=7)
    _step_axis(ax, sweep)
    ax = axes[1]
    for name in ("spearman", "pearson"):
        rows = _select(sweep, f"drift_avg_cos_{name}_p", "resid")
        ax.plot(rows["step"], rows["value"], marker=".", label=name)
    ax.axhline(0.05, color="red", lw=0.8, ls="--", label="p = 0.05")
    ax.set_yscale("log")
    ax.set_ylabel("two-sided permutation p")
    ax.legend(fontsize=7)
    _step_axis(ax, sweep)
    ax = axes[2]
    drift = _select(sweep, "drift_norm", "resid").select("step", "layer", pl.col("value").alias("drift"))
    cos = _select(sweep, "avg_cos", "resid").select("step", "layer", pl.col("value").alias("avg_cos"))
    joined = drift.join(cos, on=["step", "layer"])
    steps = sorted(joined["step"].unique().to_list())
    plt = _pyplot()
    picks = sorted({steps[0], steps[len(steps) // 2], steps[-1]})
    for colour, step in zip(plt.get_cmap("viridis")(np.linspace(0, 0.9, len(picks))), picks):
        part = joined.filter(pl.col("step") == step).sort("layer")
        ax.plot(part["drift"], part["avg_cos"], "-o", color=colour, ms=3, label=f"step {step}")
    ax.set_xlabel("drift norm ||mean x||")
    ax.set_ylabel("avg cos")
    ax.legend(fontsize=7)
    fig.suptitle(f"{_title(sweep)}: drift vs anisotropy across layers")
    _save(fig, path)


def norms(sweep: pl.DataFrame, path: Path) -> None:
    """Spread of token norms (std / mean) just before and after each LayerNorm, averaged over layers."""
    around_layernorm = pl.col("site").str.starts_with("ln_") | pl.col("site").str.starts_with("final_ln")
    rows = sweep.filter((pl.col("metric") == "norm_cv") & around_layernorm)
    fig, axes = _grid(2, 2)
    for ax, suffix, title in zip(axes, ("_in", "_out"), ("before each LayerNorm", "after each LayerNorm")):
        part = rows.filter(pl.col("site").str.ends_with(suffix)).group_by("step", "site").agg(pl.col("value").mean())
        part = part.with_columns(pl.col("site").str.strip_suffix(suffix))
        _lines_by(ax, part, "site", "{}", "tab10")
        ax.set_ylabel("norm std / mean")
        ax.set_title(title, fontsize=9)
        _step_axis(ax, sweep)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{_title(sweep)}: the hypersphere: spread of token norms around each LayerNorm")
    _save(fig, path)


PLOTTERS = {
    "qk_alignment.png": qk_alignment,
    "qk_mean_dot.png": qk_mean_dot,
    "qk_cos_concat.png": qk_cos_concat,
    "attention_entropy.png": attention_entropy,
    "attention_softmax.png": attention_softmax,
    "isotropy.png": isotropy,
    "isotropy_heatmap.png": isotropy_heatmap,
    "final_layernorm.png": final_layernorm,
    "layernorm_params.png": layernorm_params,
    "drift_vs_anisotropy.png": drift_vs_anisotropy,
    "norms.png": norms,
}
MODEL_FIGURES = tuple(PLOTTERS)  # per model, drawn in this order; the plot rules' outputs


def plot_model(sweep: pl.DataFrame, out_dir: Path) -> list[Path]:
    sweep = analysed(sweep)
    paths = []
    for name, plotter in PLOTTERS.items():
        plotter(sweep, Path(out_dir) / name)
        paths.append(Path(out_dir) / name)
    return paths


FAMILY_SITES = {"final_ln_in": "before the final LayerNorm", "final_ln_out": "after the final LayerNorm"}


def plot_family(sweeps: pl.DataFrame, path: Path) -> None:
    """Models of one family side by side against tokens seen (steps when a model has no token count).

    Every panel shows one named site, the same for every model: the last residual layer is before the final
    LayerNorm in GPT-NeoX and after it in BERT, so the panels use final_ln_in / final_ln_out instead.
    Query-key alignment is pre-rotary (solid) for every model, post-rotary (dashed) where it exists.
    """
    sweeps = analysed(sweeps)

    def at_site(metric: str, site: str):
        return lambda s: s.filter((pl.col("metric") == metric) & (pl.col("site") == site) & pl.col("head").is_null())

    def mean_over_layers(metric: str, site: str):
        return lambda s: at_site(metric, site)(s).group_by("model", "step", "tokens_seen").agg(pl.col("value").mean())

    panels = [
        (f"{label} at {site}\n({where})", [(at_site(metric, site), "-", "")])
        for metric, label in (("avg_cos", "avg cos"), ("isoscore", "IsoScore"))
        for site, where in FAMILY_SITES.items()
    ]
    panels += [
        (
            "normalised attention entropy\n(mean over heads and layers)",
            [(mean_over_layers("entropy_norm_mean", "attention"), "-", "")],
        ),
        (
            "|qk cos|, mean over heads and layers\n(qk_pre: pre-rotary, qk_post: post-rotary)",
            [
                (mean_over_layers("qk_cos_abs_mean", "qk_pre"), "-", " qk_pre"),
                (mean_over_layers("qk_cos_abs_mean", "qk_post"), "--", " qk_post"),
            ],
        ),
        (
            "cos of the means concatenated over heads\n(mean over layers; across seeds: Godey Fig. 23)",
            [
                (mean_over_layers("qk_cos_concat", "qk_pre"), "-", " qk_pre"),
                (mean_over_layers("qk_cos_concat", "qk_post"), "--", " qk_post"),
            ],
        ),
    ]
    plt = _pyplot()
    models = sorted(sweeps["model"].unique().to_list())
    colours = dict(zip(models, plt.get_cmap("tab10")(np.arange(len(models)) % 10)))
    fig, axes = _grid(len(panels), 2, size=(4.2, 3.2))
    for ax, (label, lines) in zip(axes, panels):
        for model in models:
            for pick, style, suffix in lines:
                rows = pick(sweeps.filter(pl.col("model") == model)).sort("step")
                if rows.height == 0:
                    continue
                x = rows["tokens_seen"] if rows["tokens_seen"].null_count() == 0 else rows["step"]
                ax.plot(x, rows["value"], style, marker=".", color=colours[model], label=model + suffix)
        ax.set_xscale(
            "symlog", linthresh=max(1.0, float(sweeps.filter(pl.col("tokens_seen") > 0)["tokens_seen"].min() or 1))
        )
        ax.set_xlabel("tokens seen")
        ax.set_ylabel(label, fontsize=8)
    axes[0].legend(fontsize=7)
    axes[len(panels) - 1].legend(fontsize=6)
    fig.suptitle(f"{sweeps['family'][0]}: models compared over training, each panel at one named site")
    _save(fig, path)
