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


def test_a_partial_sweep_lists_the_unfinished_steps_and_is_out_of_date(tmp_path):
    forgotten = []
    s = sweep(tmp_path, forget=lambda: forgotten.append("out"))
    write_metrics(s.metrics[0], 0, mtime=2_000_000)
    write_metrics(s.metrics[2], 32, mtime=1_000_000)
    assert write_partial_sweep(s) == [8]
    assert statuses(s.out) == {0: "ok", 8: "unfinished", 32: "ok"}
    assert pl.read_parquet(s.out).filter(pl.col("step") == 8)["seed"].to_list() == [3]
    assert s.out.stat().st_mtime < 1_000_000  # older than its oldest input: the next run re-aggregates it
    assert forgotten == ["out"]  # and Snakemake's record of it is dropped


def test_no_metrics_at_all_lists_every_step_and_is_older_than_the_sweeps_code(tmp_path):
    """A model none of whose checkpoints finished (a run stopped before its first metrics): no metrics to be
    older than, so the table must still be older than the inputs the sweep job always has, its code, or the
    next run takes it for up to date and never retries the model (issue 43)."""
    import anisweep.measures.sweep

    s = sweep(tmp_path)
    assert write_partial_sweep(s) == [0, 8, 32]
    assert statuses(s.out) == {0: "unfinished", 8: "unfinished", 32: "unfinished"}
    code = Path(anisweep.measures.sweep.__file__)
    assert 0 < s.out.stat().st_mtime < code.stat().st_mtime  # Snakemake reads an mtime of 0 as none at all


def write_grid_of(path: Path) -> Path:
    """A planted audit of pythia-70m's grid (anisweep.checkpoints.audit): step 0 serves main's bytes, step 2
    shares a shard with main, step 4 has no weights, step 8 no branch; steps 1 and 143000 are sound."""
    from anisweep.checkpoints.audit import GRID_SCHEMA

    rows = {
        0: {"status": "duplicate", "repeats": "step143000", "repeats_step": 143000},
        1: {"status": "ok"},
        2: {"status": "partial", "shared_with": ["main", "step143000"]},
        4: {"status": "no_weights", "note": "step4: no weights"},
        8: {"status": "missing", "note": "step8: no such branch"},
        143000: {"status": "ok"},
    }
    ident = {"family": "pythia", "model": "pythia-70m"}
    table = pl.DataFrame(
        [{**ident, "step": step, "name": f"step{step}", **r} for step, r in rows.items()], schema=GRID_SCHEMA
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    table.write_parquet(path)
    return path


def test_a_partial_sweep_keeps_the_audit_as_a_complete_sweep_does(tmp_path):
    """A Hub model's partial sweep (issue 43): the `audit` and `repeats` columns, one row for each step the audit
    left out with its status, as the sweep rule writes them; the step whose jobs failed is `unfinished`, never the
    audit's `missing` (no such branch). The complete sweep of the same model (the CLI, as the rule runs it, once
    every step has metrics) has the same columns and the same rows for the flagged steps."""
    from anisweep import cli

    grid = write_grid_of(tmp_path / "grid.parquet")
    swept = [1, 2, 143000]  # the config's steps the audit did not leave out
    s = Sweep(
        family="pythia",
        model="pythia-70m",
        seed=None,
        steps=swept,
        metrics=[tmp_path / f"step{step}" / "metrics.parquet" for step in swept],
        out=tmp_path / "partial" / "sweep.parquet",
        final_step=143000,
        grid=grid,
        flagged_steps=[0, 4, 8],
    )
    for path, step in zip(s.metrics[:2], swept[:2]):
        write_metrics(path, step, mtime=1_000_000)
    assert write_partial_sweep(s) == [143000]
    partial = pl.read_parquet(s.out)
    rows = {r["step"]: r for r in partial.iter_rows(named=True)}
    assert {step: r["status"] for step, r in rows.items()} == {
        0: "duplicate",
        1: "ok",
        2: "ok",
        4: "no_weights",
        8: "missing",
        143000: "unfinished",
    }
    assert {step: r["audit"] for step, r in rows.items()} == {
        0: "duplicate",
        1: "ok",
        2: "partial",
        4: "no_weights",
        8: "missing",
        143000: "ok",
    }
    assert (rows[0]["repeats"], rows[0]["duplicate_of_step"]) == ("step143000", 143000)
    assert rows[2]["repeats"] == "main, step143000"

    write_metrics(s.metrics[2], 143000, mtime=1_000_000)
    complete = tmp_path / "complete" / "sweep.parquet"
    args = ["sweep", "--out", str(complete), "--expected-steps", "1,2,143000", "--final-step", "143000"]
    args += ["--audit", str(grid), "--flagged-steps", "0,4,8", *map(str, s.metrics)]
    assert cli.main(args) == 0
    complete = pl.read_parquet(complete)
    assert complete.columns == partial.columns
    flagged = pl.col("step").is_in([0, 4, 8])
    assert complete.filter(flagged).equals(partial.filter(flagged))


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
    unfinished = f"partial sweep {good.out}: steps [0, 8, 32] unfinished (status = unfinished); rerun to retry them"
    assert unfinished in err.getvalue()


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


def test_a_failed_run_removes_the_copies_fetch_shared(tmp_path, monkeypatch):
    """step0 was extracted (its folder gone), its logit lens never ran: the copy fetch shared with it goes too."""
    monkeypatch.chdir(tmp_path)
    weights = tmp_path / "weights"
    weights_on_disk(weights, "toy/m/step0.read-by-logit_lens", "toy/m/step8", "toy/m/step8.read-by-weights")
    workflow = fake_workflow(
        tmp_path,
        finished=[
            job("fetch", "weights/toy/m/step0"),
            job("fetch", "weights/toy/m/step8"),
        ],
    )
    assert remove_fetched_weights(workflow, stderr=io.StringIO()) == ["toy/m/step0", "toy/m/step8"]
    assert on_disk(weights) == []


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


@pytest.mark.parametrize("command", ["plot-survey", "plot-family", "plot-families", "plot"])
def test_no_figure_is_drawn_from_a_partial_sweep(tmp_path, capsys, command):
    """The survey (and every figure of sweeps) counts a model only once its sweep completed: a partial one is an
    error naming it and its unfinished steps, before anything is drawn."""
    from anisweep import cli

    s = sweep(tmp_path)
    write_metrics(s.metrics[0], 0, mtime=1_000_000)
    write_partial_sweep(s)
    out = tmp_path / "figures"
    args = {
        "plot-survey": ["--out-dir", str(out), str(s.out)],
        "plot-family": ["--out", str(out / "f.png"), str(s.out)],
        "plot-families": ["--out", str(out / "f.png"), str(s.out)],
        "plot": ["--sweep", str(s.out), "--out-dir", str(out)],
    }[command]
    assert cli.main([command, *args]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (
        f"ValueError: {s.out}: a partial sweep (steps 8, 32 unfinished: a failed or interrupted run wrote it); run "
        "the workflow again to complete it before drawing figures from it"
    )
    assert not out.exists()
