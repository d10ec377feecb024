"""What a failed run leaves behind (the workflow's `onerror` handler, docs/reruns.md).

When a run fails, each sweep table it was making is written from the checkpoints that have metrics, the
others listed with ``status = "missing"``, and no weights stay on disk. The handler in
``workflow/rules/common.smk`` only gathers what Snakemake knows (which sweeps were still to be made, how to
drop a file's metadata record, whether ``--notemp`` was given) and calls the functions here, which take plain
arguments and are tested without Snakemake.

Nothing here imports torch or polars until a sweep is written: the module is imported when the Snakefile is
parsed.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

__all__ = ["Sweep", "write_partial_sweep", "write_partial_sweeps", "remove_stranded_weights"]


@dataclass(frozen=True)
class Sweep:
    """One model's sweep table as the aggregate rule makes it: `metrics` holds one path per step, in order.

    `forget` drops the record Snakemake keeps of `out` (its metadata), so that the next run never takes the
    partial table for the aggregate's output; None where there is no record to drop.
    """

    family: str
    model: str
    seed: int | None
    steps: Sequence[int]
    metrics: Sequence[Path]
    out: Path
    final_step: int | None = None
    forget: Callable[[], object] | None = None

    def __post_init__(self):
        if len(self.steps) != len(self.metrics):
            raise ValueError(
                f"{self.family}/{self.model}: {len(self.steps)} steps but {len(self.metrics)} metrics paths"
            )


def write_partial_sweep(sweep: Sweep) -> list[int] | None:
    """Write `sweep.out` from the metrics that exist, the steps without metrics listed as missing, and mark it
    out of date: its metadata record dropped (`sweep.forget`) and its mtime set before its oldest input, so that
    the next run re-aggregates it whatever becomes of the failed checkpoints (retried, or dropped from the
    config). Returns the missing steps, or None when every step has metrics (then the aggregate itself failed:
    its log says why, and nothing is written)."""
    from anisweep.measures.sweep import aggregate
    from anisweep.tables import write_atomic

    paths = [Path(p) for p in sweep.metrics]
    done = [p for p in paths if p.exists()]
    if len(done) == len(paths):
        return None
    ident = {"family": sweep.family, "model": sweep.model, "seed": sweep.seed}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = aggregate(paths, expected_steps=list(sweep.steps), ident=ident, final_step=sweep.final_step)
    out = Path(sweep.out)
    write_atomic(table, out)
    if done:
        oldest = min(p.stat().st_mtime for p in done)
        os.utime(out, (oldest - 1, oldest - 1))
    if sweep.forget is not None:
        sweep.forget()
    return [step for step, path in zip(sweep.steps, paths) if not path.exists()]


def write_partial_sweeps(sweeps: Iterable[Sweep], stderr: TextIO | None = None) -> list[Path]:
    """:func:`write_partial_sweep` for each sweep, saying on `stderr` what was written; an error writing one is
    reported and the next one written (never hiding the run's own error). Returns the tables written."""
    stderr = stderr or sys.stderr
    written = []
    for sweep in sweeps:
        try:
            missing = write_partial_sweep(sweep)
        except Exception as error:
            print(f"could not write the partial sweep {sweep.out}: {error}", file=stderr)
            continue
        if missing is not None:
            written.append(Path(sweep.out))
            print(
                f"partial sweep {sweep.out}: steps {missing} missing (status = missing); rerun to retry them",
                file=stderr,
            )
    return written


def remove_stranded_weights(
    keys: Iterable[str], root: str | Path = "weights", *, notemp: bool = False, stderr: TextIO | None = None
) -> list[str]:
    """Nothing is in flight once a run has failed, so no weights stay on disk: those of a failed extract (kept
    until then, so that a retry of the job could read them) and those fetched for an extract that never
    started. `keys` are the checkpoints' `{family}/{model}/step{N}`; their weights are `root/key`. With
    `notemp` (Snakemake's --notemp: the user keeps every temporary file) nothing is removed. A rerun fetches
    them again (from the Hugging Face cache with fetch.keep_weights). Returns the keys removed."""
    if notemp:
        return []
    stderr = stderr or sys.stderr
    removed = []
    for key in keys:
        folder = Path(root) / key
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(key)
            print(f"removed the weights of {key} (not extracted)", file=stderr)
    return removed
