"""The onerror handler's logic (anisweep.measures.partial), alone: no Snakemake run.
tests/workflow/test_reruns.py runs it inside a failed Snakemake run."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from anisweep.measures.partial import (
    Sweep,
    other_runs_locks,
    remove_fetched_weights,
    remove_stranded_weights,
    write_partial_sweep,
    write_partial_sweeps,
)
from anisweep.tables import METRIC_SCHEMA


def write_metrics(path: Path, step: int, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(
        [
            {
                "family": "toy",
                "model": "m",
                "seed": 3,
                "step": step,
                "tokens_seen": step * 10,
                "layer": 0,
                "head": None,
                "site": "resid",
                "metric": "avg_cos",
                "value": 0.5,
            }
        ],
        schema=METRIC_SCHEMA,
    ).write_parquet(path)
    os.utime(path, (mtime, mtime))
    return path


def sweep(tmp_path: Path, steps=(0, 8, 32), forget=None) -> Sweep:
    return Sweep(
        family="toy",
        model="m",
        seed=3,
        steps=list(steps),
        metrics=[tmp_path / f"step{s}" / "metrics.parquet" for s in steps],
        out=tmp_path / "sweep.parquet",
        final_step=max(steps),
        forget=forget,
    )


def statuses(path: Path) -> dict[int, str]:
    return dict(pl.read_parquet(path).select("step", "status").unique().iter_rows())


def test_a_partial_sweep_lists_the_missing_steps_and_is_out_of_date(tmp_path):
    forgotten = []
    s = sweep(tmp_path, forget=lambda: forgotten.append("out"))
    write_metrics(s.metrics[0], 0, mtime=2_000_000)
    write_metrics(s.metrics[2], 32, mtime=1_000_000)
    assert write_partial_sweep(s) == [8]
    assert statuses(s.out) == {0: "ok", 8: "missing", 32: "ok"}
    assert pl.read_parquet(s.out).filter(pl.col("step") == 8)["seed"].to_list() == [3]
    assert s.out.stat().st_mtime == 1_000_000 - 1  # older than its oldest input: the next run re-aggregates it
    assert forgotten == ["out"]  # and Snakemake's record of it is dropped


def test_no_metrics_at_all_lists_every_step(tmp_path):
    s = sweep(tmp_path)
    assert write_partial_sweep(s) == [0, 8, 32]
    assert statuses(s.out) == {0: "missing", 8: "missing", 32: "missing"}


def test_a_complete_sweep_is_left_to_the_aggregate(tmp_path):
    """Every step has metrics: the aggregate itself failed (its log says why); nothing is written."""
    s = sweep(tmp_path, forget=lambda: pytest.fail("forgot a sweep it did not write"))
    for step, path in zip(s.steps, s.metrics):
        write_metrics(path, step, mtime=1_000_000)
    assert write_partial_sweep(s) is None
    assert not s.out.exists()


def test_one_sweep_that_cannot_be_written_does_not_stop_the_others(tmp_path):
    bad = Sweep(
        family="toy",
        model="bad",
        seed=0,
        steps=[0],
        metrics=[tmp_path / "none.parquet"],
        out=tmp_path / "not-a-folder" / "sweep.parquet",
    )
    (tmp_path / "not-a-folder").write_text("a file where the folder should be")
    good = sweep(tmp_path / "good")
    err = io.StringIO()
    assert write_partial_sweeps([bad, good], stderr=err) == [good.out]
    assert f"could not write the partial sweep {bad.out}" in err.getvalue()
    missing = f"partial sweep {good.out}: steps [0, 8, 32] missing (status = missing); rerun to retry them"
    assert missing in err.getvalue()


def test_steps_and_metrics_must_match():
    with pytest.raises(ValueError, match="2 steps but 1 metrics"):
        Sweep(family="toy", model="m", seed=0, steps=[0, 1], metrics=[Path("a")], out=Path("b"))


def test_stranded_weights_are_removed_unless_notemp(tmp_path):
    weights = tmp_path / "weights"
    for key in ("toy/m/step0", "toy/m/step8"):
        (weights / key).mkdir(parents=True)
        (weights / key / "model.safetensors").write_bytes(b"0")
    assert remove_stranded_weights(["toy/m/step0", "toy/m/step8"], weights, notemp=True) == []
    assert (weights / "toy/m/step0").exists()
    err = io.StringIO()
    assert remove_stranded_weights(["toy/m/step0", "toy/m/step32"], weights, stderr=err) == ["toy/m/step0"]
    assert not (weights / "toy/m/step0").exists() and (weights / "toy/m/step8").exists()
    assert err.getvalue() == "removed the weights of toy/m/step0 (not extracted)\n"


def weights_on_disk(root: Path, *keys: str) -> None:
    for key in keys:
        (root / key).mkdir(parents=True)
        (root / key / "model.safetensors").write_bytes(b"0")


def on_disk(root: Path) -> list[str]:
    return sorted(p.parent.relative_to(root).as_posix() for p in root.rglob("model.safetensors"))


def test_weights_another_run_has_locked_are_kept(tmp_path):
    """A second run that fails beside a running first one: the first run's lock names the weights it is about
    to extract (or a file in them, or a folder above them); they stay, the rest of `keys` goes."""
    weights = tmp_path / "weights"
    weights_on_disk(weights, "toy/m/step0", "toy/m/step8", "toy/m/step16", "toy/n/step0", "toy/m/step64")
    locked = [
        weights / "toy/m/step8",
        f"{weights}/toy/m/step16/model.safetensors",
        weights / "toy/n",
        weights / "toy/m/step6",  # a prefix of step64's name, not a folder above it
    ]
    err = io.StringIO()
    keys = ["toy/m/step0", "toy/m/step8", "toy/m/step16", "toy/n/step0", "toy/m/step64", "toy/m/step32"]
    assert remove_stranded_weights(keys, weights, locked=locked, stderr=err) == ["toy/m/step0", "toy/m/step64"]
    assert on_disk(weights) == ["toy/m/step16", "toy/m/step8", "toy/n/step0"]
    assert "kept the weights of toy/m/step8: another running Snakemake run needs them" in err.getvalue()


def test_relative_lock_entries_match_relative_keys(tmp_path, monkeypatch):
    """Snakemake's locks name files as the workflow does, relative to its working directory."""
    monkeypatch.chdir(tmp_path)
    weights_on_disk(tmp_path / "weights", "toy/m/step0", "toy/m/step8")
    keys = ["toy/m/step0", "toy/m/step8"]
    removed = remove_stranded_weights(keys, "weights", locked=["weights/toy/m/step8"], stderr=io.StringIO())
    assert removed == ["toy/m/step0"]
    assert on_disk(tmp_path / "weights") == ["toy/m/step8"]


def write_lock(lockdir: Path, name: str, *paths: str) -> Path:
    lockdir.mkdir(parents=True, exist_ok=True)
    (lockdir / name).write_text("".join(f"{p}\n" for p in paths))
    return lockdir / name


def test_other_runs_locks_leave_out_this_process_own(tmp_path):
    """Snakemake's lock files: `{n}.input.lock` and `{n}.output.lock`, one path a line; this process's own
    (the first it found free) do not count, nor anything else in the folder."""
    locks = tmp_path / ".snakemake" / "locks"
    own = [
        write_lock(locks, "0.input.lock", "weights/toy/m/step0", "corpus.txt"),
        write_lock(locks, "0.output.lock", "weights/toy/m/step0"),
    ]
    write_lock(locks, "1.input.lock", "weights/toy/m/step8", "", "corpus.txt")
    write_lock(locks, "1.output.lock", "weights/toy/m/step8", "results/toy/m/step8/extract.json")
    write_lock(locks, "notes.lock", "weights/toy/m/step16")
    (locks / "2.input.lock").mkdir()
    assert other_runs_locks(locks, own) == [
        "weights/toy/m/step8",
        "corpus.txt",
        "weights/toy/m/step8",
        "results/toy/m/step8/extract.json",
    ]
    assert other_runs_locks(tmp_path / "none") == []


def job(rule: str, *output: str, group: bool = False):
    return SimpleNamespace(rule=SimpleNamespace(name=rule), output=list(output), is_group=lambda: group)


class Group(list):
    def is_group(self):
        return True


def fake_workflow(tmp_path: Path, finished, running=(), notemp=False):
    """What remove_fetched_weights reads of Snakemake's workflow object (checked against Snakemake 9 by
    tests/workflow/test_concurrent_runs.py)."""
    locks = tmp_path / ".snakemake" / "locks"
    own = {
        "input": write_lock(locks, "0.input.lock", *(f"weights/toy/m/step{s}" for s in (0, 8, 16, 32))),
        "output": write_lock(locks, "0.output.lock", *(f"weights/toy/m/step{s}" for s in (0, 8, 16, 32))),
    }
    return SimpleNamespace(
        storage_settings=SimpleNamespace(notemp=notemp),
        dag=SimpleNamespace(finished_jobs=iter(finished), _running=list(running)),
        persistence=SimpleNamespace(_lockdir=str(locks), _lockfile=own),
    )


def test_a_failed_run_removes_only_the_weights_it_fetched(tmp_path, monkeypatch):
    """Fetched by this run: step0 (finished) and step8 (its fetch still running, in a group); step16 too, but
    another running Snakemake has locked it; step32 is another run's download, not this run's: it stays.
    This process's own lock names them all and does not count."""
    monkeypatch.chdir(tmp_path)
    weights = tmp_path / "weights"
    weights_on_disk(weights, "toy/m/step0", "toy/m/step8", "toy/m/step16", "toy/m/step32")
    workflow = fake_workflow(
        tmp_path,
        finished=[
            job("fetch", "weights/toy/m/step0"),
            job("fetch", "weights/toy/m/step16"),
            job("extract", "results/toy/m/step32/extract.json"),
        ],
        running=[Group([job("fetch", "weights/toy/m/step8")])],
    )
    write_lock(tmp_path / ".snakemake" / "locks", "1.input.lock", "weights/toy/m/step16")
    err = io.StringIO()
    assert remove_fetched_weights(workflow, stderr=err) == ["toy/m/step0", "toy/m/step8"]
    assert on_disk(weights) == ["toy/m/step16", "toy/m/step32"]
    assert "kept the weights of toy/m/step16" in err.getvalue()


def test_notemp_keeps_what_this_run_fetched(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    weights_on_disk(tmp_path / "weights", "toy/m/step0")
    workflow = fake_workflow(tmp_path, finished=[job("fetch", "weights/toy/m/step0")], notemp=True)
    assert remove_fetched_weights(workflow, stderr=io.StringIO()) == []
    assert on_disk(tmp_path / "weights") == ["toy/m/step0"]


@pytest.mark.parametrize("missing", ["dag", "persistence"])
def test_without_snakemakes_internals_nothing_is_removed(tmp_path, monkeypatch, missing):
    """The DAG and the lock bookkeeping are Snakemake internals: without them (another Snakemake version, the
    database persistence backend) every weights folder stays, and stderr says so."""
    monkeypatch.chdir(tmp_path)
    weights_on_disk(tmp_path / "weights", "toy/m/step0")
    workflow = fake_workflow(tmp_path, finished=[job("fetch", "weights/toy/m/step0")])
    if missing == "persistence":
        workflow.persistence = SimpleNamespace(_read_locks=lambda: iter(()))  # DbPersistence: no lock files
    else:
        del workflow.dag
    err = io.StringIO()
    assert remove_fetched_weights(workflow, stderr=err) == []
    assert on_disk(tmp_path / "weights") == ["toy/m/step0"]
    assert err.getvalue().startswith("could not tell which weights this run fetched (AttributeError")
    assert "none removed" in err.getvalue()


def test_importing_it_imports_neither_torch_nor_polars():
    """The Snakefile imports it when it is parsed (every `snakemake -n`)."""
    code = "import sys, anisweep.measures.partial; print(sorted({'torch', 'polars'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
