"""Figures of the built-in weight measure (anisweep.measures.circuits) over one model's training: the QK patterns
forming (self-attention of the probe tokens, the symmetric share of W_QK) and the copying heads forming (copying
score, positive-eigenvalue share of the OV circuit), a panel per layer and a line per head; and a table figure of
the top token pairs of chosen heads at chosen steps."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from anisweep.plots.kit import (
    legend_beside,
    lines_by,
    lines_per_layer,
    not_measured,
    pyplot,
    reasons_not_measured,
    save_figure,
    step_axis,
    sweep_title,
)
from anisweep.tables import read_parquet

QK_PANELS = {
    "qk_self_top": "share attending most to itself",
    "qk_self_rank": "rank of itself among keys (0 first)",
    "qk_symmetric_share": "symmetric share of W_QK",
}
OV_PANELS = {
    "ov_copying": "share promoting itself most",
    "ov_positive_eigen": "positive-eigenvalue share (OV)",
}
MEASURE = "circuits"
LENS = "logit_lens"


def _rows(sweep: pl.DataFrame, metric: str) -> pl.DataFrame:
    return sweep.filter(
        (pl.col("measure") == MEASURE) & (pl.col("metric") == metric) & pl.col("head").is_not_null()
    ).sort("step")


def _chance(sweep: pl.DataFrame) -> float | None:
    probe = sweep.filter((pl.col("measure") == MEASURE) & (pl.col("metric") == "probe_tokens"))["value"]
    return 1.0 / float(probe.max()) if probe.len() else None


def heads_over_training(sweep: pl.DataFrame, path: Path, panels: dict[str, str], title: str) -> None:
    """A row per metric of `panels`, a column per layer, a line per head against the step."""
    panels = {m: label for m, label in panels.items() if _rows(sweep, m).height}
    if not panels:
        not_measured(sweep, path, title, _why_no_circuits(sweep))
        return
    layers = sorted(_rows(sweep, next(iter(panels)))["layer"].unique().to_list())
    plt = pyplot()
    fig, axes = plt.subplots(
        len(panels),
        len(layers),
        figsize=(3.0 * len(layers), 2.6 * len(panels)),
        squeeze=False,
        sharey="row",
        constrained_layout=True,
    )
    chance = _chance(sweep)
    for i, (metric, label) in enumerate(panels.items()):
        rows = _rows(sweep, metric)
        for j, layer in enumerate(layers):
            ax = axes[i, j]
            lines_by(ax, rows.filter(pl.col("layer") == layer), "head", "head {}", "tab10")
            if metric in ("qk_self_top", "ov_copying") and chance is not None:
                ax.axhline(chance, color="grey", ls=":", lw=0.8, label="chance (1 / probe tokens)")
            if metric == "qk_self_rank":
                ax.axhline(0.5, color="grey", ls=":", lw=0.8, label="chance rank (0.5: keys in random order)")
            ax.set_title(f"layer {layer}", fontsize=9)
            step_axis(ax, sweep, label=i == len(panels) - 1)
        axes[i, 0].set_ylabel(label, fontsize=9)
    shown = {}  # every row's labels (the heads, each row's reference line), once
    for ax in axes[:, 0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            shown.setdefault(label, handle)
    legend_beside(fig, list(axes.flat), handles=list(shown.values()), labels=list(shown), fontsize=8)
    fig.suptitle(f"{sweep_title(sweep)}: {title}")
    save_figure(fig, path)


def _why_no_circuits(sweep: pl.DataFrame) -> str:
    return reasons_not_measured(sweep, MEASURE) or "no circuits rows: weights.enabled is false, or metrics predate it"


def chosen_heads(sweep: pl.DataFrame) -> list[tuple[str, int, int, str]]:
    """(kind, layer, head, why) of the heads the pairs figure shows: the one most self-attending (qk) and the one
    most copying (ov) at the last step."""
    chosen = []
    for kind, metric, why in (("qk", "qk_self_top", "most self-attending"), ("ov", "ov_copying", "most copying")):
        rows = _rows(sweep, metric)
        if rows.height:
            last = rows.filter(pl.col("step") == rows["step"].max()).sort("value", "layer", "head", descending=True)
            chosen.append((kind, int(last["layer"][0]), int(last["head"][0]), why))
    return chosen


def chosen_steps(steps: list[int], n: int = 3) -> list[int]:
    """The first, last and middle steps of the grid (all of them where it has n or fewer)."""
    steps = sorted(set(steps))
    if len(steps) <= n:
        return steps
    return sorted({steps[round(i * (len(steps) - 1) / (n - 1))] for i in range(n)})


def _cell(token: str) -> str:
    """A token for the table: byte-level BPE's space (Ġ) and newline (Ċ) drawn as ␣ and ↵, cut at 12 characters."""
    token = token.replace("\n", "↵").replace("Ġ", "␣").replace("Ċ", "↵")
    return token if len(token) <= 12 else token[:11] + "…"


def pairs_table(sweep: pl.DataFrame, pairs: pl.DataFrame, path: Path) -> None:
    """A table per chosen head: its top token pairs (query -> key for QK, input -> promoted output for OV) at the
    chosen steps, a column per step, by rank."""
    heads = chosen_heads(sweep)
    if not heads or pairs.height == 0:
        not_measured(
            sweep,
            path,
            "top token pairs",
            reasons_not_measured(sweep, MEASURE) or "no circuits rows or weight_pairs tables",
        )
        return
    steps = chosen_steps(pairs["step"].unique().to_list())
    plt = pyplot()
    ranks = int(pairs["rank"].max())
    fig, axes = plt.subplots(len(heads), 1, figsize=(2.9 * len(steps) + 0.8, 0.42 * (ranks + 2) * len(heads) + 0.6))
    axes = list(axes) if len(heads) > 1 else [axes]
    for ax, (kind, layer, head, why) in zip(axes, heads):
        rows = pairs.filter((pl.col("kind") == kind) & (pl.col("layer") == layer) & (pl.col("head") == head))
        arrow = "→"
        cells = []
        for rank in range(1, ranks + 1):
            line = []
            for step in steps:
                hit = rows.filter((pl.col("step") == step) & (pl.col("rank") == rank))
                line.append(
                    f"{_cell(hit['src_token'][0])} {arrow} {_cell(hit['dst_token'][0])}  ({hit['score'][0]:.2g})"
                    if hit.height
                    else ""
                )
            cells.append(line)
        ax.set_axis_off()
        table = ax.table(
            cellText=cells,
            colLabels=[f"step {s}" for s in steps],
            rowLabels=[f"#{r}" for r in range(1, ranks + 1)],
            loc="center",
            cellLoc="left",
        )
        table.auto_set_font_size(False)
        table.set_fontsize(9)
        table.scale(1, 1.3)
        what = "query → key (score)" if kind == "qk" else "input → promoted output (logit)"
        ax.set_title(f"{kind.upper()}, layer {layer} head {head} ({why} at the last step): {what}", fontsize=10)
    fig.suptitle(f"{sweep_title(sweep)}: top token pairs", fontsize=11)
    fig.tight_layout()
    save_figure(fig, path)


def plot_circuits(sweep: pl.DataFrame, pair_paths: list[str | Path], qk: Path, ov: Path, pairs_figure: Path) -> None:
    heads_over_training(sweep, Path(qk), QK_PANELS, "QK patterns over training (W_QK through normalised embeddings)")
    heads_over_training(sweep, Path(ov), OV_PANELS, "copying heads over training (W_OV through the unembedding)")
    pairs = pl.concat([read_parquet(p) for p in pair_paths]) if pair_paths else pl.DataFrame()
    pairs_table(sweep, pairs, Path(pairs_figure))


LENS_PANELS = {
    "lens_log_rank": "mean log(1 + rank) of the target",
    "lens_top1": "share with the target on top",
    "lens_prob": "mean probability of the target",
    "lens_kl": "KL(last layer || layer), nats",
    "lens_angle": "angle from the layer before, rad",
}


def plot_logit_lens(sweep: pl.DataFrame, path: Path) -> None:
    """The logit lens over training: a panel per metric, a line per layer (anisweep.measures.logit_lens)."""
    lens = sweep.filter((pl.col("measure") == LENS) & (pl.col("metric") != LENS))  # not its rows that say why not
    if lens.height == 0:
        why = reasons_not_measured(sweep, LENS) or "no logit_lens rows: weights.enabled is false, or metrics predate it"
        not_measured(sweep, Path(path), "logit lens", why)
        return
    # the angle starts at layer 1: a NaN row at layer 0 keeps each layer's colour that of the other panels
    first = lens.filter((pl.col("metric") == "lens_prob") & (pl.col("layer") == 0))
    padding = first.with_columns(pl.lit("lens_angle").alias("metric"), pl.lit(float("nan")).alias("value"))
    lens = pl.concat([lens, padding])
    lines_per_layer(
        lens, Path(path), "resid", LENS_PANELS, "logit lens over training (each layer read through the head)"
    )
