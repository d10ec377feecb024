"""Godey et al. 2024, Section 3, across the models of a config, each at its last analysed step (results/figures/):

- `survey_layers.png` (their Fig. 1 and 2): the residual stream's avg_cos layer by layer, a line per model; the
  paper's estimate from uniformly drawn pairs as points with two standard errors. Layer 0 is the stream entering
  the first block, whatever made it (token embeddings, CANINE's molecule convolution, a ViT's patches, a CNN's
  stem). An encoder-decoder model's decoder layers follow its encoder's (its layers are numbered so), as the paper
  concatenates T5's; a dashed line in the model's colour marks where its decoder starts.
- `survey_drift_p.png` (Fig. 5 and 16): per model, the p-value of the Spearman and of the Pearson correlation of
  drift_norm and avg_cos across layers: the exact permutation p (bars) and the t-test p the paper reports (dots),
  against p = 0.05.
- `survey_isotropic.png` (Fig. 18): the 95th percentile of the cosine of two isotropic Gaussian vectors against
  their dimension, and each model's layers' avg_cos, each layer at its own width.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from anisweep.measures.sweep import analysed
from anisweep.plots.kit import legend_beside, panel_grid, pyplot, save_figure

FIGURES = ("survey_layers.png", "survey_drift_p.png", "survey_isotropic.png")
SITE = "resid"


def last_steps(sweeps: pl.DataFrame) -> pl.DataFrame:
    """Each model's rows at its last analysed step (status ok)."""
    ok = analysed(sweeps)
    last = ok.group_by("family", "model").agg(pl.col("step").max().alias("last"))
    return ok.join(last, on=["family", "model"]).filter(pl.col("step") == pl.col("last")).drop("last")


def model_label(family: str, model: str, step: int) -> str:
    """The model's name, and its step where it has one (a hub model's single checkpoint is filed as step 0)."""
    name = model if family in ("hub", "local", "toy") else f"{family}/{model}"
    return f"{name} (step {step})" if step else name


def depth_rows(rows: pl.DataFrame, metric: str) -> pl.DataFrame:
    """(depth, value) of one model's per-layer `metric` at the residual stream, in order of depth. An
    encoder-decoder model numbers its layers straight through the decoder (docs/adapters.md), as the paper draws
    T5's."""
    picked = rows.filter((pl.col("site") == SITE) & (pl.col("metric") == metric) & pl.col("head").is_null())
    return picked.select(pl.col("layer").alias("depth"), "value").sort("depth")


def decoder_start(rows: pl.DataFrame) -> int | None:
    """The residual layer of an encoder-decoder model's first decoder block output (its `decoder_embed` site sits
    at the encoder's last layer, Le; decoder block j's output is Le + 1 + j); None for a model without a decoder."""
    decoder = rows.filter(pl.col("site") == "decoder_embed")["layer"].drop_nulls()
    return int(decoder.min()) + 1 if decoder.len() else None


def models_of(rows: pl.DataFrame) -> list[tuple[str, str, int]]:
    return sorted(set(rows.select("family", "model", "step").iter_rows()))


def plot_layers(rows: pl.DataFrame, path: Path, groups: dict[str, str] | None = None) -> None:
    """Fig. 1 / 2: avg_cos per layer, a line per model, the pair estimate with two standard errors; a panel per
    group (`groups`: "family/model" -> its group; the others together), as the paper parts token-level models
    (Fig. 1) from character-level ones (Fig. 2)."""
    groups = groups or {}
    models = models_of(rows)
    panels = list(dict.fromkeys(groups.get(f"{family}/{model}", "") for family, model, _ in models))
    fig, axes = panel_grid(len(panels), min(2, len(panels)), size=(6.0, 4.0))
    for i, (family, model, step) in enumerate(models):
        ax = axes[panels.index(groups.get(f"{family}/{model}", ""))]
        own = rows.filter((pl.col("family") == family) & (pl.col("model") == model))
        exact, pairs, se = (depth_rows(own, m) for m in ("avg_cos", "avg_cos_pairs", "avg_cos_pairs_se"))
        colour = f"C{i % 10}"
        ax.plot(exact["depth"], exact["value"], color=colour, label=model_label(family, model, step))
        decoder = decoder_start(own)
        if decoder is not None:
            ax.axvline(decoder - 0.5, color=colour, ls="--", lw=0.8, label=f"{model}: decoder from layer {decoder}")
        if pairs.height and pairs.height == se.height:
            ax.errorbar(
                pairs["depth"], pairs["value"], yerr=2 * se["value"], fmt="o", ms=3, color=colour, capsize=2, alpha=0.7
            )
    for ax, panel in zip(axes, panels):
        ax.set_xlabel("layer (0: the stream entering the first block; a decoder's follow its encoder's)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_ylabel("mean pairwise cosine of the residual stream")
        ax.set_title(panel or "lines: exact over every token; points: uniform pairs, ±2 SE", fontsize=9)
        ax.axhline(0, color="grey", lw=0.6)
        ax.legend(fontsize=7) if len(panels) > 1 else legend_beside(fig, axes, source=ax, fontsize=8)
    title = "Anisotropy layer by layer (Godey et al. 2024, Fig. 1-2)"
    if len(panels) > 1:
        title += "\nlines: exact over every token; points: uniform pairs, ±2 SE"
    fig.suptitle(title)
    save_figure(fig, path)


def plot_drift_p(rows: pl.DataFrame, path: Path) -> None:
    """Fig. 5 / 16: the drift-anisotropy correlation's p per model, Spearman and Pearson."""
    models = models_of(rows)
    fig, axes = panel_grid(2, 2, size=(max(4.0, 0.6 * len(models) + 2.0), 3.6))
    x = np.arange(len(models))
    for ax, test in zip(axes, ("spearman", "pearson")):
        exact = [_value(rows, family, model, f"drift_avg_cos_{test}_p") for family, model, _ in models]
        ttest = [_value(rows, family, model, f"drift_avg_cos_{test}_p_ttest") for family, model, _ in models]
        positive = [p for p in (*exact, *ttest) if p > 0]
        floor = min([*positive, 0.05]) / 4 if positive else 1e-3
        ax.bar(x, exact, color="tab:blue", alpha=0.6, label="permutation p (exact up to 8 layers)")
        ttest = np.asarray(ttest, dtype=float)
        zero = ttest == 0  # perfectly monotone layers: a t-test p of 0, drawn on the axis
        ax.plot(x[~zero], ttest[~zero], "o", color="black", ms=4, label="t-test p (as the paper reports)")
        ax.plot(
            x[zero], np.full(zero.sum(), floor), "v", color="black", ms=5, label="t-test p = 0 (drawn at the bottom)"
        )
        ax.axhline(0.05, color="red", ls=":", label="p = 0.05")
        ax.set_yscale("log")
        ax.set_ylim(floor / 2, 1.5)
        ax.set_xticks(x, [model for _, model, _ in models], rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("p-value")
        ax.set_title(f"{test.capitalize()}: drift_norm vs avg_cos across layers", fontsize=9)
    legend_beside(fig, axes, source=axes[0], fontsize=7)
    fig.suptitle("Is anisotropy explained by the drift? (Godey et al. 2024, Fig. 5 and 16)")
    save_figure(fig, path)


def _value(rows: pl.DataFrame, family: str, model: str, metric: str) -> float:
    found = rows.filter((pl.col("family") == family) & (pl.col("model") == model) & (pl.col("metric") == metric))
    return float(found["value"][0]) if found.height else float("nan")


def layer_widths(rows: pl.DataFrame) -> pl.DataFrame:
    """(depth, width, value) of one model's residual layers: each layer's avg_cos beside its own width (a CNN's
    stages and MiT's widen layer by layer), layers without a width left out."""
    width = depth_rows(rows, "dim").rename({"value": "width"})
    return width.join(depth_rows(rows, "avg_cos"), on="depth").sort("depth")


def plot_isotropic(rows: pl.DataFrame, path: Path) -> None:
    """Fig. 18: the isotropic 95th percentile against d, each layer of each model at its own width, and the mean of
    a model's layers of one width."""
    from anisweep.measures.geometry import isotropic_cos_quantile  # scipy: only in the plotting job

    fig, axes = panel_grid(1, 1, size=(6.0, 4.0))
    ax = axes[0]
    dims = np.unique(np.geomspace(4, 16384, 60).astype(int))
    ax.plot(
        dims,
        [isotropic_cos_quantile(int(d)) for d in dims],
        color="black",
        label="isotropic Gaussians: 95th percentile",
    )
    for i, (family, model, step) in enumerate(models_of(rows)):
        layers = layer_widths(rows.filter((pl.col("family") == family) & (pl.col("model") == model)))
        if not layers.height:
            continue
        colour = f"C{i % 10}"
        ax.plot(layers["width"], layers["value"], "o", ms=3, alpha=0.35, color=colour)
        means = layers.group_by("width").agg(pl.col("value").mean()).sort("width")
        ax.plot(means["width"], means["value"], "D", ms=6, color=colour, label=model_label(family, model, step))
    ax.set_xscale("log")
    ax.set_xlabel("dimension d (each layer's own width)")
    ax.set_ylabel("cosine similarity")
    ax.set_title("faint: each layer's avg_cos; diamond: the mean of a model's layers of one width", fontsize=9)
    legend_beside(fig, axes, source=ax, fontsize=8)
    fig.suptitle("The cosines isotropic vectors reach, and the models' (Godey et al. 2024, Fig. 18)")
    save_figure(fig, path)


def plot_survey(sweeps: pl.DataFrame, out_dir: Path, groups: dict[str, str] | None = None) -> None:
    """Every figure of FIGURES into `out_dir` from the models' sweeps (their concatenated sweep.parquet); `groups`
    ("family/model" -> group) parts survey_layers.png into a panel per group."""
    rows = last_steps(sweeps)
    out_dir = Path(out_dir)
    pyplot()  # the backend, before any figure
    plot_layers(rows, out_dir / "survey_layers.png", groups)
    plot_drift_p(rows, out_dir / "survey_drift_p.png")
    plot_isotropic(rows, out_dir / "survey_isotropic.png")
