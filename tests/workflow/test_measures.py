"""A user's measures through the whole workflow: docs/measures.md's package installed (pip, with its entry point),
its rows in metrics and sweep, its figures and glossary entries, and the reruns docs/measures.md promises."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml
from docs_measures import PYPROJECT, docs_package

from conftest import job_stats, snakemake_command

ROOT = Path(__file__).resolve().parents[2]
TINY = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text())
NEOX = "results/toy/toy-neox"
STEPS = [0, 8]

# a whole (small) sweep, then dry runs; its Snakemake runs share one warm worker
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_worker")]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """docs/measures.md's package, installed with pip into a folder of its own (its entry point declares the
    stream measure); the workflow sees it through PYTHONPATH, as any installed package."""
    root = tmp_path_factory.mktemp("mymeasures")
    source = docs_package(root / "src")
    (source / "pyproject.toml").write_text(PYPROJECT)
    site = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", str(site)]
        + [str(source)],
        check=True,
        capture_output=True,
    )
    assert (site / "mymeasures" / "heads.py").is_file()
    return site


def write_config(path: Path, measures: list[str], installed: dict | None = None) -> Path:
    config = {
        **TINY,
        "models": [{"family": "toy", "name": "toy-neox", "steps": STEPS}],
        "toy": {"toy-neox": TINY["toy"]["toy-neox"]},
        "gradients": {"enabled": False},
        "measures": measures,
        **({"installed_measures": installed} if installed is not None else {}),
    }
    path.write_text(yaml.safe_dump(config))
    return path


def snakemake(workdir: Path, site: Path, config: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    command = snakemake_command(workdir, "--configfile", str(config), "--cores", "2", *args)
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)


def planned(workdir: Path, site: Path, config: Path) -> dict[str, int]:
    done = snakemake(workdir, site, config, "-n")
    assert done.returncode == 0, done.stderr[-3000:]
    return job_stats(done)


@pytest.fixture(scope="module")
def swept(installed, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("measures_run")
    config = write_config(workdir / "config.yaml", ["mymeasures.rank:effective_rank"])
    done = snakemake(workdir, installed, config)
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir, config


def test_both_measures_land_in_the_tables_figures_and_glossary(swept):
    workdir, _ = swept
    sweep = pl.read_parquet(workdir / NEOX / "sweep.parquet")
    rank = sweep.filter(pl.col("measure") == "effective_rank")
    norm = sweep.filter(pl.col("measure") == "attention_output_norm")
    assert sorted(rank["step"].unique()) == STEPS and set(rank["site"]) == {"resid"} and set(rank["status"]) == {"ok"}
    assert rank.height == len(STEPS) * (TINY["toy"]["toy-neox"]["n_layers"] + 1)
    n_heads, n_layers = TINY["toy"]["toy-neox"]["n_heads"], TINY["toy"]["toy-neox"]["n_layers"]
    assert norm.height == len(STEPS) * n_layers * n_heads and set(norm["site"]) == {"attention_output"}
    qk_norm = sweep.filter(pl.col("measure") == "qk_norm")  # the weight measure, from the weights alone
    assert qk_norm.height == len(STEPS) * n_layers * n_heads and (qk_norm["value"] > 0).all()
    metrics = pl.read_parquet(workdir / NEOX / "step8" / "metrics.parquet")
    assert {"effective_rank", "attention_output_norm", "attention"} <= set(metrics["measure"])
    for name in ("effective_rank", "attention_output_norm", "qk_norm"):
        assert (workdir / NEOX / "figures" / f"measure_{name}.png").stat().st_size > 10_000
    glossary = (workdir / "results" / "glossary.md").read_text()
    assert (
        "| `effective_rank` | table | `hidden` | `measure_effective_rank.png` | Effective rank of the sampled residual"
        in glossary
    )
    assert (
        "| `attention_output_norm` | stream | `attention_output` | `measure_attention_output_norm.png` | Mean L2 norm"
        in glossary
    )
    assert "| `qk_norm` | weight | `attention` | `measure_qk_norm.png` | Frobenius norm of each head's W_QK" in glossary


def test_editing_a_measure_reruns_exactly_its_jobs(swept, installed):
    """A table measure's edit reruns its own jobs and what reads metrics, never a model; a stream measure's
    reruns extract at every checkpoint, and undoing the edit before a run reruns nothing (docs/measures.md, What
    reruns)."""
    workdir, config = swept
    rank, heads = installed / "mymeasures" / "rank.py", installed / "mymeasures" / "heads.py"
    weights = installed / "mymeasures" / "weights.py"
    original = rank.read_text(), heads.read_text(), weights.read_text()
    after_metrics = {
        "metrics": len(STEPS),
        "sweep": 1,
        "plot_measure": 3,  # each measure's figure reads the sweep
        "plot_model": 1,
        "plot_family": 1,
        "plot_spectra": 1,
        "phases": 1,  # the phase rule reads the sweep
        "plot_phases": 1,
        "plot_survey": 1,
        "explore": 1,  # the explorer reads every sweep
        "plot_logit_lens": 1,
        "glossary": 1,
    }
    try:
        rank.write_text(original[0] + "\n# edited\n")
        assert planned(workdir, installed, config) == {"table_measure": len(STEPS), **after_metrics}
        rank.write_text(original[0])
        weights.write_text(original[2] + "\n# edited\n")  # a weight measure: its jobs read the weights, no model runs
        assert planned(workdir, installed, config) == {"weight_measure": len(STEPS), **after_metrics}
        weights.write_text(original[2])
        rank.write_text(original[0])
        heads.write_text(original[1] + "\n# edited\n")
        plan = planned(workdir, installed, config)
        assert plan["extract"] == len(STEPS) and plan["fetch"] == len(STEPS)
        heads.write_text(original[1])
        assert planned(workdir, installed, config) == {}
    finally:
        rank.write_text(original[0])
        heads.write_text(original[1])
        weights.write_text(original[2])


def test_the_same_code_installed_elsewhere_reruns_nothing(swept, installed, tmp_path):
    """An editable install and a regular one of the same package: another path, the same code."""
    workdir, config = swept
    elsewhere = tmp_path / "site"
    shutil.copytree(installed, elsewhere)
    assert planned(workdir, elsewhere, config) == {}


def test_a_dry_run_with_a_stream_measure_added_changes_nothing(swept, installed):
    """Issue 43: `snakemake -n` with a stream measure added plans its model runs and writes nothing: the record of
    the stream measures' code (resources/stream_measure_code.json) and every result stay byte for byte as they
    were, so that a dry run on the unchanged config then plans nothing."""
    workdir, config = swept
    record = workdir / "resources" / "stream_measure_code.json"
    assert set(json.loads(record.read_text())) == {"attention_output_norm"}  # written by the run
    before = files_of(workdir)
    added = write_config(
        workdir / "with_sinks.yaml", ["mymeasures.rank:effective_rank", "mymeasures.sinks:AttentionSink"]
    )
    plan = planned(workdir, installed, added)
    assert (plan.get("stream_measure_code"), plan.get("extract")) == (1, len(STEPS)), plan
    assert files_of(workdir) == before
    assert planned(workdir, installed, config) == {}


def files_of(workdir: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of a run's results and resources, with its modification time."""
    return {
        p.relative_to(workdir).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for folder in ("results", "resources")
        for p in sorted((workdir / folder).rglob("*"))
        if p.is_file()
    }


def test_removing_a_measure_reruns_metrics_not_models(swept, installed):
    workdir, _ = swept
    config = write_config(workdir / "without_rank.yaml", [])
    plan = planned(workdir, installed, config)
    assert plan.get("metrics") == len(STEPS) and "extract" not in plan and "table_measure" not in plan


def test_removing_a_stream_measure_runs_no_model_and_leaves_none_of_its_files(swept, installed, tmp_path):
    """The installed package's stream measure left out (installed_measures): metrics onwards, no fetch or extract;
    after the run neither measure's tables or figure remain."""
    workdir = tmp_path / "run"
    shutil.copytree(swept[0], workdir, symlinks=True)
    config = write_config(workdir / "without_both.yaml", [], installed={"exclude": ["mymeasures"]})
    plan = planned(workdir, installed, config)
    assert plan.get("metrics") == len(STEPS) and not {"fetch", "extract", "table_measure"} & set(plan)
    done = snakemake(workdir, installed, config, f"{NEOX}/sweep.parquet")  # the figures are not what is checked
    assert done.returncode == 0, done.stderr[-3000:]
    left = [p for p in (workdir / NEOX).rglob("*") if "attention_output_norm" in p.name or "effective_rank" in p.name]
    assert left == []
    sweep = pl.read_parquet(workdir / NEOX / "sweep.parquet")
    assert not {"effective_rank", "attention_output_norm"} & set(sweep["measure"])


def test_an_entry_that_does_not_import_stops_the_run_before_any_job(swept, installed):
    workdir, _ = swept
    config = write_config(workdir / "typo.yaml", ["mymeasures.rnak:effective_rank"])
    done = snakemake(workdir, installed, config, "-n")
    assert done.returncode != 0
    text = done.stdout + done.stderr
    assert "config: measures: 'mymeasures.rnak:effective_rank' does not import (ModuleNotFoundError" in text
    assert "Job stats" not in text


def test_a_failing_measure_names_itself_and_the_checkpoint(swept, installed, tmp_path):
    workdir, _ = swept
    broken = tmp_path / "broken"
    (broken / "brokenmeasure").mkdir(parents=True)
    (broken / "brokenmeasure" / "__init__.py").write_text(
        "from anisweep.measures.registry import table_measure\n\n\n"
        "@table_measure(tables=['qk'])\n"
        "def broken(tables):\n"
        "    raise KeyError('q_mean_typo')\n"
    )
    config = write_config(workdir / "broken.yaml", ["mymeasures.rank:effective_rank", "brokenmeasure:broken"])
    site = Path(os.pathsep.join([str(installed), str(broken)]))
    done = snakemake(workdir, site, config, "--keep-going")
    assert done.returncode != 0
    text = done.stdout + done.stderr
    assert "measure 'broken' (brokenmeasure:broken) failed at toy/toy-neox/step0: KeyError: 'q_mean_typo'" in text
    assert not (workdir / NEOX / "step0" / "measures" / "broken.parquet").exists()


def test_stream_measures_and_live_models_are_a_config_error(swept, installed):
    """A live model's tables come from the training callback, which runs no stream measure."""
    workdir, _ = swept
    config = write_config(workdir / "live.yaml", [])
    live = yaml.safe_load(config.read_text())
    live["toy"]["toy-neox"]["live"] = True
    config.write_text(yaml.safe_dump(live))
    done = snakemake(workdir, installed, config, "-n")
    assert done.returncode != 0
    text = done.stdout + done.stderr
    assert "stream measures ['attention_output_norm'] run in extract's forward pass" in text
    assert "the live models ['toy-neox']" in text
