"""What the audit of the published grids means for one run: which checkpoints are not downloaded, what each is
checked against, and the error or warning where a step could not be audited.

The workflow calls :func:`plan` when it reads the config (workflow/rules/common.smk), before any job: for each Hub
model of the config it reads the model's previous audit (``results/{family}/{model}/grid.parquet``), audits the
grid again (a commit unchanged since is not listed again: one request for the repository's branches), writes the
table where it changed (the sweep reads it), and prints the grid's health. A re-upload of a branch changes the
sha256 recorded for its checkpoint, which extract's recorded ``source`` holds: that checkpoint alone is analysed
again.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

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

    def flagged_steps(self, family: str, model: str) -> list[int]:
        """The config's steps of a model that the audit left out of the run."""
        return sorted(r["step"] for key, r in self.skipped.items() if key.startswith(f"{family}/{model}/step"))


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
            write_grid(table, path)
            lines = [f"audit: {line}" for line in health(table, notes, steps)]
            out.lines += lines
            print("\n".join(lines), file=stderr, flush=True)
        out.grids[(family, model)] = path
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
