"""The figures that draw the Multi-Bootstrap's intervals as bands (docs/reruns.md, the `bootstrap:` rows): a model's
figures and phases figure, its family's comparison and the explorer page read bootstrap.parquet (and the family's
groups' tables) only while bootstrap is enabled, so that a bootstrap setting reruns the bootstrap jobs and these
figures and nothing else, and turning bootstrap off redraws them without bands, no model run or table again."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import job_stats, snakemake_command
from warm_snakemake import dry_run

ROOT = Path(__file__).resolve().parents[2]
TINY = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text())
FIGURES = [
    "results/toy/toy-neox/figures/isotropy.png",
    "results/toy/toy-neox/figures/spectral_phases.png",
    "results/toy/figures/compare.png",
    "results/explore.html",
]
#: the bands' tables, so that a plan of FIGURES with bootstrap off still names the jobs that would write them
TABLES = ["results/toy/toy-neox/bootstrap.parquet", "results/bootstrap/neox.parquet"]
#: one figure job per target of FIGURES: toy-neox's model figures and phases, the family's figure and the page
FIGURE_JOBS = {"plot_model": 1, "plot_phases": 1, "plot_family": 1, "explore": 1}

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_worker")]


def write_config(path: Path, **bootstrap) -> Path:
    """tiny.yaml's toy-neox and a second seed of it (steps 0, 8, 32), grouped; bootstrap on, B = 50, or as given."""
    neox = {**TINY["toy"]["toy-neox"], "steps": [0, 8, 32]}
    config = {**TINY, "toy": {"toy-neox": neox, "toy-neox-s1": {**neox, "seed": 1}}}
    config["models"] = [{"family": "toy", "name": name, "steps": "all"} for name in ("toy-neox", "toy-neox-s1")]
    config["gradients"] = {"enabled": False}
    groups = {"neox": ["toy-neox", "toy-neox-s1"]}
    config["bootstrap"] = {"enabled": True, "samples": 50, "groups": groups, **bootstrap}
    path.write_text(yaml.safe_dump(config))
    return path


def command(workdir: Path, configfile: Path, *args: str) -> list[str]:
    return snakemake_command(workdir, "--configfile", str(configfile), "--cores", "2", *args)


def planned(workdir: Path, configfile: Path, targets=FIGURES) -> dict[str, int]:
    done = dry_run(command(workdir, configfile, "-n", *targets), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return job_stats(done)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("bootstrap-figures")
    workdir = root / "work"
    workdir.mkdir()
    configfile = write_config(root / "sweep.yaml")
    done = subprocess.run(command(workdir, configfile, *FIGURES), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-5000:]
    return {"root": root, "workdir": workdir, "config": configfile}


def test_the_figures_read_the_bootstrap_tables_and_are_then_up_to_date(run):
    assert all((run["workdir"] / path).is_file() for path in FIGURES + TABLES)
    page = (run["workdir"] / "results" / "explore.html").read_text()
    assert '"intervals":' in page and "Multi-Bootstrap over sequences" in page
    assert planned(run["workdir"], run["config"]) == {}


@pytest.mark.parametrize(
    ("bootstrap", "expected"),
    [
        ({"samples": 60}, {"bootstrap_model": 2, "bootstrap_group": 1, **FIGURE_JOBS}),
        ({"level": 0.9}, {"bootstrap_model": 2, "bootstrap_group": 1, **FIGURE_JOBS}),
        ({"seed": 3}, {"bootstrap_model": 2, "bootstrap_group": 1, **FIGURE_JOBS}),
        # the group left out: the family's figure alone reads its table
        ({"groups": {}}, {"plot_family": 1}),
    ],
    ids=["samples", "level", "seed", "group-removed"],
)
def test_a_bootstrap_setting_reruns_the_bootstrap_jobs_and_the_figures_they_feed_alone(run, bootstrap, expected):
    config = write_config(run["root"] / "settings.yaml", **bootstrap)
    assert planned(run["workdir"], config) == expected


def test_bootstrap_turned_off_redraws_the_figures_without_bands_and_runs_nothing_else(run):
    config = write_config(run["root"] / "off.yaml", enabled=False)
    assert planned(run["workdir"], config) == FIGURE_JOBS


@pytest.mark.parametrize("measures", [["isoscore"], ["isoscore", "cka"]], ids=["no-comparison", "cka"])
def test_compare_training_reads_the_bootstrap_table_where_it_resamples_a_comparison(run, measures):
    """compare_training.png draws the comparisons' intervals: bootstrap.parquet is its input where bootstrap.measures
    holds cka, svcca or pwcca, and not elsewhere, so that another measure resampled leaves the figure standing."""
    config = write_config(run["root"] / "pairs.yaml", measures=measures)
    figure = "results/toy/toy-neox/figures/compare_training.png"
    done = dry_run(command(run["workdir"], config, "-n", "-p", figure, "--forcerun", "plot_compare"), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if "plot-compare --table results/toy/toy-neox/" in line]
    assert len(lines) == 1
    assert ("--bootstrap results/toy/toy-neox/bootstrap.parquet" in lines[0]) == ("cka" in measures)
