"""What a failed run leaves behind (the workflow's `onerror` handler, docs/reruns.md).

When a run fails, each sweep table it was making is written from the checkpoints that have metrics, the
others listed with ``status = "unfinished"`` (and a Hub model's with the audit of its grid, as a complete sweep),
and the weights this run fetched that no running Snakemake needs are removed. The handler in the Snakefile only
gathers what Snakemake knows (which sweeps were still to be made, how to drop a file's metadata record, which
fetch jobs this run ran, which files other running Snakemake processes have locked, whether ``--notemp`` was
given) and calls the functions here, which take plain arguments and are tested without Snakemake.

Nothing here imports torch or polars until a sweep is written: the module is imported when the Snakefile is
parsed.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

__all__ = [
    "Sweep",
    "write_partial_sweep",
    "write_partial_sweeps",
    "remove_stranded_weights",
    "remove_fetched_weights",
    "other_runs_locks",
]


#: a partial sweep's mtime: older than any input; not 0, which Snakemake reads as no modification time at all
STALE_MTIME = 1


@dataclass(frozen=True)
class Sweep:
    """One model's sweep table as the aggregate rule makes it: `metrics` holds one path per step, in order.

    `grid` is a Hub model's audited grid (None for local runs and toys) and `flagged_steps` the config's steps the
    audit left out, listed as the sweep rule lists them (anisweep.checkpoints.audit.with_audit). `forget` drops the
    record Snakemake keeps of `out` (its metadata), so that the next run never takes the partial table for the
    aggregate's output; None where there is no record to drop.
    """

    family: str
    model: str
    seed: int | None
    steps: Sequence[int]
    metrics: Sequence[Path]
    out: Path
    final_step: int | None = None
    forget: Callable[[], object] | None = None
    grid: Path | None = None
    flagged_steps: Sequence[int] = ()

    def __post_init__(self):
        if len(self.steps) != len(self.metrics):
            raise ValueError(
                f"{self.family}/{self.model}: {len(self.steps)} steps but {len(self.metrics)} metrics paths"
            )


def write_partial_sweep(sweep: Sweep) -> list[int] | None:
    """Write `sweep.out` from the metrics that exist, the steps without metrics listed as unfinished (a Hub
    model's with the audit's columns and the rows of the steps it left out, as in a complete sweep), and mark it
    out of date: its metadata record dropped (`sweep.forget`) and its mtime set to 1 s after 1 January 1970, older
    than any input of the sweep (the metrics that exist, the sweep's code), so that the next run makes it again,
    retrying the unfinished checkpoints, whatever becomes of them (retried, or dropped from the config) and also
    where none finished. Returns the unfinished steps, or None when every step has metrics (then the aggregate itself
    failed: its log says why, and nothing is written)."""
    from anisweep.checkpoints.audit import with_audit
    from anisweep.measures.sweep import aggregate
    from anisweep.tables import write_atomic

    paths = [Path(p) for p in sweep.metrics]
    if all(p.exists() for p in paths):
        return None
    ident = {"family": sweep.family, "model": sweep.model, "seed": sweep.seed}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = aggregate(paths, expected_steps=list(sweep.steps), ident=ident, final_step=sweep.final_step)
    if sweep.grid is not None:
        table = with_audit(table, sweep.grid, sweep.flagged_steps, sweep.seed)
    out = Path(sweep.out)
    write_atomic(table, out)
    os.utime(out, (STALE_MTIME, STALE_MTIME))
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
            unfinished = write_partial_sweep(sweep)
        except Exception as error:
            print(f"could not write the partial sweep {sweep.out}: {error}", file=stderr)
            continue
        if unfinished is not None:
            written.append(Path(sweep.out))
            print(
                f"partial sweep {sweep.out}: steps {unfinished} unfinished (status = unfinished); rerun to retry them",
                file=stderr,
            )
    return written


def remove_stranded_weights(
    keys: Iterable[str],
    root: str | Path = "weights",
    *,
    locked: Iterable[str | Path] = (),
    notemp: bool = False,
    stderr: TextIO | None = None,
) -> list[str]:
    """Remove the weights `root/key` of each of `keys`, the checkpoints (``{family}/{model}/step{N}``) whose
    weights THIS failed run fetched: those of a failed extract (kept until then, so that a retry of the job
    could read them) and those fetched for an extract that never started. Nothing of this run is in flight
    once it has failed, but another Snakemake run in the same directory may be: weights that run fetched are
    not in `keys`, and a folder named in `locked` (the files other running Snakemake processes have locked,
    see :func:`other_runs_locks`), or inside or above one, is kept. With `notemp` (Snakemake's --notemp: the
    user keeps every temporary file) nothing is removed. A rerun fetches them again (from the Hugging Face
    cache with fetch.keep_weights). Returns the keys removed."""
    if notemp:
        return []
    stderr = stderr or sys.stderr
    held = [_absolute(path) for path in locked]
    removed = []
    for key in keys:
        folder = Path(root) / key
        copies = list(folder.parent.glob(f"{folder.name}.read-by-*"))  # shared with the jobs that read them after
        if not folder.exists() and not copies:
            continue
        if any(_overlap(_absolute(f), path) for f in (folder, *copies) for path in held):
            print(f"kept the weights of {key}: another running Snakemake run needs them", file=stderr)
            continue
        for f in (folder, *copies):
            shutil.rmtree(f, ignore_errors=True)
        removed.append(key)
        print(f"removed the weights of {key} (not extracted)", file=stderr)
    return removed


def _absolute(path: str | Path) -> Path:
    return Path(os.path.abspath(os.path.normpath(path)))


def _overlap(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


_LOCK_FILE = re.compile(r"[0-9]+\.(input|output)\.lock")


def other_runs_locks(lockdir: str | Path, own: Iterable[str | Path] = ()) -> list[str]:
    """The files that running Snakemake processes have locked, from Snakemake's lock files in `lockdir`
    (``.snakemake/locks/{n}.input.lock`` and ``{n}.output.lock``: one path a line, as the workflow names it,
    written when a run starts and deleted when it ends), leaving out the lock files in `own` (this process's
    own locks). A lock file that goes while it is read is skipped."""
    lockdir = Path(lockdir)
    mine = {_absolute(path) for path in own}
    try:
        names = sorted(os.listdir(lockdir))
    except FileNotFoundError:
        return []
    paths = []
    for name in names:
        lockfile = lockdir / name
        if not _LOCK_FILE.fullmatch(name) or _absolute(lockfile) in mine or not lockfile.is_file():
            continue
        try:
            lines = lockfile.read_text().splitlines()
        except OSError:
            continue
        paths += [line.strip() for line in lines if line.strip()]
    return paths


def remove_fetched_weights(
    workflow, rule: str = "fetch", root: str | Path = "weights", *, stderr: TextIO | None = None
) -> list[str]:
    """The Snakefile's `onerror`: :func:`remove_stranded_weights` for the weights of the `rule` jobs this run
    ran (finished, or still running) from Snakemake's DAG, keeping those locked by other running Snakemake
    processes (their lock files in ``.snakemake/locks``, this process's own left out) and everything with
    --notemp. The DAG and the lock bookkeeping are Snakemake internals (checked with Snakemake 9): where they
    are not there to read, nothing is removed, and `stderr` says so. Returns the keys removed."""
    stderr = stderr or sys.stderr
    try:
        notemp = bool(getattr(workflow.storage_settings, "notemp", False))
        if notemp:
            return []
        dag = workflow.dag
        jobs = [*dag.finished_jobs, *_expand_groups(getattr(dag, "_running", ()))]
        outputs = {str(path) for job in jobs if job.rule.name == rule for path in job.output}
        persistence = workflow.persistence
        lockdir = Path(persistence._lockdir)
        own = list(persistence._lockfile.values())  # FilePersistence only
        locked = other_runs_locks(lockdir, own)
    except Exception as error:  # Snakemake internals: keep every weights folder rather than guess
        print(
            f"could not tell which weights this run fetched ({type(error).__name__}: {error}); none removed: "
            f"delete {root}/ yourself once no Snakemake run is going",
            file=stderr,
        )
        return []
    keys = []
    for output in sorted(outputs):
        try:
            keys.append(_absolute(output).relative_to(_absolute(root)).as_posix())
        except ValueError:
            print(f"kept {output}: not under {root}/", file=stderr)
    return remove_stranded_weights(keys, root, locked=locked, stderr=stderr)


def _expand_groups(jobs) -> list:
    out = []
    for job in list(jobs):
        if getattr(job, "is_group", lambda: False)():
            out.extend(job)
        else:
            out.append(job)
    return out
