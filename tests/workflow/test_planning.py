"""Planning a sweep of Hub checkpoints: what fetch shares with the jobs that read its weights, and a cost that grows
linearly with the checkpoints (benchmarks/bench_planning.py measures it on whole published grids).

Dry runs offline with the audit off: nothing is downloaded or listed.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import job_stats, snakemake_command

pytestmark = pytest.mark.slow  # snakemake parses the whole workflow

MEASURE = "embedding_norm"
# a user's weight measure: fetch shares a copy with its jobs too
MEASURE_MODULE = f"""
from anisweep.measures.registry import weight_measure


@weight_measure(tensors=["embedding"])
def {MEASURE}(weights):
    yield {{"metric": "{MEASURE}", "value": float(weights.embedding().norm())}}
"""
STEPS = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]

# Snakemake under a count of the jobs each walk of its DAG's jobs yields (every reader of DAG.needrun_jobs: its
# own scheduler's and the workflow's input functions and params), written as JSON when it ends.
COUNTING = """
import atexit, json, sys
from snakemake.cli import main
from snakemake import dag
walked, out = {"walks": 0, "jobs": 0}, sys.argv.pop(1)
needrun_jobs = dag.DAG.needrun_jobs
def counted(self, exclude_finished=True):
    walked["walks"] += 1
    for job in needrun_jobs(self, exclude_finished):
        walked["jobs"] += 1
        yield job
dag.DAG.needrun_jobs = counted
atexit.register(lambda: open(out, "w").write(json.dumps(walked)))
sys.argv[0] = "snakemake"
main()
"""


def hub_sweep(workdir: Path, steps: list[int]) -> Path:
    config = {
        "models": [{"family": "pythia", "name": "pythia-14m", "steps": steps}],
        "corpus": {"source": "builtin"},
        "audit": {"enabled": False},
        "measures": [f"planned_measure:{MEASURE}"],
    }
    (workdir / "planned_measure.py").write_text(MEASURE_MODULE)
    configfile = workdir / "config.yaml"
    configfile.write_text(yaml.safe_dump(config))
    return configfile


def counted_dry_run(workdir: Path, steps: list[int]) -> tuple[subprocess.CompletedProcess, dict]:
    """A dry run printing its commands, and how many jobs the walks of Snakemake's DAG yielded."""
    command = snakemake_command(workdir, "--configfile", str(hub_sweep(workdir, steps)), "-n", "--printshellcmds")
    counts = workdir / "walked.json"
    command[1:3] = ["-c", COUNTING, str(counts)]  # `python -m snakemake` run through the count
    path = os.pathsep.join(filter(None, [str(workdir), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(workdir / "hf"), PYTHONPATH=path)
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done, json.loads(counts.read_text())


def commands(done: subprocess.CompletedProcess, name: str) -> list[list[str]]:
    lines = [line for line in (done.stdout + done.stderr).splitlines() if f" -m anisweep {name} " in line]
    return [shlex.split(line.split(" 2> ")[0]) for line in lines]


def option(args: list[str], name: str) -> list[str]:
    """The values after `name` up to the next option."""
    if name not in args:
        return []
    values = args[args.index(name) + 1 :]
    return values[: next((i for i, v in enumerate(values) if v.startswith("--")), len(values))]


def test_each_fetch_shares_its_weights_with_every_job_that_waits_for_them(tmp_path):
    """The weights and logit-lens jobs and the user's weight measure of a checkpoint fetched in this run each get
    the copy fetch makes for them, and read that copy."""
    steps = [0, 1000]
    done, _ = counted_dry_run(tmp_path, steps)
    fetches = commands(done, "fetch")
    assert len(fetches) == len(steps)
    shared = set()
    for args in fetches:
        out = option(args, "--out")[0]
        expected = [f"{out}.read-by-{reader}" for reader in ("logit_lens", f"measure-{MEASURE}", "weights")]
        assert option(args, "--share-with") == expected, args
        shared |= set(expected)
    readers = commands(done, "weights") + commands(done, "logit-lens")
    assert len(readers) == 3 * len(steps)
    assert {option(args, "--fetched")[0] for args in readers} == shared


def test_planning_walks_the_jobs_a_number_of_times_linear_in_the_checkpoints(tmp_path):
    """Writing each fetch's command once walked every job of the DAG (a sweep's planning grew as the square of its
    checkpoints): the jobs walked per job planned stay the same from 3 checkpoints to 12."""
    per_job = {}
    for steps in (STEPS[:3], STEPS):
        (tmp_path / str(len(steps))).mkdir()
        done, walked = counted_dry_run(tmp_path / str(len(steps)), steps)
        planned = sum(job_stats(done).values())
        per_job[len(steps)] = walked["jobs"] / planned
    assert per_job[12] < 1.25 * per_job[3], per_job
