"""Figures of one sweep (per model) and of a family (models compared), from sweep.parquet only.

The x axis is the optimizer step, symlog-scaled when the grid spans orders of magnitude (step 0 stays
on the axis), with tokens seen on a secondary axis on top.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from anisweep.measures.registry import builtin_figures
from anisweep.measures.sweep import analysed
from anisweep.plots import outliers
from anisweep.plots.intervals import attach, band, group_curves
from anisweep.plots.kit import (
    legend_beside,
    lines_by,
    lines_per_layer,
    metric_words,
    not_measured,
    panel_grid,
    per_head_panels,
    progress_axis,
    pyplot,
    qk_sites,
    save_figure,
    select_rows,
    set_progress_scale,
    step_axis,
    sweep_title,
)

ISOTROPY_METRICS = ("avg_cos", "centred_avg_cos", "drift_ratio", "isoscore", "top_eig_share")


def qk_alignment(sweep: pl.DataFrame, path: Path) -> None:
    """A panel per layer (and per rope variant), a line per head: signed cos(q_mean, k_mean) vs step."""
    spec = [("qk_cos", site, "cos(mean q, mean k)") for site in qk_sites(sweep)]
    per_head_panels(sweep, path, spec, "query-key mean alignment per head")


def qk_mean_dot(sweep: pl.DataFrame, path: Path) -> None:
    """Per head: the unscaled <mean q, mean k> (Godey Fig. 14) and the same over sqrt(d_head)."""
    spec = []
    for site in qk_sites(sweep):
        spec += [("qk_mean_dot", site, "<mean q, mean k>"), ("qk_mean_score", site, "<mean q, mean k> / sqrt(d_head)")]
    per_head_panels(sweep, path, spec, "scalar product of the mean query and mean key per head")


def qk_cos_concat(sweep: pl.DataFrame, path: Path) -> None:
    """Per layer: cos of the mean queries and keys concatenated over heads (Godey Fig. 23), pre/post rotary."""
    sites = [site for site in qk_sites(sweep) if select_rows(sweep, "qk_cos_concat", site).height]
    if not sites:
        not_measured(sweep, path, "qk_cos_concat")
        return
    fig, axes = panel_grid(len(sites), len(sites), size=(4.2, 3.2))
    for ax, site in zip(axes, sites):
        lines_by(ax, select_rows(sweep, "qk_cos_concat", site), "layer", "layer {}")
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_ylim(-1.05, 1.05)
        ax.set_title(f"{site.removeprefix('qk_')}-rotary" if len(sites) > 1 else "", fontsize=9)
        ax.set_ylabel("cos(concat mean q, concat mean k)")
        step_axis(ax, sweep)
    legend_beside(fig, axes, fontsize=9)
    fig.suptitle(f"{sweep_title(sweep)}: mean query vs mean key, heads concatenated, per layer")
    save_figure(fig, path)


def attention_entropy(sweep: pl.DataFrame, path: Path) -> None:
    panels = {"entropy_mean": "entropy (nats)", "entropy_norm_mean": "entropy / log(visible keys)"}
    lines_per_layer(sweep, path, "attention", panels, "attention entropy per layer (mean over heads)", ncols=2)


def pooled_score_std(sweep: pl.DataFrame) -> pl.DataFrame | None:
    """Per layer and step: the standard deviation of the pre-softmax scores pooled over the layer's heads and all
    their visible pairs, from the per-head score_mean and score_std (population): every head of a layer sees the
    same (query, key) pairs, so the pooled variance is mean_h var_h + mean_h (m_h - mean_h m_h)^2 (the spread of
    the means about their mean: mean_h m_h^2 - (mean_h m_h)^2 would cancel where a bias lifts every score). The
    per-layer score_std row is instead the mean over heads of the per-head stds, a few per cent lower. None
    where the sweep has no per-head rows."""
    scores = pl.col("metric").is_in(["score_mean", "score_std"])
    heads = sweep.filter((pl.col("site") == "attention") & pl.col("head").is_not_null() & scores)
    if not heads.height:
        return None
    wide = heads.pivot(on="metric", index=["step", "tokens_seen", "layer", "head"], values="value")
    pooled = wide.group_by("step", "tokens_seen", "layer").agg(
        ((pl.col("score_std") ** 2).mean() + ((pl.col("score_mean") - pl.col("score_mean").mean()) ** 2).mean())
        .sqrt()
        .alias("value")
    )
    return pooled.sort("layer", "step")


def attention_softmax(sweep: pl.DataFrame, path: Path) -> None:
    """Softmax probabilities' max / median / min, the scores' mean, and their std pooled over the heads of a
    layer (the mean of the per-head stds where the sweep has no per-head rows, labelled so)."""
    pooled = pooled_score_std(sweep)
    panels = {
        "p_max_mean": "largest probability",
        "p_median_mean": "median probability",
        "p_min_mean": "smallest probability",
        "score_mean": "score mean, over heads and pairs",
        "score_std": "score std, pooled over heads and pairs"
        if pooled is not None
        else "score std: mean of the heads' stds",
    }
    lines_per_layer(
        sweep,
        path,
        "attention",
        panels,
        "softmax max / median / min (means over query rows) and pre-softmax scores",
        log_y=("p_max_mean", "p_median_mean", "p_min_mean"),
        derived={"score_std": lambda _: pooled} if pooled is not None else None,
    )


def isotropy(sweep: pl.DataFrame, path: Path) -> None:
    panels = {metric: metric_words(metric) for metric in ISOTROPY_METRICS}
    dims = select_rows(sweep, "dim", "resid")["value"].drop_nulls()
    bands = {}
    if len(dims):  # the cosine spread of an isotropic normal cloud of the residual stream's dimension
        spread = 1.0 / np.sqrt(int(dims.max()))  # geometry.isotropic_cos_spread, whose module imports scipy (1 s)
        band = (-spread, spread, f"isotropic N(0, I_d): cos 0 +- 1/sqrt(d), d = {int(dims.max())}")
        bands = {"avg_cos": band, "centred_avg_cos": band}
    lines_per_layer(
        sweep,
        path,
        "resid",
        panels,
        "isotropy of the residual stream per layer (0: the stream entering the first block)",
        bands=bands,
    )


def isotropy_heatmap(sweep: pl.DataFrame, path: Path) -> None:
    fig, axes = panel_grid(2, 2, size=(4.2, 3.2))
    for ax, metric in zip(axes, ("avg_cos", "drift_ratio")):
        rows = select_rows(sweep, metric, "resid")
        table = rows.pivot(on="step", index="layer", values="value", aggregate_function="first").sort("layer")
        steps = [c for c in table.columns if c != "layer"]
        image = ax.imshow(table.select(steps).to_numpy(), aspect="auto", origin="lower", cmap="magma")
        ax.set_xticks(range(len(steps)), steps, rotation=90, fontsize=8)
        ax.set_yticks(range(table.height), table["layer"].to_list())
        ax.set_xlabel("optimizer step (checkpoints, evenly spaced)")
        ax.set_ylabel("layer")
        ax.set_title(metric_words(metric), fontsize=10)
        fig.colorbar(image, ax=ax)
    fig.suptitle(f"{sweep_title(sweep)}: layer x checkpoint")
    save_figure(fig, path)


def final_layernorm(sweep: pl.DataFrame, path: Path) -> None:
    fig, axes = panel_grid(len(ISOTROPY_METRICS), 3)
    for ax, metric in zip(axes, ISOTROPY_METRICS):
        for site, style, label in (("final_ln_in", "--", "before final LN"), ("final_ln_out", "-", "after final LN")):
            rows = select_rows(sweep, metric, site)
            (line,) = ax.plot(rows["step"], rows["value"], style, marker=".", label=label)
            band(ax, rows["step"], rows, line.get_color())
        ax.set_ylabel(metric_words(metric))
        step_axis(ax, sweep)
    legend_beside(fig, axes, fontsize=9)
    fig.suptitle(f"{sweep_title(sweep)}: the residual stream just before and after the final LayerNorm")
    save_figure(fig, path)


#: the I(W) lines (metric, style, label): sign-free first, the primary value (well defined); Machina & Mercer's
#: one-sign convention depends on the eigensolver's signs (LAPACK build, precision) and is drawn thin and faint
PARTITION_ISOTROPY_LINES = (
    ("partition_isotropy", "-", "sign-free"),
    ("partition_isotropy_centred", "--", "centred, sign-free"),
    ("partition_isotropy_mm", ":", "one-sign (M&M), solver-dependent"),
    ("partition_isotropy_mm_centred", "-.", "centred one-sign (M&M), solver-dependent"),
)


def layernorm_params(sweep: pl.DataFrame, path: Path) -> None:
    panels = [("final_ln", m) for m in ("gain_mean", "gain_std", "bias_norm", "bias_drift_share")]
    fig, axes = panel_grid(len(panels) + 1, 3)
    for ax, (site, metric) in zip(axes, panels):
        rows = select_rows(sweep, metric, site)
        ax.plot(rows["step"], rows["value"], marker=".")
        ax.set_ylabel(f"final LN {metric.replace('_', ' ')}")
        step_axis(ax, sweep)
    ax = axes[len(panels)]
    for site, colour in (("embed_in", "tab:blue"), ("embed_out", "tab:orange")):
        for metric, style, label in PARTITION_ISOTROPY_LINES:
            rows = select_rows(sweep, metric, site)
            if rows.height:
                solver_dependent = metric.startswith("partition_isotropy_mm")
                look = {"lw": 0.9, "alpha": 0.6} if solver_dependent else {"marker": "."}
                ax.plot(rows["step"], rows["value"], style, color=colour, label=f"{site}, {label}", **look)
    ax.set_yscale("log")
    ax.set_ylabel("partition isotropy I(W)")
    step_axis(ax, sweep)
    legend_beside(fig, axes, ax, fontsize=8)
    fig.suptitle(f"{sweep_title(sweep)}: final LayerNorm parameters and embedding isotropy I(W)")
    save_figure(fig, path)


def drift_vs_anisotropy(sweep: pl.DataFrame, path: Path) -> None:
    fig, axes = panel_grid(3, 3, size=(4.2, 3.2))
    ax = axes[0]
    for name in ("spearman", "pearson"):
        rows = select_rows(sweep, f"drift_avg_cos_{name}_r", "resid")
        ax.plot(rows["step"], rows["value"], marker=".", label=name)
    ax.set_ylabel("correlation over layers")
    ax.set_ylim(-1.05, 1.45)  # the legend above 1, where no correlation can be
    ax.set_yticks([-1, -0.5, 0, 0.5, 1])
    ax.legend(fontsize=7, loc="upper center", ncol=2)
    step_axis(ax, sweep)
    ax = axes[1]
    for name in ("spearman", "pearson"):
        rows = select_rows(sweep, f"drift_avg_cos_{name}_p", "resid")
        ax.plot(rows["step"], rows["value"], marker=".", label=name)
    ax.axhline(0.05, color="red", lw=0.8, ls="--", label="p = 0.05")
    ax.set_yscale("log")
    ax.set_ylabel("two-sided permutation p (drawn; the t-test p\nof Godey et al. is in *_p_ttest)", fontsize=8)
    ax.legend(fontsize=7)
    step_axis(ax, sweep)
    ax = axes[2]
    drift = select_rows(sweep, "drift_norm", "resid").select("step", "layer", pl.col("value").alias("drift"))
    cos = select_rows(sweep, "avg_cos", "resid").select("step", "layer", pl.col("value").alias("avg_cos"))
    joined = drift.join(cos, on=["step", "layer"])
    steps = sorted(joined["step"].unique().to_list())
    plt = pyplot()
    picks = sorted({steps[0], steps[len(steps) // 2], steps[-1]})
    for colour, step in zip(plt.get_cmap("viridis")(np.linspace(0, 0.9, len(picks))), picks):
        part = joined.filter(pl.col("step") == step).sort("layer")
        ax.plot(part["drift"], part["avg_cos"], "-o", color=colour, ms=3, label=f"step {step}")
    ax.set_xlabel("drift norm ||mean x||")
    ax.set_ylabel(metric_words("avg_cos"))
    ax.legend(fontsize=7)
    fig.suptitle(f"{sweep_title(sweep)}: drift vs anisotropy across layers")
    save_figure(fig, path)


def norms(sweep: pl.DataFrame, path: Path) -> None:
    """Spread of token norms (std / mean) just before and after each LayerNorm, averaged over layers."""
    around_layernorm = pl.col("site").str.starts_with("ln_") | pl.col("site").str.starts_with("final_ln")
    rows = sweep.filter((pl.col("metric") == "norm_cv") & around_layernorm)
    fig, axes = panel_grid(2, 2)
    for ax, suffix, title in zip(axes, ("_in", "_out"), ("before each LayerNorm", "after each LayerNorm")):
        part = rows.filter(pl.col("site").str.ends_with(suffix)).group_by("step", "site").agg(pl.col("value").mean())
        part = part.with_columns(pl.col("site").str.strip_suffix(suffix))
        lines_by(ax, part, "site", "{}", "tab10")
        ax.set_ylabel("norm std / mean")
        ax.set_title(title, fontsize=9)
        step_axis(ax, sweep)
    legend_beside(fig, axes, fontsize=9)
    fig.suptitle(f"{sweep_title(sweep)}: the hypersphere: spread of token norms around each LayerNorm")
    save_figure(fig, path)


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
    **outliers.PLOTTERS,  # rogue dimensions, massive activations, attention sinks, LayerNorm outliers
}


# per model, drawn in this order; the plot rules' outputs: the figures the built-in measures name (a test keeps
# PLOTTERS drawing exactly these)
MODEL_FIGURES = builtin_figures()


NO_ATTENTION = "the model has no attention (a convolutional network): no queries, keys or attention maps"
NO_LAYERNORM = "the model has no LayerNorm on its stream (a convolutional network: BatchNorm, or none)"
#: figures that draw a kind of metric some models lack (image models): (a metric the figure needs, what it says)
NEEDS = {
    "qk_alignment.png": ("qk_cos", NO_ATTENTION),
    "qk_mean_dot.png": ("qk_mean_dot", NO_ATTENTION),
    "qk_cos_concat.png": ("qk_cos", NO_ATTENTION),
    "attention_entropy.png": ("entropy_mean", NO_ATTENTION),
    "attention_softmax.png": ("entropy_mean", NO_ATTENTION),
    "attention_sinks.png": ("sink_first_mass", NO_ATTENTION),
    "final_layernorm.png": ("gain_mean", NO_LAYERNORM),
    "layernorm_params.png": ("gain_mean", NO_LAYERNORM),
    "layernorm_outliers.png": ("gain_mean", NO_LAYERNORM),
    "norms.png": ("gain_mean", NO_LAYERNORM),
}


def plot_model(sweep: pl.DataFrame, out_dir: Path, intervals: pl.DataFrame | None = None) -> list[Path]:
    """MODEL_FIGURES of one model's sweep into `out_dir`; with `intervals` (anisweep.plots.intervals.read_intervals
    of its bootstrap.parquet) a band around each curve they hold an interval for."""
    sweep = attach(analysed(sweep), intervals)
    metrics = set(sweep["metric"].unique())
    paths = []
    for name in MODEL_FIGURES:
        needed, why = NEEDS.get(name, (None, ""))
        if needed is not None and needed not in metrics:
            not_measured(sweep, Path(out_dir) / name, name.removesuffix(".png").replace("_", " "), why)
        else:
            PLOTTERS[name](sweep, Path(out_dir) / name)
        paths.append(Path(out_dir) / name)
    return paths


FAMILY_SITES = {"final_ln_in": "before the final LayerNorm", "final_ln_out": "after the final LayerNorm"}


def plot_family(sweeps: pl.DataFrame, path: Path, intervals: pl.DataFrame | None = None) -> None:
    """Models of one family side by side against tokens seen (steps when a model has no token count: kit.progress_axis).

    Every panel shows one named site, the same for every model: the last residual layer is before the final
    LayerNorm in GPT-NeoX and after it in BERT, so the panels use final_ln_in / final_ln_out instead.
    Query-key alignment is pre-rotary (solid) for every model, post-rotary (dashed) where it exists.
    With `intervals` (the models' and the family's groups' bootstrap tables, anisweep.plots.intervals), a band
    around each curve they hold an interval for, and each group of seeds' mean (dotted black) with its interval.
    """
    sweeps = attach(analysed(sweeps), intervals)

    def at_site(metric: str, site: str):
        return lambda s: s.filter((pl.col("metric") == metric) & (pl.col("site") == site) & pl.col("head").is_null())

    def mean_over_layers(metric: str, site: str):
        return lambda s: at_site(metric, site)(s).group_by("model", "step", "tokens_seen").agg(pl.col("value").mean())

    panels = [
        (f"{label} at {site}\n({where})", [(at_site(metric, site), "-", "")], (metric, site))
        for metric, label in (("avg_cos", "mean pairwise cosine"), ("isoscore", "IsoScore"))
        for site, where in FAMILY_SITES.items()
    ]
    panels += [
        (
            "normalised attention entropy\n(mean over heads and layers)",
            [(mean_over_layers("entropy_norm_mean", "attention"), "-", "")],
            None,
        ),
        (
            "|qk cos|, mean over heads and layers\n(qk_pre: pre-rotary, qk_post: post-rotary)",
            [
                (mean_over_layers("qk_cos_abs_mean", "qk_pre"), "-", " qk_pre"),
                (mean_over_layers("qk_cos_abs_mean", "qk_post"), "--", " qk_post"),
            ],
            None,
        ),
        (
            "cos of the means concatenated over heads\n(mean over layers; across seeds: Godey Fig. 23)",
            [
                (mean_over_layers("qk_cos_concat", "qk_pre"), "-", " qk_pre"),
                (mean_over_layers("qk_cos_concat", "qk_post"), "--", " qk_post"),
            ],
            None,
        ),
    ]
    plt = pyplot()
    models = sorted(sweeps["model"].unique().to_list())
    colours = dict(zip(models, plt.get_cmap("tab10")(np.arange(len(models)) % 10)))
    x_column, x_label = progress_axis(sweeps)
    fig, axes = panel_grid(len(panels), 2, size=(4.2, 3.2))
    groups = set()
    for ax, (label, lines, at) in zip(axes, panels):
        for model in models:
            for pick, style, suffix in lines:
                rows = pick(sweeps.filter(pl.col("model") == model)).sort("step")
                if rows.height == 0:
                    continue
                ax.plot(rows[x_column], rows["value"], style, marker=".", color=colours[model], label=model + suffix)
                band(ax, rows[x_column], rows, colours[model])
        for rows in group_curves(intervals, sweeps["family"][0], *at) if at else ():
            if rows[x_column].null_count():
                continue  # the group's steps have no token count: not on this axis
            x = rows[x_column]
            ax.plot(x, rows["estimate"], ":", color="black", lw=1.4)
            band(ax, x, rows, "black")
            groups.add((rows["group"][0], rows["n_seeds"][0]))
        set_progress_scale(ax, sweeps, x_column, x_label)
        ax.set_ylabel(label, fontsize=9)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colours[model], marker=".", label=model) for model in models]
    handles += [
        Line2D([], [], color="black", ls=":", label=f"group {group}: mean of its {n} seeds")
        for group, n in sorted(groups)
    ]
    handles += [
        Line2D([], [], color="black", ls="-", label="qk_pre: pre-rotary"),
        Line2D([], [], color="black", ls="--", label="qk_post: post-rotary"),
    ]
    legend_beside(fig, axes, handles=handles, fontsize=9)
    fig.suptitle(f"{sweeps['family'][0]}: models compared over training, each panel at one named site")
    save_figure(fig, path)
