"""What the audit of the published grids means for one run: which checkpoints are not downloaded, what each is
checked against, and the error or warning where a step could not be audited.

The workflow calls :func:`plan` when it reads the config (workflow/rules/common.smk), before any job: for each Hub
model of the config it reads the model's previous audit (``results/{family}/{model}/grid.parquet``), audits the
grid again (a commit unchanged since is not listed again: one request for the repository's branches), and prints
the grid's health; the table is written where it changed when the run starts (:meth:`AuditPlan.write_grids`; the
sweep reads it), so that reading or dry-running the workflow writes nothing. A re-upload of a branch changes the
sha256 recorded for its checkpoint, which extract's recorded ``source`` holds: that checkpoint alone is analysed
again.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import polars as pl

from anisweep.checkpoints.audit import (
    SKIPPED,
    AuditError,
    audit_model,
    expected_hashes,
    grid_path,
    health,
    how_to_check,
    read_grid,
    steps_with,
    unchecked_reasons,
    write_grid,
)
from anisweep.checkpoints.base import Checkpoint


@dataclass
class AuditPlan:
    """The audit's verdict on a run's checkpoints."""

    skipped: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> its grid row (not downloaded)
    hashes: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> {weight file: audited sha256}
    grids: dict[tuple[str, str], Path] = field(default_factory=dict)  # (family, model) -> its grid.parquet
    lines: list[str] = field(default_factory=list)  # the health of each grid, as printed
    tables: dict[tuple[str, str], pl.DataFrame] = field(default_factory=dict)  # (family, model) -> its audit
    steps: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (family, model) -> the config's steps

    def flagged_steps(self, family: str, model: str) -> list[int]:
        """The config's steps of a model that the audit left out of the run."""
        return sorted(r["step"] for key, r in self.skipped.items() if key.startswith(f"{family}/{model}/step"))

    def write_grids(self) -> list[Path]:
        """Write each model's grid.parquet where it changed (the workflow calls this when a run starts, never
        while it reads the config: a dry run writes nothing); returns those written."""
        return [self.grids[model] for model, table in self.tables.items() if write_grid(table, self.grids[model])]

    def verdict(self, family: str, model: str) -> str:
        """What a sweep reads of the model's audit: each of the config's steps' status and the branch it repeats,
        as a digest ("" for a model without a published grid): the sweep's recorded param, so that it is made
        again when they change, and only then."""
        table = self.tables.get((family, model))
        if table is None:
            return ""
        rows = (
            table.filter(pl.col("step").is_in(self.steps[(family, model)]))
            .select("step", "status", "repeats", "repeats_step", "shared_with")
            .sort("step")
            .rows()
        )
        return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def audited(checkpoints: Iterable[Checkpoint]) -> dict[tuple[str, str], list[Checkpoint]]:
    """The Hub models of a run, each with its checkpoints (local runs and toys have no published grid)."""
    models: dict[tuple[str, str], list[Checkpoint]] = defaultdict(list)
    for c in checkpoints:
        if c.repo_id is not None:
            models[(c.family, c.model)].append(c)
    return dict(models)


def plan(
    checkpoints: Iterable[Checkpoint],
    settings: Mapping[str, Any],
    results: Path | str = "results",
    *,
    stderr: TextIO | None = None,
    cache_dir: Path | str | None = None,
    refresh: bool = True,
) -> AuditPlan:
    """Audit every Hub model of ``checkpoints`` (``settings``: the config's ``audit`` section), write each
    ``grid.parquet``, print each health to ``stderr``, and return what the run does with its checkpoints.

    An AuditError before any work: a step of the config that could not be audited (no network, nothing cached)
    unless ``allow_unaudited``; a model whose every step is flagged under ``flagged: skip``. ``refresh=False`` (a
    job of the workflow, on a node that may have no network) takes a model's last audit as it is, silently."""
    stderr = stderr or sys.stderr
    out = AuditPlan()
    if not settings.get("enabled", True):
        return out
    policy = settings.get("flagged", "skip")
    for (family, model), chosen in audited(checkpoints).items():
        path = grid_path(results, family, model)
        table = previous = read_grid(path)
        steps = [c.step for c in chosen]
        if refresh or previous is None:
            try:
                table, notes = audit_model(chosen, previous=previous, cache_dir=cache_dir)
            except Exception as error:  # a gated repository, a proxy, an answer the audit cannot read
                raise AuditError(
                    f"{family}/{model}: the audit of its published grid failed: {type(error).__name__}: {error}; "
                    "fix the cause, or set audit.enabled: false to sweep what the names say"
                ) from error
            lines = [f"audit: {line}" for line in health(table, notes, steps)]
            out.lines += lines
            print("\n".join(lines), file=stderr, flush=True)
        out.grids[(family, model)] = path
        out.tables[(family, model)] = table
        out.steps[(family, model)] = sorted(set(steps))
        reasons = unchecked_reasons(table, steps)
        if reasons:
            why = "; ".join(f"steps {', '.join(map(str, found))}: {reason}" for reason, found in reasons.items())
            what = f"{family}/{model}: steps of the config could not be audited ({why})"
            if not settings.get("allow_unaudited", False):
                raise AuditError(
                    f"{what}: {how_to_check(reasons)}; to sweep them unaudited, set audit.allow_unaudited: true"
                )
            print(f"audit: warning: {what}: swept unaudited (audit.allow_unaudited)", file=stderr, flush=True)
        left_out = steps_with(table, SKIPPED, steps) if policy == "skip" else {}
        if left_out and len(left_out) == len(set(steps)):
            raise AuditError(
                f"{family}/{model}: every step of the config is flagged by the audit of its grid "
                f"({', '.join(f'{s}: ' + r['status'] for s, r in sorted(left_out.items()))}; {path}): choose other "
                "steps, or set audit.flagged: keep to analyse them anyway"
            )
        for c in chosen:
            if c.step in left_out:
                out.skipped[c.key] = left_out[c.step]
            elif hashes := expected_hashes(table, c.step):
                out.hashes[c.key] = hashes
    return out
