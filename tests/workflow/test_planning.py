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
MODELS = ["pythia-14m", "pythia-31m", "pythia-70m", "pythia-160m", "pythia-410m"]
STEPS = [0, 1000, 143000]

# Snakemake under a count of what planning reads: the jobs each walk of its DAG yields (every reader of
# DAG.needrun_jobs: its own scheduler's and the workflow's), the checkpoints looked at by model (each read of
# a Checkpoint's or a comparison Pair's `family`: the workflow's scans of them), and the functions whose signature
# the workflow's cache holds (FunctionSignatures, common.smk; -1 where it is not installed). Written as JSON when
# it ends.
COUNTING = """
import atexit, json, sys
from snakemake.cli import main
from snakemake import dag, rules
from anisweep.checkpoints.base import Checkpoint
from anisweep.measures.compare_plan import Pair
read, out = {"jobs": 0, "checkpoints": 0}, sys.argv.pop(1)
needrun_jobs = dag.DAG.needrun_jobs
def counted(self, exclude_finished=True):
    for job in needrun_jobs(self, exclude_finished):
        read["jobs"] += 1
        yield job
def looked_at(self, name):
    read["checkpoints"] += name == "family"
    return object.__getattribute__(self, name)
dag.DAG.needrun_jobs = counted
Checkpoint.__getattribute__ = Pair.__getattribute__ = looked_at
def signatures():
    known = getattr(rules.get_function_params, "known", None)
    return -1 if known is None else len(known)
atexit.register(lambda: open(out, "w").write(json.dumps(read | {"signatures": signatures()})))
sys.argv[0] = "snakemake"
main()
"""


def hub_sweep(workdir: Path, models: list[str], **sections) -> Path:
    config = {
        "models": [{"family": "pythia", "name": name, "steps": STEPS} for name in models],
        "corpus": {"source": "builtin"},
        "audit": {"enabled": False},
        "measures": [f"planned_measure:{MEASURE}"],
        **sections,
    }
    (workdir / "planned_measure.py").write_text(MEASURE_MODULE)
    configfile = workdir / "config.yaml"
    configfile.write_text(yaml.safe_dump(config))
    return configfile


def counted_dry_run(workdir: Path, models: list[str], **sections) -> tuple[subprocess.CompletedProcess, dict]:
    """A dry run of the models' STEPS printing its commands, and what its planning read (COUNTING)."""
    configfile = hub_sweep(workdir, models, **sections)
    command = snakemake_command(workdir, "--configfile", str(configfile), "-n", "--printshellcmds")
    counts = workdir / "read.json"
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
    done, _ = counted_dry_run(tmp_path, MODELS[:1])
    fetches = commands(done, "fetch")
    assert len(fetches) == len(STEPS)
    shared = set()
    for args in fetches:
        out = option(args, "--out")[0]
        expected = [f"{out}.read-by-{reader}" for reader in ("logit_lens", f"measure-{MEASURE}", "weights")]
        assert option(args, "--share-with") == expected, args
        shared |= set(expected)
    readers = commands(done, "weights") + commands(done, "logit-lens")
    assert len(readers) == 3 * len(STEPS)
    assert {option(args, "--fetched")[0] for args in readers} == shared


def test_planning_reads_each_job_checkpoint_pair_and_signature_a_number_of_times_linear_in_the_checkpoints(tmp_path):
    """Writing each fetch's command walked every job of the DAG, each checkpoint's jobs looked up its model's
    checkpoints in a scan of all of them, and each model's comparison jobs its pairs in a scan of all pairs (a
    sweep's planning grew as the square of its checkpoints): what planning reads grows by as much from 1 model to 3
    as from 3 to 5, with the gradient analysis on (its input functions look up the model's checkpoints for each
    checkpoint). Snakemake read the signature of every input, params and resources function again for each job
    (about a tenth of planning's CPU): the workflow's cache of them (FunctionSignatures, common.smk) holds one entry
    per function of the rules, as many for 5 models as for 1."""
    read = {}
    for n in (1, 3, 5):
        workdir = tmp_path / str(n)
        workdir.mkdir()
        done, read[n] = counted_dry_run(workdir, MODELS[:n], gradients={"enabled": True, "steps": None})
        read[n]["planned"] = sum(job_stats(done).values())
    for what in ("planned", "jobs", "checkpoints"):
        first, second = read[3][what] - read[1][what], read[5][what] - read[3][what]
        assert second <= 1.05 * first, (what, read)
    assert 0 < read[1]["signatures"] == read[5]["signatures"], read
