"""One tidy table per sweep: every checkpoint's metrics, flagged where the checkpoint is suspect.

A checkpoint whose weights are byte-identical to another step's (the known defective Pythia branches
serve the final model under early step names) is flagged `duplicate_of_step`, never silently kept as a
training step; a checkpoint whose activations went non-finite (NaN/inf token vectors counted by extract, or
NaN/inf attention, query/key or embedding statistics) is flagged `status = "nonfinite"`; a checkpoint of the
config that produced no metrics is listed with `status = "missing"`. Only `ok` rows are analysed (figures).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import polars as pl

from .tables import METRIC_SCHEMA

SWEEP_SCHEMA = {**METRIC_SCHEMA, "status": pl.String, "duplicate_of_step": pl.Int64, "weights_sha256": pl.String}


def _provenance(extract_json: Path) -> dict:
    info = json.loads(Path(extract_json).read_text())
    checkpoint = info.get("checkpoint", {})
    return {"step": checkpoint.get("step"), "weights_sha256": checkpoint.get("weights_sha256"),
            "weight_files_sha256": checkpoint.get("weight_files_sha256")}


def duplicate_steps(provenance: list[dict], final_step: int | None = None) -> dict[int, int]:
    """step -> a step whose weights it repeats. A group shares all weight files or, for sharded checkpoints,
    one shard (pythia-12b serves the final model's first shard at step50000 and step58000: EleutherAI/pythia#206).

    A defective branch serves the FINAL model under an earlier name, so only `final_step` is trusted in a
    group: every other member is flagged against it, and a group without it is flagged whole (which of its
    members holds the weights it claims is unknowable).
    """
    by_hash: dict[str, set[int]] = {}
    for p in provenance:
        per_file = p.get("weight_files_sha256") or {}
        keys = {p["weights_sha256"]} | (set(per_file.values()) if len(per_file) > 1 else set())
        for key in keys - {None}:
            by_hash.setdefault(key, set()).add(p["step"])
    duplicates: dict[int, int] = {}
    for steps in by_hash.values():
        if len(steps) < 2:
            continue
        for step in steps - {final_step}:
            duplicates[step] = final_step if final_step in steps else max(steps - {step})
    return duplicates


def nonfinite_steps(sweep: pl.DataFrame) -> list[int]:
    """Steps with non-finite activations: tokens left out of the sums (`n_nonfinite` > 0), or statistics that
    are NaN/inf only when activations or weights are (attention, mean query/key norms, embedding isotropy)."""
    if sweep.is_empty():
        return []
    bad = (pl.col("metric") == "n_nonfinite") & (pl.col("value") > 0)
    bad = bad | (
        (pl.col("site").eq("attention") | pl.col("metric").is_in(["q_norm_mean", "k_norm_mean"])
         | pl.col("metric").str.starts_with("partition_isotropy"))
        & ~pl.col("value").is_finite()
    )
    return sorted(sweep.filter(bad.fill_null(False))["step"].unique().to_list())


def aggregate(metric_paths: list[Path], expected_steps: list[int] | None = None, ident: dict | None = None,
              final_step: int | None = None) -> pl.DataFrame:
    """Concatenate per-checkpoint metrics; `extract.json` beside each metrics file supplies the weight hash.

    `ident` (family, model, seed) names the missing rows when no checkpoint produced metrics at all.
    """
    frames, provenance = [], []
    for path in map(Path, metric_paths):
        if not path.exists():
            continue
        frames.append(pl.read_parquet(path))
        extract_json = path.parent / "extract.json"
        if extract_json.exists():
            provenance.append(_provenance(extract_json))
    sweep = pl.concat(frames) if frames else pl.DataFrame(schema=METRIC_SCHEMA)
    duplicates = duplicate_steps(provenance, final_step)
    hashes = {p["step"]: p["weights_sha256"] for p in provenance}
    for step, original in sorted(duplicates.items()):
        warnings.warn(f"step {step} has byte-identical weights to step {original}: flagged duplicate, not a training step")
    sweep = sweep.with_columns(
        pl.col("step").replace_strict(duplicates, default=None, return_dtype=pl.Int64).alias("duplicate_of_step"),
        pl.col("step").replace_strict(hashes, default=None, return_dtype=pl.String).alias("weights_sha256"),
    )
    nonfinite = nonfinite_steps(sweep)
    if nonfinite:
        warnings.warn(f"steps {nonfinite} have non-finite activations (NaN/inf): flagged nonfinite, not analysed")
    sweep = sweep.with_columns(
        pl.when(pl.col("duplicate_of_step").is_not_null()).then(pl.lit("duplicate"))
        .when(pl.col("step").is_in(nonfinite)).then(pl.lit("nonfinite"))
        .otherwise(pl.lit("ok")).alias("status")
    )
    missing = sorted(set(expected_steps or []) - set(sweep["step"].unique().to_list()))
    if missing:
        warnings.warn(f"{len(missing)} checkpoint(s) produced no metrics: steps {missing}")
        if ident is None and sweep.is_empty():
            raise ValueError(f"no metrics at all (steps {missing} missing): pass ident (family, model, seed) to list them")
        base = ident or {key: sweep[key][0] for key in ("family", "model", "seed")}
        sweep = pl.concat([sweep, pl.DataFrame(
            [{"family": base["family"], "model": base["model"], "seed": base.get("seed"), "step": s, "status": "missing"}
             for s in missing], schema={k: SWEEP_SCHEMA[k] for k in ("family", "model", "seed", "step", "status")},
        )], how="diagonal_relaxed")
    return sweep.select(list(SWEEP_SCHEMA)).cast(SWEEP_SCHEMA).sort("step", "layer", "head", "site", "metric", nulls_last=True)


def analysed(sweep: pl.DataFrame) -> pl.DataFrame:
    """The rows a figure should show: real training steps only."""
    return sweep.filter(pl.col("status") == "ok")
