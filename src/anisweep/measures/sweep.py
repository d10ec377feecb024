"""One tidy table per sweep: every checkpoint's metrics, flagged where the checkpoint is suspect.

A checkpoint whose weights are byte-identical to another step's (the known defective Pythia branches
serve the final model under early step names) is flagged `duplicate_of_step`, never silently kept as a
training step; a checkpoint whose activations went non-finite (NaN/inf token vectors counted by extract, or
NaN/inf attention, query/key or embedding statistics) is flagged `status = "nonfinite"`; a checkpoint of the
config that produced no metrics (its jobs failed, or the run stopped before them: only a partial sweep, which the
failed run's handler writes, has one) is listed with `status = "unfinished"`; any other row whose value is NaN or
inf (an IsoScore over too few tokens, a user's measure that returned NaN) is `status = "nan"`. A Hub model's sweep
also carries the audit of its grid (anisweep.checkpoints.audit.with_audit). Only `ok` rows are analysed
(figures), and no figure is drawn from a partial sweep (:func:`read_complete_sweeps`). Every status word is in the
glossary (Statuses).
"""

from __future__ import annotations

import json
import warnings
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from anisweep.tables import (
    IDENTITY,
    METRIC_KEY,
    METRIC_PARAMETERS,
    METRIC_SCHEMA,
    check_metric_keys,
    in_metric_schema,
    read_parquet,
)

SWEEP_SCHEMA = {**METRIC_SCHEMA, "status": pl.String, "duplicate_of_step": pl.Int64, "weights_sha256": pl.String}
#: the status of a step of the config without metrics: its jobs failed, or the run stopped before them
UNFINISHED = "unfinished"


def _provenance(extract_json: Path) -> dict:
    """`extract.json`'s checkpoint: the fetch manifest (step, revision, weight files) with the hashes of the bytes
    extract loaded (anisweep.checkpoints.weight_files)."""
    return json.loads(Path(extract_json).read_text()).get("checkpoint", {})


def weight_keys(manifest: Mapping[str, Any]) -> set[str]:
    """The hashes by which a checkpoint can repeat another: its combined hash and, for a sharded checkpoint,
    each shard's (one shard served under two step names is the pythia-12b defect, EleutherAI/pythia#206)."""
    keys = {manifest["weights_sha256"]} if manifest.get("weights_sha256") else set()
    per_file = manifest.get("weight_files_sha256") or {}
    if len(per_file) > 1:
        keys |= set(per_file.values())
    return keys


def find_duplicates(manifests: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Steps of one model whose weights (all of them, or one shard) are byte-identical to another step's.

    `manifests` are ``extract.json``'s ``checkpoint`` sections (the fetch manifest with extract's hashes of the
    weight files); those without a hash are ignored. Returns one record per affected checkpoint, sorted by
    (family, model, step): ``{family, model, step, revision, weights_sha256, duplicate_of: [other steps
    sharing bytes with it], shared_files: [its weight files found in another step]}``. Identical weights at
    two steps mean at least one of them is not what its name says; this lists all of them, and
    :func:`duplicate_steps` decides which one is trusted.
    """
    manifests = [m for m in manifests if weight_keys(m)]
    groups: dict[tuple[Any, Any, str], set[int]] = defaultdict(set)
    for m in manifests:
        for key in weight_keys(m):
            groups[(m.get("family"), m.get("model"), key)].add(int(m["step"]))
    out = []
    for m in sorted(manifests, key=lambda m: (m.get("family") or "", m.get("model") or "", int(m["step"]))):
        step = int(m["step"])
        group_of = {key: groups[(m.get("family"), m.get("model"), key)] for key in weight_keys(m)}
        shared = {key for key, steps in group_of.items() if len(steps) > 1}
        others = set().union(*(group_of[key] for key in shared)) - {step}
        if not others:
            continue  # unique weights, or the same checkpoint listed twice
        per_file = m.get("weight_files_sha256") or {}
        files = (
            sorted(m.get("weight_files") or per_file)
            if m.get("weights_sha256") in shared
            else sorted(name for name, sha in per_file.items() if sha in shared)
        )
        out.append(
            {
                "family": m.get("family"),
                "model": m.get("model"),
                "step": step,
                "revision": m.get("revision"),
                "weights_sha256": m.get("weights_sha256"),
                "duplicate_of": sorted(others),
                "shared_files": files,
            }
        )
    return out


def duplicate_steps(manifests: Iterable[Mapping[str, Any]], final_step: int | None = None) -> dict[int, int]:
    """step -> the step whose weights it repeats, for one model's checkpoints (see :func:`find_duplicates`).

    A defective branch serves the FINAL model under an earlier name, so only `final_step` is trusted among
    identical weights: every other member of its group is flagged against it, and a group without it is
    flagged whole, each member against the latest other one (which of them holds the weights it claims is
    unknowable).
    """
    return {
        d["step"]: final_step if final_step in d["duplicate_of"] else max(d["duplicate_of"])
        for d in find_duplicates(manifests)
        if d["step"] != final_step
    }


def nonfinite_steps(sweep: pl.DataFrame) -> list[int]:
    """Steps with non-finite activations: tokens left out of the sums (`n_nonfinite` > 0), or statistics that
    are NaN/inf only when activations or weights are (attention, mean query/key norms, embedding isotropy)."""
    if sweep.is_empty():
        return []
    bad = (pl.col("metric") == "n_nonfinite") & (pl.col("value") > 0)
    bad = bad | (
        (
            pl.col("site").eq("attention")
            | pl.col("metric").is_in(["q_norm_mean", "k_norm_mean"])
            | pl.col("metric").str.starts_with("partition_isotropy")
        )
        & ~pl.col("value").is_finite()
    )
    return sorted(sweep.filter(bad.fill_null(False))["step"].unique().to_list())


def read_metrics(path: str | Path) -> pl.DataFrame:
    """One checkpoint's metrics.parquet in METRIC_SCHEMA. A table written before the parameter columns
    (subspace, fit, rank, stratum) gets them as nulls, unless it holds the gradient analysis's rows (`grad_*`
    metrics, whose parameters were then part of the name): those must be recomputed (rerun its metrics)."""
    df = read_parquet(path)
    missing = [column for column in METRIC_PARAMETERS if column not in df.columns]
    if missing:
        if df["metric"].str.starts_with("grad_").any():
            raise ValueError(
                f"{path}: written before the gradient metrics' parameters became columns ({', '.join(missing)}"
                " missing): rerun its metrics (snakemake --forcerun metrics)"
            )
        df = df.with_columns(pl.lit(None, METRIC_SCHEMA[column]).alias(column) for column in missing)
    return in_metric_schema(df)


def aggregate(
    metric_paths: list[Path],
    expected_steps: list[int] | None = None,
    ident: dict | None = None,
    final_step: int | None = None,
    gradient_fixed_shares: Path | None = None,
) -> pl.DataFrame:
    """Concatenate per-checkpoint metrics; `extract.json` beside each metrics file supplies the weight hash.
    `gradient_fixed_shares` (the model's shares in its fixed subspaces, a table spanning its checkpoints) adds
    their metric rows to the checkpoints that have metrics.

    `ident` (family, model, seed) names the missing rows when no checkpoint produced metrics at all.
    """
    frames, provenance = [], []
    for path in map(Path, metric_paths):
        if not path.exists():
            continue
        frames.append(read_metrics(path))
        extract_json = path.parent / "extract.json"
        if extract_json.exists():
            provenance.append(_provenance(extract_json))
    sweep = pl.concat(frames) if frames else pl.DataFrame(schema=METRIC_SCHEMA)
    if gradient_fixed_shares is not None:
        from anisweep.measures.gradient_metrics import gradient_metric_frame

        fixed = gradient_metric_frame(read_parquet(gradient_fixed_shares))
        sweep = pl.concat([sweep, fixed.filter(pl.col("step").is_in(sweep["step"].unique().implode()))])
    check_metric_keys(sweep, (*IDENTITY, *METRIC_KEY), "sweep")
    duplicates = duplicate_steps(provenance, final_step)
    hashes = {p.get("step"): p.get("weights_sha256") for p in provenance}
    for step, original in sorted(duplicates.items()):
        warnings.warn(
            f"step {step} has byte-identical weights to step {original}: flagged duplicate, not a training step",
            stacklevel=2,
        )
    sweep = sweep.with_columns(
        pl.col("step").replace_strict(duplicates, default=None, return_dtype=pl.Int64).alias("duplicate_of_step"),
        pl.col("step").replace_strict(hashes, default=None, return_dtype=pl.String).alias("weights_sha256"),
    )
    nonfinite = nonfinite_steps(sweep)
    if nonfinite:
        warnings.warn(
            f"steps {nonfinite} have non-finite activations (NaN/inf): flagged nonfinite, not analysed", stacklevel=2
        )
    sweep = sweep.with_columns(
        pl.when(pl.col("duplicate_of_step").is_not_null())
        .then(pl.lit("duplicate"))
        .when(pl.col("step").is_in(nonfinite))
        .then(pl.lit("nonfinite"))
        .when(~pl.col("value").is_finite().fill_null(False))
        .then(pl.lit("nan"))
        .otherwise(pl.lit("ok"))
        .alias("status")
    )
    missing = sorted(set(expected_steps or []) - set(sweep["step"].unique().to_list()))
    if missing:
        warnings.warn(f"{len(missing)} checkpoint(s) produced no metrics: steps {missing}", stacklevel=2)
        if ident is None and sweep.is_empty():
            raise ValueError(
                f"no metrics at all (steps {missing} missing): pass ident (family, model, seed) to list them"
            )
        base = ident or {key: sweep[key][0] for key in ("family", "model", "seed")}
        sweep = pl.concat(
            [
                sweep,
                pl.DataFrame(
                    [
                        {
                            "family": base["family"],
                            "model": base["model"],
                            "seed": base.get("seed"),
                            "step": s,
                            "status": UNFINISHED,
                        }
                        for s in missing
                    ],
                    schema={k: SWEEP_SCHEMA[k] for k in ("family", "model", "seed", "step", "status")},
                ),
            ],
            how="diagonal_relaxed",
        )
    return sweep.select(list(SWEEP_SCHEMA)).cast(SWEEP_SCHEMA).sort("step", *METRIC_KEY, nulls_last=True)


def unfinished_steps(sweep: pl.DataFrame) -> list[int]:
    """The steps a partial sweep lists without metrics (status `unfinished`); [] for a complete sweep."""
    return sorted(sweep.filter(pl.col("status") == UNFINISHED)["step"].unique().to_list())


def read_complete_sweeps(paths: Iterable[str | Path]) -> pl.DataFrame:
    """The sweeps at `paths` as one frame, for the figures: a partial one (written by a failed or interrupted run,
    its steps without metrics `unfinished`) is an error naming it, never drawn as if the model were complete."""
    sweeps = []
    for path in paths:
        sweep = pl.read_parquet(path)
        unfinished = unfinished_steps(sweep)
        if unfinished:
            raise ValueError(
                f"{path}: a partial sweep (steps {', '.join(map(str, unfinished))} unfinished: a failed or interrupted "
                "run wrote it); run the workflow again to complete it before drawing figures from it"
            )
        sweeps.append(sweep)
    return pl.concat(sweeps, how="diagonal_relaxed")


def analysed(sweep: pl.DataFrame) -> pl.DataFrame:
    """The rows a figure should show: real training steps only."""
    return sweep.filter(pl.col("status") == "ok")
