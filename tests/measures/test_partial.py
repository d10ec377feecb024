"""The onerror handler's logic (anisweep.measures.partial), alone: no Snakemake run.
tests/workflow/test_reruns.py runs it inside a failed Snakemake run."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from anisweep.measures.partial import Sweep, remove_stranded_weights, write_partial_sweep, write_partial_sweeps
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


def test_importing_it_imports_neither_torch_nor_polars():
    """The Snakefile imports it when it is parsed (every `snakemake -n`)."""
    code = "import sys, anisweep.measures.partial; print(sorted({'torch', 'polars'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
