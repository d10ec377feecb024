"""The bootstrap jobs' reruns (docs/reruns.md, the `bootstrap:` rows): a model's intervals read its checkpoints'
hidden.parquet (and metrics.parquet's estimates), so a new step reruns its model's job and a group's, a metrics
rerun these jobs, the bootstrap settings only these jobs, never a model run; a comparison of two groups is a job of
its own; and the config errors of a group or a comparison, before any job."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest
import yaml

import anisweep
from anisweep import schema

from conftest import job_stats, snakemake_command
from warm_snakemake import dry_run

ROOT = Path(__file__).resolve().parents[2]
TINY = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text())
PACKAGE = Path(anisweep.__file__).parent
TARGET = "results/toy/toy-neox/bootstrap.parquet"
DEFAULT_MEASURES = schema.defaults("bootstrap")["measures"]

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_worker")]


def write_config(path: Path, steps=(0, 8, 32), bootstrap: dict | None = None, seeds: bool = False) -> Path:
    neox = TINY["toy"]["toy-neox"]
    config = {**TINY, "toy": {"toy-neox": {**neox, "steps": [0, 4, 8, 32]}}}
    config["models"] = [{"family": "toy", "name": "toy-neox", "steps": list(steps)}]
    if seeds:
        config["toy"]["toy-neox-s1"] = {**neox, "seed": 1, "steps": [0, 8, 32]}
        config["models"].append({"family": "toy", "name": "toy-neox-s1", "steps": [0, 8, 32]})
    config["gradients"] = {"enabled": False}
    config["bootstrap"] = {"enabled": True, "samples": 50, **(bootstrap or {})}
    path.write_text(yaml.safe_dump(config))
    return path


def command(workdir: Path, configfile: Path, *args: str) -> list[str]:
    return snakemake_command(workdir, "--configfile", str(configfile), "--cores", "2", *args)


def planned(workdir: Path, configfile: Path, *args: str, target: str = TARGET) -> dict[str, int]:
    done = dry_run(command(workdir, configfile, "-n", target, *args), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return job_stats(done)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("bootstrap-reruns")
    workdir = root / "work"
    workdir.mkdir()
    configfile = write_config(root / "sweep.yaml")
    done = subprocess.run(command(workdir, configfile, TARGET), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-5000:]
    return {"root": root, "workdir": workdir, "config": configfile}


def test_the_model_job_writes_its_intervals_and_is_then_up_to_date(run):
    table = pl.read_parquet(run["workdir"] / TARGET)
    assert set(table["step"]) == {0, 8, 32} and set(table["metric"]) == set(DEFAULT_MEASURES)
    assert set(table["samples"]) == {50} and set(table["design"]) == {"units", "paired"}
    assert planned(run["workdir"], run["config"]) == {}


@pytest.mark.parametrize(
    ("bootstrap", "expected"),
    [
        ({"measures": DEFAULT_MEASURES[::-1], "level": 0.95, "seed": 0, "enabled": True}, {}),
        ({"samples": 60}, {"bootstrap_model": 1}),
        ({"level": 0.9}, {"bootstrap_model": 1}),
        ({"seed": 1}, {"bootstrap_model": 1}),
        ({"measures": ["isoscore", "top_eig_share", "rankme"]}, {"bootstrap_model": 1}),
        ({"measures": [*DEFAULT_MEASURES, "sink1_eps"]}, {"bootstrap_model": 1}),
    ],
    ids=["order-and-defaults", "samples", "level", "seed", "measures", "sums-and-sinks"],
)
def test_bootstrap_settings_rerun_its_jobs_alone(run, bootstrap, expected):
    config = write_config(run["root"] / "settings.yaml", bootstrap=bootstrap)
    assert planned(run["workdir"], config) == expected


@pytest.mark.parametrize("sink1_eps", [False, True])
def test_the_sink_threshold_is_the_bootstraps_where_it_resamples_sink1_eps(run, sink1_eps):
    """sinks.epsilon is a param of the bootstrap jobs only where they resample sink1_eps (docs/reruns.md; the
    metrics it reruns either way: tests/workflow/test_reruns.py)."""
    measures = [*DEFAULT_MEASURES, "sink1_eps"] if sink1_eps else DEFAULT_MEASURES
    config = write_config(run["root"] / "sinks.yaml", bootstrap={"measures": measures})
    config.write_text(yaml.safe_dump(yaml.safe_load(config.read_text()) | {"sinks": {"epsilon": 0.5}}))
    done = dry_run(command(run["workdir"], config, "-n", "-p", TARGET, "--forcerun", "bootstrap_model"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    command_line = [line for line in done.stdout.splitlines() if f"--out {TARGET}" in line]  # not the metrics job's
    assert len(command_line) == 1 and ("--sink-epsilon 0.5" in command_line[0]) == sink1_eps


@pytest.mark.parametrize(
    ("extra", "flags"),
    [
        ([], ()),
        (["cka"], ()),
        (["svcca"], ("--svcca-variance 0.9", "--cca-max-width 512")),
        (["pwcca"], ("--cca-max-width 512",)),
    ],
)
def test_the_cca_settings_are_the_bootstraps_where_it_resamples_svcca_or_pwcca(run, extra, flags):
    """compare.svcca_variance and compare.cca_max_width are params of the bootstrap jobs only where they resample
    SVCCA (both) or PWCCA (the width): elsewhere a change of them reruns no bootstrap job (docs/reruns.md)."""
    config = write_config(run["root"] / "cca.yaml", bootstrap={"measures": [*DEFAULT_MEASURES, *extra]})
    config.write_text(
        yaml.safe_dump(yaml.safe_load(config.read_text()) | {"compare": {"svcca_variance": 0.9, "cca_max_width": 512}})
    )
    done = dry_run(command(run["workdir"], config, "-n", "-p", TARGET, "--forcerun", "bootstrap_model"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    command_line = [line for line in done.stdout.splitlines() if f"--out {TARGET}" in line]
    assert len(command_line) == 1
    found = tuple(re.findall(r"--(?:svcca-variance|cca-max-width) [0-9.]+", command_line[0]))
    assert found == flags


#: a new step's jobs: its model run, its metrics (with the weight measures they read) and its model's bootstrap
NEW_STEP = {"fetch": 1, "extract": 1, "weights": 1, "logit_lens": 1, "metrics": 1, "bootstrap_model": 1}


def test_a_new_step_reruns_its_model_job_and_no_other_checkpoint(run):
    config = write_config(run["root"] / "steps.yaml", steps=(0, 4, 8, 32))
    assert planned(run["workdir"], config) == NEW_STEP


def test_a_group_is_a_job_of_its_own(run):
    """A group of toy-neox and another seed: the new model's runs and the group's job; toy-neox's own job stands."""
    config = write_config(
        run["root"] / "group.yaml", bootstrap={"groups": {"neox": ["toy-neox", "toy-neox-s1"]}}, seeds=True
    )
    plan = planned(run["workdir"], config, target="results/bootstrap/neox.parquet")
    assert plan.get("bootstrap_group") == 1 and "bootstrap_model" not in plan
    assert plan.get("extract") == 3  # toy-neox-s1's steps; toy-neox's stand
    assert planned(run["workdir"], config) == {}


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ({"g": ["toy-neox", "toy-gpt"]}, r"bootstrap.groups.g: \['toy-gpt'\] is not one model this config sweeps"),
        ({"g": ["toy-neox", "toy/toy-neox"]}, "bootstrap.groups.g: a model is named twice"),
    ],
)
def test_a_group_that_cannot_be_resampled_is_a_config_error(run, groups, message):
    config = write_config(run["root"] / "bad.yaml", bootstrap={"groups": groups}, seeds=True)
    done = dry_run(command(run["workdir"], config, "-n"), timeout=300)
    assert done.returncode != 0
    assert re.search(message, done.stdout + done.stderr), (done.stdout + done.stderr)[-2000:]


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("measures/sample_bootstrap.py", {"bootstrap_model": 1}),
        ("measures/pair_bootstrap.py", {"bootstrap_model": 1}),
        ("measures/metrics.py", {"metrics": 3, "bootstrap_model": 1}),  # the estimates: metrics.parquet's values
        ("plots/sweep.py", {}),
    ],
)
def test_editing_the_code_reruns_what_it_runs(run, module, expected):
    source = PACKAGE / module
    stat, touched = source.stat(), time.time_ns()
    try:
        os.utime(source, ns=(stat.st_atime_ns, touched))
        assert planned(run["workdir"], run["config"], "--max-checksum-file-size", "0") == expected
    finally:
        if source.stat().st_mtime_ns == touched:
            os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))


# --------------------------------------------------------------------------------------- comparisons of two groups
# Two groups of toy-neox and toy-neox-s1, the second listing them the other way round: paired, each seed is drawn
# with the other; unpaired, the two groups are the same seeds drawn apart, and their estimates are equal.
GROUPS = {"ab": ["toy-neox", "toy-neox-s1"], "ba": ["toy-neox-s1", "toy-neox"]}
COMPARISONS = {"swap": {"base": "ab", "other": "ba", "design": "paired"}}
OUTPUTS = [
    "results/toy/toy-neox/bootstrap.parquet",
    "results/toy/toy-neox-s1/bootstrap.parquet",
    "results/bootstrap/ab.parquet",
    "results/bootstrap/ba.parquet",
    "results/bootstrap/compare/swap.parquet",
]


def compare_config(path: Path, comparisons: dict, groups: dict | None = None, **bootstrap) -> Path:
    settings = {"groups": GROUPS if groups is None else groups, "comparisons": comparisons, **bootstrap}
    return write_config(path, bootstrap=settings, seeds=True)


@pytest.fixture(scope="module")
def compared(run) -> dict:
    """A copy of the run's folder (toy-neox's jobs done) where toy-neox-s1, both groups and the comparison ran."""
    workdir = run["root"] / "compared"
    shutil.copytree(run["workdir"], workdir, symlinks=True)
    configfile = compare_config(run["root"] / "compared.yaml", COMPARISONS)
    done = subprocess.run(command(workdir, configfile, *OUTPUTS), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-5000:]
    return {"root": run["root"], "workdir": workdir, "config": configfile}


def plan_of(compared: dict, configfile: Path, *targets: str) -> dict[str, int]:
    done = dry_run(command(compared["workdir"], configfile, "-n", *(targets or OUTPUTS)), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return job_stats(done)


def test_a_comparison_writes_its_table_and_is_then_up_to_date(compared):
    table = pl.read_parquet(compared["workdir"] / "results/bootstrap/compare/swap.parquet")
    assert set(table["step"]) == {0, 8, 32} and set(table["metric"]) == set(DEFAULT_MEASURES)
    assert set(table["design"]) == {"paired"} and set(table["against"]) == {"group"}
    assert (table["base_group"].unique().to_list(), table["other_group"].unique().to_list()) == (["ab"], ["ba"])
    assert table["base_models"][0].to_list() == ["toy/toy-neox", "toy/toy-neox-s1"]
    assert table["other_models"][0].to_list() == ["toy/toy-neox-s1", "toy/toy-neox"]
    assert set(table["n_seeds_base"]) == set(table["n_seeds_other"]) == {2} and set(table["samples"]) == {50}
    assert (table["estimate"] == 0).all()  # the same two seeds' mean on both sides
    assert plan_of(compared, compared["config"]) == {}


@pytest.mark.parametrize(
    ("comparisons", "expected"),
    [
        (COMPARISONS | {"swap-unpaired": {"base": "ab", "other": "ba"}}, {"bootstrap_compare": 1}),
        ({"swap": {"base": "ab", "other": "ba", "design": "unpaired"}}, {"bootstrap_compare": 1}),
        ({"swap": {"base": "ba", "other": "ab", "design": "paired"}}, {"bootstrap_compare": 1}),
    ],
    ids=["a-new-comparison", "its-design", "its-sides"],
)
def test_a_comparison_is_a_job_of_its_own(compared, comparisons, expected):
    """A new comparison, or one whose design or sides change, reruns its own job alone: no group, no model."""
    config = compare_config(compared["root"] / "comparisons.yaml", comparisons)
    outputs = [*OUTPUTS[:-1], *(f"results/bootstrap/compare/{name}.parquet" for name in comparisons)]
    assert plan_of(compared, config, *outputs) == expected


def test_the_settings_and_a_step_rerun_what_they_enter(compared):
    """B reruns every bootstrap job; a step of toy-neox alone (not shared by toy-neox-s1) its model's runs and job."""
    config = compare_config(compared["root"] / "samples.yaml", COMPARISONS, samples=60)
    assert plan_of(compared, config) == {"bootstrap_model": 2, "bootstrap_group": 2, "bootstrap_compare": 1}
    config = write_config(
        compared["root"] / "step.yaml",
        steps=(0, 4, 8, 32),
        bootstrap={"groups": GROUPS, "comparisons": COMPARISONS},
        seeds=True,
    )
    assert plan_of(compared, config) == NEW_STEP


def test_a_metrics_rerun_reruns_the_groups_and_comparisons_it_enters(compared):
    """Their estimates are metrics.parquet's values: editing metrics' code reruns every checkpoint's metrics, then
    both models', both groups' and the comparison's jobs."""
    source = PACKAGE / "measures" / "metrics.py"
    stat, touched = source.stat(), time.time_ns()
    try:
        os.utime(source, ns=(stat.st_atime_ns, touched))
        plan = plan_of(compared, compared["config"], *OUTPUTS, "--max-checksum-file-size", "0")
    finally:
        if source.stat().st_mtime_ns == touched:
            os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert plan == {"metrics": 6, "bootstrap_model": 2, "bootstrap_group": 2, "bootstrap_compare": 1}


@pytest.mark.parametrize(
    ("groups", "comparisons", "message"),
    [
        (None, {"c": {"base": "ab", "other": "cd"}}, r"bootstrap.comparisons.c: \['cd'\] is not a group of"),
        (None, {"c": {"base": "ab", "other": "ab"}}, "bootstrap.comparisons.c: base and other are both 'ab'"),
        (
            GROUPS | {"abc": ["toy-neox", "toy-neox-s1", "toy-neox-s2"]},
            {"c": {"base": "ab", "other": "abc", "design": "paired"}},
            "bootstrap.comparisons.c: the paired design pairs seed i of ab with seed i of abc, but they have 2 and 3",
        ),
        (
            GROUPS | {"late": ["toy-neox-s2", "toy-neox-s3"]},
            {"c": {"base": "ab", "other": "late"}},
            "bootstrap.comparisons.c: ab and late share no step",
        ),
    ],
    ids=["unknown-group", "same-group", "paired-seeds", "no-shared-step"],
)
def test_a_comparison_that_cannot_be_made_is_a_config_error(run, groups, comparisons, message):
    config = write_config(
        run["root"] / "bad-comparison.yaml",
        bootstrap={"groups": GROUPS if groups is None else groups, "comparisons": comparisons},
        seeds=True,
    )
    more = yaml.safe_load(config.read_text())  # two more seeds (no job runs): s2 swept at steps 0 and 4, s3 at 4
    for name, steps in (("toy-neox-s2", [0, 4]), ("toy-neox-s3", [4])):
        more["toy"][name] = {**more["toy"]["toy-neox"], "seed": int(name[-1]), "steps": steps}
        more["models"].append({"family": "toy", "name": name, "steps": steps})
    config.write_text(yaml.safe_dump(more))
    done = dry_run(command(run["workdir"], config, "-n"), timeout=300)
    assert done.returncode != 0
    assert re.search(message, done.stdout + done.stderr), (done.stdout + done.stderr)[-2000:]
