"""Partial reruns and failure handling: one checkpoint at a time, nothing lost (docs/reruns.md).

One small sweep (toy-neox, checkpoints 0, 8 and 32) is run once for the module; dry runs (`-n`) show what a
change would schedule, and the tests that break things (corrupt weights, SIGKILL) work on copies of it.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import polars as pl
import psutil  # a dependency of snakemake
import pytest
import yaml

import anisweep.extract.run
from anisweep import cli
from anisweep.measures.sweep import aggregate, analysed
from anisweep.tables import EXTRACT_TABLES

from conftest import job_stats, snakemake_command
from warm_snakemake import dry_run


def extract_outputs(folder: Path) -> list[Path]:
    """What extract (and metrics, which reads it) wrote of a checkpoint's folder."""
    names = [f"{table}.parquet" for table in EXTRACT_TABLES] + ["extract.json", "metrics.parquet"]
    return [folder / name for name in names if (folder / name).exists()]


ROOT = Path(__file__).resolve().parents[2]
TINY = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text())
PACKAGE = Path(anisweep.__file__).parent  # where the workflow reads the analysis sources from
NEOX = "results/toy/toy-neox"
STEPS = [0, 8, 32]  # swept by the module run
GRID = [0, 4, 8, 32]  # saved by the toy run: step 4 is there to grow the sweep
EXTRACT = TINY["extract"]

# the whole DAG, then reruns of it; its Snakemake runs share one warm worker
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_worker")]


def write_config(path: Path, models: list[dict]) -> Path:
    config = {**TINY, "models": models, "toy": {name: {**spec, "steps": GRID} for name, spec in TINY["toy"].items()}}
    config["gradients"] = {"enabled": False}  # reruns of the sweep itself; tests/tangent/test_gradients.py has the rest
    path.write_text(yaml.safe_dump(config))
    return path


def neox(steps=STEPS) -> dict:
    return {"family": "toy", "name": "toy-neox", "steps": steps}


def snakemake(workdir: Path, configfile: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(command(workdir, configfile, *args), capture_output=True, text=True, timeout=timeout)


def command(workdir: Path, configfile: Path, *args: str) -> list[str]:
    return snakemake_command(workdir, "--configfile", str(configfile), "--cores", "2", *args)


def planned(workdir: Path, configfile: Path, *args: str) -> dict[str, int]:
    done = dry_run(command(workdir, configfile, "-n", *args), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return job_stats(done)


def mtimes(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()}


def copy_run(run: dict, tmp_path: Path) -> Path:
    """A copy of the module's finished run (results, toy checkpoints, Snakemake's metadata), mtimes kept."""
    workdir = tmp_path / "work"
    shutil.copytree(run["workdir"], workdir, symlinks=True)
    return workdir


def statuses(sweep: Path) -> dict[int, str]:
    return dict(pl.read_parquet(sweep).select("step", "status").unique().iter_rows())


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("reruns")
    workdir = root / "work"
    workdir.mkdir()
    configfile = write_config(root / "sweep.yaml", [neox()])
    done = snakemake(workdir, configfile)
    assert done.returncode == 0, done.stderr[-5000:]
    return {"root": root, "workdir": workdir, "config": configfile}


# ---------------------------------------------------------------------------------------------- disk


def test_weights_on_disk_are_only_those_in_flight(run):
    """extract outranks fetch: with 2 cores, at most 2 checkpoints' weights exist at any time, never the
    whole sweep's (Snakemake alone runs every fetch first); none is left once the sweep is done."""
    log = max((run["workdir"] / ".snakemake" / "log").glob("*.snakemake.log")).read_text().splitlines()
    on_disk, most, rule = set(), 0, None
    for line in log:
        if m := re.match(r"(?:local)?rule (\w+):", line):
            rule = m[1]
        elif rule == "fetch" and (m := re.match(r"\s+output: (weights/\S+)", line)):
            on_disk.add(m[1])
            most = max(most, len(on_disk))
        elif m := re.match(r"Removing temporary output (weights/\S+)\.", line):
            on_disk.discard(m[1])
    assert most <= 2 < len(STEPS), log
    assert not on_disk
    assert not [p for p in (run["workdir"] / "weights").rglob("*") if p.is_file()]


# ---------------------------------------------------------------------------------------------- reruns


def test_one_checkpoint_alone_then_the_sweep_tables(run):
    """`snakemake .../step8/metrics.parquet --forcerun extract` redoes that checkpoint only; the next plain run
    redoes the sweep tables and figures, not another checkpoint."""
    workdir, configfile = run["workdir"], run["config"]
    before = mtimes(workdir / NEOX)
    done = snakemake(workdir, configfile, f"{NEOX}/step8/metrics.parquet", "--forcerun", "extract")
    assert done.returncode == 0, done.stderr[-3000:]
    # the lens reads extract's samples
    assert job_stats(done) == {"fetch": 1, "extract": 1, "logit_lens": 1, "metrics": 1}
    after = mtimes(workdir / NEOX)
    changed = {name for name in after if after[name] != before.get(name)}
    assert {"step8/metrics.parquet", "step8/qk.parquet", "step8/extract.json"} <= changed
    assert all(name.startswith("step8/") for name in changed), changed

    # Then the sweep tables: a plain run re-aggregates if the metrics changed (Snakemake compares the checksums
    # of small inputs, and this deterministic toy rerun wrote the same bytes), never another checkpoint.
    assert not {"train_toy", "fetch", "extract", "metrics"} & set(planned(workdir, configfile))
    at_once = planned(workdir, configfile, "--forcerun", f"{NEOX}/step8/extract.json")  # both in one command
    per_model = {"sweep": 1, "plot_model": 1, "plot_family": 1, "qk_svd": 1, "plot_score_hist": 1, "plot_spectra": 1}
    per_model |= {"plot_logit_lens": 1}  # the circuit figures read weights.parquet, which no model run changes
    per_model |= {"compare_pair": 3, "compare_sweep": 1, "plot_compare": 1}  # the pairs step 8 is in: 8-32, 8-0, 32-8
    per_model |= {"phases": 1, "plot_phases": 1}  # the phases read the sweep
    across_models = {"plot_survey": 1, "explore": 1}
    assert at_once == {"fetch": 1, "extract": 1, "logit_lens": 1, "metrics": 1, **per_model, **across_models}


def test_results_from_before_the_outlier_tables_rerun_their_model_jobs(run, tmp_path):
    """docs/reruns.md: over a results folder written before extract wrote issue 38's tables (massive, sinks,
    sink_keys), the updated metrics code reruns every checkpoint's metrics, which need those tables: the model jobs
    of the checkpoints that lack them run again (here step 8's alone), no other checkpoint's. (Missing tables
    alone, under up-to-date metrics, rerun nothing: Snakemake does not remake an intermediate file nobody needs.)"""
    workdir = copy_run(run, tmp_path)
    for name in ("massive", "sinks", "sink_keys"):
        (workdir / NEOX / "step8" / f"{name}.parquet").unlink()
    assert not {"fetch", "extract"} & set(planned(workdir, run["config"]))
    plan = edited_plan(workdir, run["config"], "measures/metrics.py")
    assert {rule: plan.get(rule, 0) for rule in ("train_toy", "fetch", "extract", "metrics")} == {
        "train_toy": 0,
        "fetch": 1,
        "extract": 1,
        "metrics": len(STEPS),
    }


def test_results_of_an_older_table_format_rerun_every_model_job(run, tmp_path):
    """docs/reruns.md: over a results folder whose extract wrote fewer columns (before EXTRACT_FORMAT 2: no M2
    columns in hidden_stats, which the metrics now read), every checkpoint's model job runs again, and what reads
    it, rather than the metrics failing on the missing columns. Stood in for by taking the format out of the params
    Snakemake recorded for the extract jobs, as a package without it recorded none."""
    workdir = copy_run(run, tmp_path)
    recorded = 0
    for record in (workdir / ".snakemake" / "metadata").rglob("*"):
        if not record.is_file():
            continue
        try:
            meta = json.loads(record.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        params = meta.get("params") or []
        kept = [p for p in params if "extract tables format" not in str(p)]
        if kept != params:
            record.write_text(json.dumps(meta | {"params": kept}))
            recorded += 1
    assert recorded >= len(STEPS)  # every extract output of every step
    plan = planned(workdir, run["config"])
    assert {rule: plan.get(rule, 0) for rule in ("train_toy", "fetch", "extract", "metrics", "sweep")} == {
        "train_toy": 0,
        "fetch": len(STEPS),
        "extract": len(STEPS),
        "metrics": len(STEPS),
        "sweep": 1,
    }


def test_results_from_before_sample_precision_rerun_nothing_at_the_default_and_every_model_job_at_int8(run, tmp_path):
    """docs/reruns.md: over a results folder of a package without extract.sample_precision (its float32 vectors;
    stood in for by taking the setting out of the params Snakemake recorded, as the default float32 records none),
    the default reruns nothing and `sample_precision: int8` every checkpoint's model job, then what reads it."""
    workdir = copy_run(run, tmp_path)
    assert not {"fetch", "extract", "metrics"} & set(planned(workdir, run["config"]))
    as_int8 = write_config(tmp_path / "int8.yaml", [neox()])
    config = yaml.safe_load(as_int8.read_text())
    config["extract"]["sample_precision"] = "int8"
    as_int8.write_text(yaml.safe_dump(config))
    plan = planned(workdir, as_int8)
    assert {rule: plan.get(rule, 0) for rule in ("fetch", "extract", "metrics")} == dict.fromkeys(
        ("fetch", "extract", "metrics"), len(STEPS)
    )


def test_a_models_group_redraws_the_survey_figures_alone(run):
    """`group` labels a model for the survey figures' panels: it changes no table."""
    root, workdir = run["root"], run["workdir"]
    base = planned(workdir, run["config"])
    grouped = planned(workdir, write_config(root / "grouped.yaml", [{**neox(), "group": "token-level"}]))
    assert grouped.get("plot_survey", 0) == 1 + base.get("plot_survey", 0)
    assert {rule: n for rule, n in grouped.items() if rule != "plot_survey"} == {
        rule: n for rule, n in base.items() if rule != "plot_survey"
    }


def test_growing_the_sweep_schedules_only_the_new_checkpoints(run):
    root, workdir = run["root"], run["workdir"]
    base = planned(workdir, run["config"])

    more_steps = planned(workdir, write_config(root / "steps.yaml", [neox(GRID)]))
    assert more_steps.get("fetch", 0) - base.get("fetch", 0) == 1
    assert more_steps.get("extract", 0) - base.get("extract", 0) == 1
    assert "train_toy" not in more_steps and more_steps["sweep"] == 1 and more_steps["plot_model"] == 1
    assert more_steps["phases"] == 1 and more_steps["plot_phases"] == 1  # the model's phases, read from its sweep

    bert = {"family": "toy", "name": "toy-bert", "steps": [0, 32]}
    more_models = planned(workdir, write_config(root / "models.yaml", [neox(), bert]))
    assert more_models["train_toy"] == 1
    assert more_models["extract"] - base.get("extract", 0) == 2
    assert more_models["sweep"] - base.get("sweep", 0) == 1  # toy-bert's: toy-neox's sweep stands
    assert more_models["plot_family"] == 1


@pytest.fixture(scope="module")
def compared(run, tmp_path_factory) -> dict:
    """A copy of the module's run brought up to date (the tests before may have left jobs to do), for the dry runs
    of the comparisons' reruns."""
    root = tmp_path_factory.mktemp("compare-reruns")
    workdir = root / "work"
    shutil.copytree(run["workdir"], workdir, symlinks=True)
    done = snakemake(workdir, run["config"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert planned(workdir, run["config"]) == {}
    return {"root": root, "workdir": workdir, "config": run["config"]}


def test_a_new_step_compares_only_the_pairs_it_enters(compared):
    """Step 4 between 0 and 8: its pairs against the final step (32) and the previous one (0), and step 8's new
    `previous` pair (against 4); no other pair, no layer matrix (the first and final steps stand)."""
    after = planned(compared["workdir"], write_config(compared["root"] / "compare-steps.yaml", [neox(GRID)]))
    assert after["compare_pair"] == 3 and after["compare_sweep"] == 1 and after["plot_compare"] == 1
    assert "compare_layers" not in after


def compare_config(compared: dict, **compare) -> Path:
    config = yaml.safe_load(compared["config"].read_text())
    config["compare"] = compare
    path = compared["root"] / "compare.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


COMPARE_TABLES = {"compare_sweep": 1, "plot_compare": 1}


@pytest.mark.parametrize(
    ("compare", "expected"),
    [
        (
            {
                "against": ["previous", "final"],
                "layer_steps": ["final", "first"],
                "svcca_variance": 0.99,
                "cca_max_width": 1024,
            },
            {},
        ),
        ({"cka_debiased": True}, {"compare_pair": 4, **COMPARE_TABLES}),
        ({"cca_max_width": None}, {"compare_pair": 4, **COMPARE_TABLES}),
        ({"sites": ["resid", "final_ln_out"]}, {"compare_pair": 4, "compare_layers": 2, **COMPARE_TABLES}),
        ({"against": ["final"]}, COMPARE_TABLES),
        # step 0 against 8 is new; step 32 against 8 is the table its `previous` pair already wrote
        ({"against": [8]}, {"compare_pair": 1, **COMPARE_TABLES}),
        ({"layer_steps": [8]}, {"compare_layers": 1, **COMPARE_TABLES}),
    ],
    ids=["order-and-defaults", "cka-debiased", "cca-max-width", "sites", "final-only", "named-step", "layer-steps"],
)
def test_compare_config_changes_rerun_what_docs_reruns_says(compared, compare, expected):
    """docs/reruns.md, the `compare:` rows: only comparison jobs, never a model run or a checkpoint's metrics."""
    assert planned(compared["workdir"], compare_config(compared, **compare)) == expected


@pytest.mark.parametrize(
    ("module", "reruns", "never"),
    [
        ("measures/metrics.py", {"metrics": 3, "sweep": 1, "plot_model": 1, "plot_family": 1}, ()),
        ("measures/sweep.py", {"sweep": 1, "phases": 1, "plot_model": 1, "plot_family": 1}, ("metrics",)),
        # the phases: from the sweep alone, so neither the metrics nor the sweep
        ("measures/phases.py", {"phases": 1, "plot_phases": 1}, ("metrics", "sweep", "plot_model")),
        ("plots/phases.py", {"plot_phases": 1}, ("metrics", "sweep", "phases", "plot_model")),
        ("plots/sweep.py", {"plot_model": 1, "plot_family": 1}, ("metrics", "sweep")),
        ("plots/survey.py", {"plot_survey": 1}, ("metrics", "sweep", "plot_model", "explore")),
        ("explore/page.py", {"explore": 1}, ("metrics", "sweep", "plot_model", "plot_survey")),
        ("measures/rogue.py", {"metrics": 3, "sweep": 1, "plot_model": 1, "plot_family": 1}, ()),
        ("measures/sinks.py", {"metrics": 3, "sweep": 1, "plot_model": 1, "plot_family": 1}, ()),
        ("plots/outliers.py", {"plot_model": 1, "plot_family": 1}, ("metrics", "sweep")),
        # the comparisons read hidden.parquet: their jobs alone
        (
            "measures/compare.py",
            {"compare_pair": 4, "compare_layers": 2, "compare_sweep": 1, "plot_compare": 1},
            ("metrics", "sweep", "plot_model"),
        ),
        ("plots/compare.py", {"plot_compare": 1}, ("metrics", "sweep", "compare_pair", "compare_sweep")),
        # the weight measures and the logit lens read the weights (never a forward pass) and extract's Parquet
        ("measures/circuits.py", {"weights": 3, "metrics": 3, "sweep": 1, "plot_circuits": 1}, ("logit_lens",)),
        # the spectral measures' math: the metrics (per sampled site) and the weights job (per weight matrix)
        ("measures/spectral.py", {"weights": 3, "metrics": 3, "sweep": 1}, ("logit_lens",)),
        ("weights/layout.py", {"weights": 3, "logit_lens": 3, "metrics": 3, "plot_logit_lens": 1}, ()),
        ("measures/logit_lens.py", {"logit_lens": 3, "metrics": 3, "plot_logit_lens": 1}, ("weights",)),
        ("plots/circuits.py", {"plot_circuits": 1, "plot_logit_lens": 1}, ("metrics", "sweep", "weights")),
        # a stage's commands module reruns the jobs of the rules whose commands it holds, and what reads them
        ("cli/measures.py", {"metrics": 3, "sweep": 1, "phases": 1, "plot_model": 1}, ("weights", "logit_lens")),
        ("cli/weights.py", {"weights": 3, "logit_lens": 3, "metrics": 3, "plot_circuits": 1}, ()),
        (
            "cli/plots.py",
            {"plot_model": 1, "plot_family": 1, "plot_circuits": 1, "plot_logit_lens": 1, "plot_phases": 1},
            ("metrics", "sweep", "phases", "weights", "logit_lens"),
        ),
        ("cli/__init__.py", {}, ("metrics", "sweep", "weights", "logit_lens", "plot_model", "plot_circuits")),
        ("cli/extract.py", {}, ("metrics", "sweep", "weights", "logit_lens", "plot_model")),
        ("cli/checkpoints.py", {}, ("metrics", "sweep", "weights", "logit_lens", "plot_model")),
    ],
)
def test_analysis_code_reruns_metrics_and_figures_never_extract(run, module, reruns, never):
    """The analysis sources are inputs of the rules that run them, extract does not depend on them. An edit
    makes a source newer than the outputs, with another checksum (Snakemake reruns a job on a newer input
    only if its checksum changed, for files under --max-checksum-file-size): the test stands an edit in by
    touching a real source file with the checksum comparison off, and restores the file's times."""
    workdir, configfile = run["workdir"], run["config"]
    mtime_only = ("--max-checksum-file-size", "0")
    if "mtime_only" not in run:  # what the run would redo anyway, by mtime alone
        run["mtime_only"] = planned(workdir, configfile, *mtime_only)
    base = run["mtime_only"]
    after = edited_plan(workdir, configfile, module)
    for rule, count in reruns.items():
        assert after.get(rule) == count, after
    for rule in ("train_toy", "fetch", "extract", *never):
        assert after.get(rule, 0) == base.get(rule, 0), (rule, after)


def edited_plan(workdir: Path, configfile: Path, module: str) -> dict[str, int]:
    """What a dry run schedules once `module` (a package source) is newer than every output: an edit, stood in
    by touching the file with the checksum comparison off; the file's times are restored after."""
    source = PACKAGE / module
    stat, touched = source.stat(), time.time_ns()
    try:
        os.utime(source, ns=(stat.st_atime_ns, touched))
        return planned(workdir, configfile, "--max-checksum-file-size", "0")
    finally:
        if source.stat().st_mtime_ns == touched:  # unless someone saved the file meanwhile
            os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.fixture(scope="module")
def gradient_run(tmp_path_factory) -> dict:
    """The tiny toy-neox sweep with the gradient analysis and fixed subspaces on (gradients at steps 0 and 32)."""
    root = tmp_path_factory.mktemp("gradient-reruns")
    workdir = root / "work"
    workdir.mkdir()
    configfile = root / "sweep.yaml"
    configfile.write_text(yaml.safe_dump(gradient_config()))
    done = snakemake(workdir, configfile)
    assert done.returncode == 0, done.stderr[-5000:]
    assert planned(workdir, configfile, "--max-checksum-file-size", "0") == {}
    return {"root": root, "workdir": workdir, "config": configfile}


def gradient_config() -> dict:
    return copy.deepcopy({**TINY, "models": [neox("all")], "untrained": {"enabled": False}})


MODEL_RUNS = {"train_toy", "fetch", "extract"}
CORPUS_CHANGED = {"corpus": 1, "fetch": 3, "extract": 3}
GRADIENT_JOBS = {"gradients", "gradient_fixed_shares", "gradients_sweep", "sweep", "plot_gradients"}


@pytest.mark.parametrize(
    ("module", "reruns"),
    [
        (
            "plots/kit.py",
            {
                "plot_model",
                "plot_family",
                "plot_spectra",
                "plot_score_hist",
                "qk_svd",
                "plot_gradients",
                "plot_survey",
                "plot_circuits",
                "plot_logit_lens",
                "plot_phases",
                "plot_compare",
            },
        ),
        ("mechanism/qk_svd.py", {"qk_svd", "plot_score_hist"}),
        ("tangent/sweep.py", {"gradients_sweep", "plot_gradients"}),
        ("extract/run.py", set()),
        ("tangent/fixed.py", {"gradient_fixed_bases", *GRADIENT_JOBS, "metrics"}),
        ("tangent/backward.py", set()),
        ("tangent/analysis.py", {*GRADIENT_JOBS, "metrics"}),
        ("tables.py", {"gradient_fixed_bases", *GRADIENT_JOBS, "metrics", "qk_svd"}),
        ("cli/tangent.py", {"gradient_fixed_bases", *GRADIENT_JOBS, "metrics"}),
        ("cli/mechanism.py", {"qk_svd"}),
        ("arguments.py", {"gradient_fixed_bases", *GRADIENT_JOBS, "metrics", "qk_svd", "plot_spectra", "plot_model"}),
    ],
)
def test_code_edits_with_the_gradient_analysis_rerun_what_docs_reruns_says(gradient_run, module, reruns):
    """docs/reruns.md, Changing code: with fixed subspaces too, no code edit reruns a model (the shares are
    computed from the backward pass's Parquet, never in the job that holds the weights)."""
    after = edited_plan(gradient_run["workdir"], gradient_run["config"], module)
    assert reruns <= set(after), after
    assert not MODEL_RUNS & set(after), after
    if not {"gradients", "metrics"} & reruns:
        assert set(after) == reruns, after


def test_one_gradient_checkpoint_alone(gradient_run):
    """The README's recipe on a gradient step, fixed subspaces on: that checkpoint's fetch, extract (the forward
    and the backward pass), gradients and metrics, never the fit window's checkpoints."""
    target = f"{NEOX}/step32/metrics.parquet"
    plan = planned(gradient_run["workdir"], gradient_run["config"], target, "--forcerun", "extract")
    assert plan == {"fetch": 1, "extract": 1, "gradients": 1, "logit_lens": 1, "metrics": 1}


def _reversed(section: dict) -> dict:
    return dict(reversed(section.items()))


def _set(section: str, **values):
    return lambda config: config[section].update(values)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # the order of keys, a default written out, how a job runs
        (lambda c: c.update(extract=_reversed(c["extract"]) | {"attention": "auto"}), {}),
        (lambda c: c.update(gradients=_reversed(c["gradients"])), {}),
        (_set("extract", batch_size=2, device="cpu"), {}),
        (_set("extract", max_unknown_token_share=0.5), {}),  # whether a run may start, not what it writes
        (
            lambda c: c.update(
                corpus={"source": "builtin"},
                fetch={"keep_weights": False, "retries": 3},
                sinks={"epsilon": 0.3},
                phases={"min_steps": 5, "tolerance": 0.05, "smooth": 1},
            ),
            {},
        ),
        (_set("gradients", rank=[4], subspaces="both"), {}),
        # settings of the analyses that read Parquet: no model reruns
        (_set("gradients", rank=3), {"gradients": 2, "gradient_fixed_bases": 1, "gradient_fixed_shares": 1}),
        (_set("gradients", n_random=4), {"gradients": 2, "gradient_fixed_shares": 1, "metrics": 2}),
        (_set("gradients", fit_window=[0, 8]), {"gradient_fixed_bases": 1, "gradient_fixed_shares": 1}),
        (_set("gradients", enabled=False), {"metrics": 2, "sweep": 1}),
        (_set("qk_svd", fraction=0.5), {"qk_svd": 1}),
        (lambda c: c.update(weights={"probe_tokens": 16}), {"weights": 3, "metrics": 3, "sweep": 1}),
        (lambda c: c.update(weights={"enabled": False}), {"metrics": 3, "sweep": 1}),
        (lambda c: c.update(sinks={"epsilon": 0.5}), {"metrics": 3, "sweep": 1}),
        # what changes the model runs: those checkpoints alone
        (_set("gradients", steps=[0, 8, 32]), {"fetch": 1, "extract": 1, "gradients": 1}),
        (_set("gradients", layers=[0, 1]), {"fetch": 2, "extract": 2, "gradients": 2}),
        (_set("gradients", embedding_tokens=30), {"fetch": 2, "extract": 2}),
        (_set("extract", seq_len=24), {"fetch": 3, "extract": 3, "gradients": 2}),
        (_set("extract", sample_precision="float16"), {"fetch": 3, "extract": 3}),
        (_set("extract", units=2), {"fetch": 3, "extract": 3}),
        (lambda c: c.update(corpus={"source": "text", "paths": [str(ROOT / "README.md")]}), CORPUS_CHANGED),
        # an image or audio corpus's keys, which a text corpus does not read (docs/modalities.md)
        (_set("corpus", modality="text", max_items=9, seed=5, resample=True, max_seconds=1.0), {}),
        (lambda c: c["toy"]["toy-neox"].update(lr=0.002), {"train_toy": 1, "fetch": 3, "extract": 3}),
        # the untrained block fetches a swept model's init for itself: never the sweep's model runs
        (_set("untrained", enabled=True, inits=["bert", {"model": "toy-neox"}]), {"untrained": 1, "fetch_init": 1}),
    ],
    ids=[
        "key-order",
        "gradients-key-order",
        "how-extract-runs",
        "unknown-token-threshold",
        "defaults-written-out",
        "rank-as-a-list",
        "gradient-rank",
        "gradient-controls",
        "fit-window",
        "gradients-off",
        "qk-svd",
        "weights-probe-tokens",
        "weights-off",
        "sink-epsilon",
        "new-gradient-step",
        "gradient-layers",
        "embedding-tokens",
        "extract-seq-len",
        "sample-precision",
        "extract-units",
        "corpus-texts",
        "media-keys-of-a-text-corpus",
        "toy-training",
        "untrained-block",
    ],
)
def test_config_changes_rerun_what_docs_reruns_says(gradient_run, change, expected):
    """docs/reruns.md, What a change reruns: a dry run after each change of the table schedules those jobs,
    and a model run (fetch, extract) only where the change changes one."""
    config = gradient_config()
    config.setdefault("qk_svd", {})
    change(config)
    configfile = gradient_run["root"] / "changed.yaml"
    configfile.write_text(yaml.safe_dump(config, sort_keys=False))
    after = planned(gradient_run["workdir"], configfile, "--max-checksum-file-size", "0")
    for rule, count in expected.items():
        assert after.get(rule) == count, (rule, after)
    if not expected:
        assert after == {}, after
    for rule in MODEL_RUNS - set(expected):
        assert rule not in after, (rule, after)


@pytest.mark.parametrize("phases", [{"smooth": 0}, {"tolerance": 0.1}, {"min_steps": 4}])
def test_the_phase_rule_reruns_its_job_and_figure_alone(gradient_run, phases):
    """docs/reruns.md: a setting of the phase rule reruns the model's `phases` job and its figure, nothing else."""
    config = gradient_config() | {"phases": phases}
    configfile = gradient_run["root"] / "phases.yaml"
    configfile.write_text(yaml.safe_dump(config, sort_keys=False))
    assert planned(gradient_run["workdir"], configfile, "--max-checksum-file-size", "0") == {
        "phases": 1,
        "plot_phases": 1,
    }


def test_a_local_run_saved_again_is_analysed_again(gradient_run, tmp_path):
    """A local run's checkpoint saved again into its step folder (new weights, same names) is fetched and
    extracted again; the other checkpoints are not (docs/reruns.md: the checkpoint's content identity)."""
    workdir = copy_run(gradient_run, tmp_path)
    run_dir = tmp_path / "my-run"
    for step in (0, 8):
        shutil.copytree(workdir / "resources" / "toy" / "toy-neox" / f"step{step}", run_dir / f"step{step}")
    config = {**TINY, "models": [{"family": "local", "name": "my-run", "path": str(run_dir), "steps": "all"}]}
    config |= {"toy": {}, "untrained": {"enabled": False}, "gradients": {"enabled": False}}
    configfile = tmp_path / "local.yaml"
    configfile.write_text(yaml.safe_dump(config))
    done = snakemake(workdir, configfile, "--until", "extract")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "extract" not in planned(workdir, configfile, "--until", "extract")
    weights = run_dir / "step8" / "model.safetensors"
    weights.write_bytes((run_dir / "step0" / "model.safetensors").read_bytes())  # saved again: other weights
    again = planned(workdir, configfile, "--until", "extract")
    assert again == {"fetch": 1, "extract": 1}, again


# ---------------------------------------------------------------------------------------------- failures


def test_failing_checkpoints_fail_alone_and_the_sweep_lists_them(run, tmp_path):
    """Four failures in one --keep-going run, each alone, named with its cause on the console: corrupt
    weights (toy-neox step 4), a checkpoint folder without weights (local my-run step 8, and the one checkpoint
    of local no-run), and an extract killed by SIGKILL as the out-of-memory killer does (my-run step 32). The
    rest completes; each sweep table lists the failed checkpoints as unfinished; no weights stay on disk; the
    next run retries them, those of no-run too, none of whose checkpoints finished (issue 43: its partial sweep
    was newer than every input its sweep job had, and the rerun left the model out)."""
    workdir = copy_run(run, tmp_path)
    weights = workdir / "resources" / "toy" / "toy-neox" / "step4" / "model.safetensors"
    original = weights.read_bytes()
    weights.write_bytes(original[:1000])
    local = tmp_path / "my-run"
    for step in (0, 8, 32):
        shutil.copytree(workdir / "resources" / "toy" / "toy-neox" / f"step{step}", local / f"step{step}")
    (local / "step8" / "model.safetensors").unlink()
    my_run = {"family": "local", "name": "my-run", "path": str(local), "steps": "all"}
    no_run = tmp_path / "no-run"
    shutil.copytree(local / "step8", no_run / "step8")
    no_run = {"family": "local", "name": "no-run", "path": str(no_run), "steps": "all"}
    configfile = write_config(tmp_path / "grown.yaml", [neox(GRID), my_run, no_run])

    log = tmp_path / "snakemake.out"
    with log.open("w") as out:
        returncode = run_killing_an_extract(command(workdir, configfile, "--keep-going"), "local/my-run/step32", out)
    output = log.read_text()
    assert returncode != 0
    for cause in (
        r"toy/toy-neox/step4: SafetensorError: .*header",
        r"local/my-run/step8: FetchError: .*no \*\.safetensors",
        r"local/no-run/step8: FetchError: .*no \*\.safetensors",
        r"local/my-run/step32: killed by signal 9",
    ):
        assert re.search(f"^{cause}", output, re.M), (cause, output[-5000:])
    assert "SafetensorError" in (workdir / "logs" / "extract" / "toy" / "toy-neox" / "step4.log").read_text()
    assert (workdir / "results" / "local" / "my-run" / "step0" / "metrics.parquet").exists()  # the rest completed
    # a failed job's outputs go (the weight measures read the checkpoint on their own, and succeed)
    assert not extract_outputs(workdir / "results" / "local" / "my-run" / "step32")
    assert statuses(workdir / NEOX / "sweep.parquet") == {0: "ok", 4: "unfinished", 8: "ok", 32: "ok"}
    assert statuses(workdir / "results" / "local" / "my-run" / "sweep.parquet") == {
        0: "ok",
        8: "unfinished",
        32: "unfinished",
    }
    assert statuses(workdir / "results" / "local" / "no-run" / "sweep.parquet") == {8: "unfinished"}
    assert not [p for p in (workdir / "weights").rglob("*") if p.is_file()]

    weights.write_bytes(original)  # fixed: the next run retries them and re-aggregates the three sweeps
    retry = planned(workdir, configfile)
    assert retry["fetch"] == 4 and retry["extract"] == 4 and retry["sweep"] == 3, retry
    # a partial sweep is never taken for an up-to-date one, whatever becomes of the failed checkpoints
    assert planned(workdir, run["config"]).get("sweep") == 1


def test_a_run_killed_mid_write_resumes_with_rerun_incomplete(run, tmp_path):
    """SIGKILL of the whole run (Snakemake and extract) while extract writes its tables: the tables present
    are whole (atomic writes; the ones not yet written again are the previous run's, update() outputs, and
    extract.json is written last), Snakemake refuses to let metrics read the incomplete checkpoint, and after
    --unlock a rerun with --rerun-incomplete completes it."""
    workdir = copy_run(run, tmp_path)
    configfile, step8 = run["config"], workdir / NEOX / "step8"
    target = f"{NEOX}/step8/metrics.parquet"
    old_metrics = (step8 / "metrics.parquet").read_bytes()

    started = time.time_ns()
    snake = subprocess.Popen(
        command(workdir, configfile, target, "--forcerun", "extract"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(stall_after_first_table(tmp_path))},
    )
    try:  # the first table written whole, the next ones not yet: kill everything
        wait_for(lambda: newer(step8 / "qk.parquet", started), poll=0.01)
    finally:
        kill_tree(snake)
    for table in step8.glob("*.parquet"):
        pl.read_parquet(table)  # whole, or absent: never half a file under a table's name
    refused = snakemake(workdir, configfile, target)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "IncompleteFilesException" in output, output[-3000:]
    assert f"{NEOX}/step8/qk.parquet" in output.split("Incomplete files:")[1]
    assert (step8 / "metrics.parquet").read_bytes() == old_metrics  # metrics never read the partial tables

    started = time.time_ns()  # a killed Snakemake leaves its lock: --unlock, then --rerun-incomplete
    assert snakemake(workdir, configfile, "--unlock").returncode == 0
    done = snakemake(workdir, configfile, target, "--rerun-incomplete")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(step8.glob(".*.tmp"))  # the orphan of the killed write is gone
    for table in extract_outputs(step8):
        assert table.stat().st_mtime_ns > started
    assert pl.read_parquet(step8 / "metrics.parquet").height > 0


def test_a_forced_rerun_whose_model_job_is_killed_leaves_the_checkpoint_whole(run, tmp_path):
    """`--forcerun extract` of one checkpoint, its extract killed (SIGKILL, as the out-of-memory killer does):
    Snakemake puts the checkpoint's previous tables back (update() outputs), so its tables and the metrics read
    from them agree, nothing is left half-done, no weights stay, and the next plain run has nothing more to redo
    than before it."""
    workdir, configfile = copy_run(run, tmp_path), run["config"]
    pending = planned(workdir, configfile)  # what the tests before left to do in the module's run
    step8 = workdir / NEOX / "step8"
    before = {p.name: p.read_bytes() for p in step8.iterdir() if p.is_file()}
    forced = command(workdir, configfile, f"{NEOX}/step8/metrics.parquet", "--forcerun", "extract")
    assert run_killing_an_extract(forced, "toy/toy-neox/step8") != 0
    assert {p.name: p.read_bytes() for p in step8.iterdir() if p.is_file()} == before
    assert not [p for p in (workdir / "weights").rglob("*") if p.is_file()]
    assert planned(workdir, configfile) == pending


def stall_after_first_table(tmp_path: Path) -> Path:
    """A sitecustomize for the killed run's processes: once qk.parquet is renamed into place, the writer
    sleeps, so the kill always lands between two tables (extract writes them all within milliseconds)."""
    folder = tmp_path / "stall"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "import os, time\n"
        "_replace = os.replace\n"
        "def replace(src, dst, *args, **kwargs):\n"
        "    _replace(src, dst, *args, **kwargs)\n"
        "    if str(dst).endswith(os.sep + 'qk.parquet'):\n"
        "        time.sleep(600)\n"
        "os.replace = replace\n"
    )
    return folder


def newer(path: Path, than_ns: int) -> bool:
    try:
        return path.stat().st_mtime_ns > than_ns
    except FileNotFoundError:
        return False


def run_killing_an_extract(snakemake_command: list[str], checkpoint: str, out=subprocess.DEVNULL) -> int:
    """Run Snakemake and SIGKILL the extract of `checkpoint` ({family}/{model}/step{N}) once it starts, as the
    out-of-memory killer does; the run's exit status."""
    snake = subprocess.Popen(snakemake_command, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for(lambda: extract_process(snake, f"weights/{checkpoint}/")).kill()
        snake.wait(timeout=300)
    finally:
        kill_tree(snake)
    return snake.returncode


def extract_process(snake: subprocess.Popen, weights: str):
    """The `anisweep extract` process of one checkpoint under the Snakemake process this test started."""
    try:
        for proc in psutil.Process(snake.pid).children(recursive=True):
            cmdline = proc.cmdline()
            if "extract" in cmdline and any(arg.startswith(weights) for arg in cmdline):
                return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    return None


def wait_for(condition, timeout: float = 120, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(poll)
    raise TimeoutError("condition not met")


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL the Snakemake process this test started and every process under it, by pid."""
    try:
        procs = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    for proc in [psutil.Process(process.pid), *procs] if process.poll() is None else procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    process.wait(timeout=60)


# ---------------------------------------------------------------------------------------------- bad input


def local_config(tmp_path: Path, run_dir: Path) -> Path:
    return write_config(
        tmp_path / "local.yaml", [{"family": "local", "name": "my-run", "path": str(run_dir), "steps": "all"}]
    )


def test_local_folder_without_checkpoints_stops_before_any_work(tmp_path):
    (tmp_path / "empty-run" / "logs").mkdir(parents=True)
    done = snakemake(tmp_path, local_config(tmp_path, tmp_path / "empty-run"), timeout=120)
    assert done.returncode != 0
    assert "no checkpoints in" in done.stderr and "step{N}/ or checkpoint-{N}/" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "results").exists() and not (tmp_path / "weights").exists()


def test_unknown_architecture_of_a_local_run_stops_before_any_work(tmp_path):
    """A local run's config.json is on disk: an architecture no adapter knows stops the DAG, naming them."""
    step = tmp_path / "mamba-run" / "step0"
    step.mkdir(parents=True)
    (step / "config.json").write_text(json.dumps({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}))
    done = snakemake(tmp_path, local_config(tmp_path, tmp_path / "mamba-run"), timeout=120)
    assert done.returncode != 0
    assert "local/my-run/step0" in done.stderr and "MambaForCausalLM" in done.stderr
    supported = done.stderr.split("supported: ", 1)[-1]
    assert "BertForMaskedLM" in supported and "GPTNeoXForCausalLM" in supported, done.stderr[-3000:]
    assert not (tmp_path / "results").exists() and not (tmp_path / "weights").exists()


def manifest(run: dict, tmp_path: Path, path: Path, step: int = 32) -> Path:
    tokenizer = run["workdir"] / "resources" / "toy" / "toy-neox" / f"step{step}"
    file = tmp_path / "checkpoint.json"
    file.write_text(
        json.dumps(
            {
                "family": "toy",
                "model": "toy-neox",
                "step": step,
                "tokens_seen": step * 256,
                "seed": 0,
                "path": str(path),
                "tokenizer_path": str(tokenizer),
            }
        )
    )
    return file


def test_too_short_corpus_fails_before_the_model_loads(run, tmp_path, monkeypatch, capsys):

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(anisweep.extract.run, "load_model", never)
    short = tmp_path / "short.txt"
    short.write_text("Only a few words here.\n")
    checkpoint = run["workdir"] / "resources" / "toy" / "toy-neox" / "step32"
    status = cli.main(
        [
            "extract",
            "--manifest",
            str(manifest(run, tmp_path, checkpoint)),
            "--out",
            str(tmp_path / "out"),
            "--corpus",
            json.dumps({"source": "text", "paths": [str(short)]}),
            "--settings",
            json.dumps(EXTRACT),
        ]
    )
    assert status == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("toy/toy-neox/step32: PreflightError: evaluation corpus too short"), last
    assert "n_sequences x seq_len = 8 x 32" in last
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_nonfinite_activations_are_flagged_not_averaged(run, tmp_path):
    """A NaN in one weight of block 0's MLP: every later activation is NaN. Extract and metrics complete; the
    NaN token vectors are counted and left out of the sums, q/k and attention statistics of block 1 are NaN
    (not a number averaged over the finite ones), and the sweep flags the checkpoint, which no figure shows."""
    from safetensors.torch import load_file, save_file

    checkpoint = tmp_path / "nan-step32"
    shutil.copytree(run["workdir"] / "resources" / "toy" / "toy-neox" / "step32", checkpoint)
    tensors = load_file(checkpoint / "model.safetensors")
    tensors["gpt_neox.layers.0.mlp.dense_4h_to_h.weight"][0, 0] = float("nan")
    save_file(tensors, checkpoint / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    assert (
        cli.main(
            [
                "extract",
                "--manifest",
                str(manifest(run, tmp_path, checkpoint)),
                "--out",
                str(out),
                "--settings",
                json.dumps(EXTRACT),
            ]
        )
        == 0
    )
    assert cli.main(["metrics", "--extract-dir", str(out), "--out", str(out / "metrics.parquet")]) == 0

    stats = pl.read_parquet(out / "hidden_stats.parquet").filter(pl.col("site") == "resid").sort("layer")
    assert stats["n_nonfinite"].to_list() == [0, 256, 256] and stats["n"].to_list() == [256, 0, 0]
    assert json.loads((out / "extract.json").read_text())["nonfinite_tokens"] > 0
    for table, column in (("qk", "qk_cos"), ("attention", "entropy_mean")):
        values = pl.read_parquet(out / f"{table}.parquet")
        assert values.filter(pl.col("layer") == 0)[column].is_finite().all()
        assert values.filter(pl.col("layer") == 1)[column].is_nan().all()
    metrics = pl.read_parquet(out / "metrics.parquet")
    flagged = metrics.filter((pl.col("metric") == "n_nonfinite") & (pl.col("site") == "resid"))
    assert flagged.sort("layer")["value"].to_list() == [0, 256, 256]

    clean = run["workdir"] / NEOX / "step0" / "metrics.parquet"
    with pytest.warns(UserWarning, match=r"steps \[32\] have non-finite activations"):
        sweep = aggregate([clean, out / "metrics.parquet"])
    assert statuses_of(sweep) == {0: "ok", 32: "nonfinite"}
    assert analysed(sweep)["step"].unique().to_list() == [0]


def statuses_of(sweep: pl.DataFrame) -> dict[int, str]:
    return dict(sweep.select("step", "status").unique().iter_rows())
