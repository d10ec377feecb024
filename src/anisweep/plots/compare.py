"""The figures of a model's comparisons (compare.parquet, anisweep.measures.compare): each measure against the
reference step over training (a line per layer, with a band where bootstrap.parquet holds the comparison's interval:
anisweep.measures.pair_bootstrap), the layer-by-layer CKA matrix at the chosen steps, and seed against seed over
training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from anisweep.plots.intervals import attach_pairs
from anisweep.plots.kit import legend_beside, lines_by, panel_grid, save_figure, step_axis

#: the figures of a model whose comparisons are on (config `compare.enabled`)
COMPARE_FIGURES = ("compare_training.png", "compare_layers.png")
#: Drawn for a model with seed pairs only (config compare.seeds), by a job of its own.
SEED_FIGURES = ("compare_seeds.png",)
ROLE_WORDS = {"final": "against the final step", "previous": "against the previous step", "step": "against step {}"}
MEASURE_WORDS = {"cka": "linear CKA", "cka_debiased": "linear CKA (unbiased HSIC)", "svcca": "SVCCA", "pwcca": "PWCCA"}


def draw_all(
    table: pl.DataFrame,
    out_dir: str | Path,
    site: str = "resid",
    seed_figures: bool = False,
    intervals: pl.DataFrame | None = None,
) -> None:
    """COMPARE_FIGURES of a model's compare.parquet into `out_dir`, or with `seed_figures` SEED_FIGURES; `intervals`:
    the comparisons' intervals (intervals.read_pair_intervals), drawn as bands over training."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = table.filter(pl.col("site") == site)
    title = f"{table['family'][0]} / {table['model'][0]}" if table.height else "comparisons"
    if seed_figures:
        seeds(rows.filter(role="seed"), out_dir / "compare_seeds.png", title)
        return
    over_training(
        attach_pairs(rows.filter(pl.col("role").is_in(list(ROLE_WORDS))), intervals),
        out_dir / "compare_training.png",
        title,
    )
    layer_matrices(rows.filter(role="layers"), out_dir / "compare_layers.png", title)


def _panels(rows: pl.DataFrame) -> list[tuple[str, object, str]]:
    """(role, reference step or None, metric) of every panel, roles in ROLE_WORDS' order."""
    keys = rows.select("role", "ref_step", "metric").unique()
    panels = []
    for role in ROLE_WORDS:
        of_role = keys.filter(role=role)
        refs = sorted(set(of_role["ref_step"])) if role == "step" else [None]
        for ref in refs:
            metrics = of_role if ref is None else of_role.filter(ref_step=ref)
            panels += [(role, ref, m) for m in _metric_order(metrics["metric"])]
    return panels


def _metric_order(metrics) -> list[str]:
    """The built-in measures in MEASURE_WORDS' order, then a user's own, sorted."""
    present = set(metrics)
    return [m for m in MEASURE_WORDS if m in present] + sorted(present - set(MEASURE_WORDS))


def over_training(rows: pl.DataFrame, path: Path, title: str) -> None:
    """A panel per (role, metric), a line per layer: the checkpoint's similarity to its reference over training."""
    panels = _panels(rows)
    if not panels:
        return _nothing(path, title, "no pairs of checkpoints compared (config compare.against)")
    ncols = len({m for _, _, m in panels})
    fig, axes = panel_grid(len(panels), ncols)
    for ax, (role, ref, metric) in zip(axes, panels):
        part = rows.filter(role=role, metric=metric)
        part = part if ref is None else part.filter(ref_step=ref)
        lines_by(ax, part.filter(pl.col("value").is_not_nan()), "layer", "layer {}")
        _unit_range(ax, metric)
        ax.set_title(f"{MEASURE_WORDS.get(metric, metric)}\n{ROLE_WORDS[role].format(ref)}", fontsize=9)
        step_axis(ax, rows)  # every panel over the whole grid, the final step included
    legend_beside(fig, axes, fontsize=8)
    fig.suptitle(f"{title}: similarity of each checkpoint to its reference (sampled tokens, residual stream)")
    save_figure(fig, path)


def layer_matrices(rows: pl.DataFrame, path: Path, title: str) -> None:
    """Linear CKA of every pair of layers, a heat map per chosen step."""
    steps = sorted(set(rows["step"]))
    if not steps:
        return _nothing(path, title, "no layer-by-layer matrix computed (config compare.layer_steps)")
    fig, axes = panel_grid(len(steps), min(len(steps), 3), size=(3.6, 3.2))
    image = None
    for ax, step in zip(axes, steps):
        part = rows.filter(step=step, metric="cka")
        layers = sorted(set(part["layer"]))
        matrix = np.full((len(layers), len(layers)), np.nan)
        index = {layer: i for i, layer in enumerate(layers)}
        for layer, ref_layer, value in part.select("layer", "ref_layer", "value").iter_rows():
            matrix[index[layer], index[ref_layer]] = value
        image = ax.imshow(matrix, vmin=0, vmax=1, cmap="magma", origin="lower")
        ax.set_xticks(range(len(layers)), layers)
        ax.set_yticks(range(len(layers)), layers)
        ax.set_xlabel("layer")
        ax.set_ylabel("layer")
        ax.set_title(f"step {step}", fontsize=9)
    fig.colorbar(image, ax=axes[: len(steps)], label="linear CKA", shrink=0.8)
    fig.suptitle(f"{title}: linear CKA between layers (residual stream)")
    save_figure(fig, path)


def seeds(rows: pl.DataFrame, path: Path, title: str) -> None:
    """A panel per (other model, metric), a line per layer: this model against another seed at the same step."""
    others = sorted(set(rows["ref_model"]))
    if not others:
        return _nothing(path, title, "no seed pairs configured (config compare.seeds)")
    metrics = _metric_order(rows["metric"])
    fig, axes = panel_grid(len(others) * len(metrics), len(metrics))
    panels = [(other, metric) for other in others for metric in metrics]
    for ax, (other, metric) in zip(axes, panels):
        part = rows.filter(ref_model=other, metric=metric)
        lines_by(ax, part.filter(pl.col("value").is_not_nan()), "layer", "layer {}")
        _unit_range(ax, metric)
        ax.set_title(f"{MEASURE_WORDS.get(metric, metric)}\nagainst {other} at the same step", fontsize=9)
        step_axis(ax, rows)
    legend_beside(fig, axes, fontsize=8)
    fig.suptitle(f"{title}: similarity to another seed over training (sampled tokens, residual stream)")
    save_figure(fig, path)


def _unit_range(ax, metric: str) -> None:
    """The built-in measures' y axis: their whole range, 0 to 1 (a user's measure keeps its own)."""
    if metric in MEASURE_WORDS:
        ax.set_ylim(-0.02, 1.02)


def _nothing(path: Path, title: str, why: str) -> None:
    fig, axes = panel_grid(1, 1)
    axes[0].text(0.5, 0.5, why, ha="center", va="center", wrap=True)
    axes[0].set_axis_off()
    fig.suptitle(title)
    save_figure(fig, path)
