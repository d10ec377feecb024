"""The SLURM profile (profiles/slurm) against a real SLURM: a one-node cluster on this machine, which
tests/slurm_cluster.py installs (apt-get) and starts; the tests that need it skip only where it cannot be
installed or started (not root, no apt-get, a foreign /etc/slurm/slurm.conf).

* The tiny sweep through ``--workflow-profile profiles/slurm`` goes through sbatch (extracts, and metrics,
  grouped into few SLURM jobs; train_toy, fetch, sweep and the plots stay on the submit host), every SLURM job
  completes, the group jobs are sized for one checkpoint at a time, and every Parquet table equals, bit
  for bit, that of a local ``snakemake --cores 2`` run.
* A rule that fails inside a SLURM job is reported as failed (after the profile's one retry) and snakemake
  exits non-zero in bounded time instead of polling forever (the cluster has no accounting: squeue only).
* extract asks for a GPU exactly when the config says cuda; ``--profile profiles/slurm`` would also load the
  workstation profile (profiles/default), ``--workflow-profile profiles/slurm`` replaces it.

The timings of each stage are printed at the end of the module (also under pytest's output capture).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
import snakemake_executor_plugin_slurm  # noqa: F401 - the [test] extra: a missing plugin is an error, not a skip
import yaml

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slurm, pytest.mark.slow]  # a real one-node SLURM, the tiny sweep through it
SNAKEFILE = ROOT / "Snakefile"
PROFILE = ROOT / "profiles" / "slurm"
TINY = ROOT / "tests" / "configs" / "tiny.yaml"

# The sweep both runs make: the tiny config's toy-neox alone (every job outside SLURM imports torch afresh, as no
# worker serves a cluster run), without the weight measures, which read each checkpoint on their own and would only
# lengthen both runs (tests/workflow/test_workflow.py runs them).
SWEEP = {
    **yaml.safe_load(TINY.read_text()),
    "models": [{"family": "toy", "name": "toy-neox", "steps": "all"}],
    "weights": {"enabled": False},
}
SWEEP["toy"] = {"toy-neox": SWEEP["toy"]["toy-neox"]}
CHECKPOINTS = [(name, step) for name, toy in SWEEP["toy"].items() for step in toy["steps"]]

# Test-only overrides of the profile: the first status check 2 s after a submission instead of 40 (the test
# cluster keeps finished jobs visible to squeue for MinJobAge = 3600 s); 2 checkpoints per group job instead of
# 10, so that the sweep's 3 make 2 group jobs sharing the node's 2 CPUs; the SLURM logs of successful jobs
# kept, as evidence. `--group-components` replaces the profile's whole list: the groups it leaves alone
# (compare) are passed on as the profile sets them.
FAST = ("--slurm-init-seconds-before-status-checks", "2")
PER_GROUP = 2
GROUP_COMPONENTS = {**yaml.safe_load((PROFILE / "config.yaml").read_text())["group-components"]}
GROUP_COMPONENTS.update(sweep=PER_GROUP, measure=PER_GROUP)
CLUSTER_ARGS = (
    "--workflow-profile",
    str(PROFILE),
    *FAST,
    "--group-components",
    *(f"{group}={n}" for group, n in GROUP_COMPONENTS.items()),
    "--slurm-keep-successful-logs",
)

TIMINGS: dict[str, float] = {}
SUBMITTED = re.compile(r"submitted with SLURM jobid (\d+) \(log: (\S+?)\)\.?$", re.M)


@pytest.fixture(scope="module", autouse=True)
def print_timings(request):
    yield
    if not TIMINGS:
        return
    capman = request.config.pluginmanager.getplugin("capturemanager")
    line = "test_slurm timings: " + ", ".join(f"{name} {s:.0f} s" for name, s in TIMINGS.items())
    if capman is None:
        print(line)
    else:
        with capman.global_and_fixture_disabled():
            print(f"\n{line}")


def clean_env() -> dict[str, str]:
    """This environment without what would steer Snakemake or sbatch elsewhere (a user's profile, SLURM_*)."""
    return {
        k: v
        for k, v in os.environ.items()
        if k != "SNAKEMAKE_PROFILE" and not k.startswith(("SBATCH_", "SLURM_", "SALLOC_", "SRUN_"))
    }


class Snakemake:
    """A snakemake run in the background: its output goes to a file next to the working directory."""

    def __init__(self, workdir: Path, *args: str, snakefile: Path = SNAKEFILE, configfile: Path | None = TINY):
        self.workdir = workdir
        self.command = [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(snakefile),
            "--directory",
            str(workdir),
            *(["--configfile", str(configfile)] if configfile else []),
            *args,
        ]
        self.output = workdir.parent / f"{workdir.name}.snakemake.out"
        self.t0, self.t1 = time.monotonic(), None
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=clean_env(), stdin=subprocess.DEVNULL
            )
        self.waiter = threading.Thread(target=self._wait, daemon=True)
        self.waiter.start()

    def _wait(self) -> None:
        self.proc.wait()
        self.t1 = time.monotonic()

    def result(self, timeout: float, cluster=None) -> SimpleNamespace:
        """Wait for the end (at most `timeout` s after the start, then kill it and fail the test)."""
        self.waiter.join(max(0.0, self.t0 + timeout - time.monotonic()))
        if self.waiter.is_alive():
            self.proc.kill()
            self.waiter.join()
            run = SimpleNamespace(out=self.output.read_text(errors="replace"), workdir=self.workdir)
            pytest.fail(
                f"snakemake still running after {timeout:.0f} s: {' '.join(self.command)}\n" + diagnose(run, cluster)
            )
        return SimpleNamespace(
            rc=self.proc.returncode,
            out=self.output.read_text(errors="replace"),
            seconds=self.t1 - self.t0,
            workdir=self.workdir,
        )


def snakemake(workdir: Path, *args: str, timeout: float = 600, cluster=None, **kwargs) -> SimpleNamespace:
    return Snakemake(workdir, *args, **kwargs).result(timeout, cluster)


def diagnose(run, cluster=None) -> str:
    parts = [f"--- snakemake output (tail)\n{run.out[-6000:]}"]
    if cluster is not None:
        parts.append(f"--- squeue\n{cluster.squeue()}")
        parts.append(f"--- slurmctld.log (tail)\n{cluster.log_tail('slurmctld', 30)}")
    for log in sorted(Path(run.workdir, ".snakemake", "slurm_logs").rglob("*.log"))[-4:]:
        parts.append(f"--- {log}\n{log.read_text(errors='replace')[-2000:]}")
    return "\n".join(parts)


def scontrol_job(job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "--oneliner", "show", "job", job_id],
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
    ).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)


def minutes(limit: str) -> int:
    """SLURM's [days-]hours:minutes:seconds as minutes."""
    days, _, hms = limit.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return (int(days or 0) * 24 + h) * 60 + m + (s > 0)


def resources_of(out: str, rule: str) -> list[dict[str, str]]:
    """The resources Snakemake printed for every job of `rule` (as `resources: a=1, b=2`)."""
    found = re.findall(rf"^\s*(?:local)?rule {rule}:\n(?:\s+\w+:.*\n)*?\s+resources: (.*)$", out, re.M)
    assert found, f"no resources printed for rule {rule}"
    return [dict(item.split("=", 1) for item in line.split(", ")) for line in found]


@pytest.fixture(scope="module")
def sweep_config(tmp_path_factory) -> Path:
    config = tmp_path_factory.mktemp("config") / "sweep.yaml"
    config.write_text(yaml.safe_dump(SWEEP))
    return config


@pytest.fixture(scope="module")
def cluster_run(slurm_cluster, sweep_config, tmp_path_factory):
    TIMINGS["slurm install"] = slurm_cluster.installed_s
    TIMINGS["slurm start"] = slurm_cluster.started_s
    workdir = tmp_path_factory.mktemp("slurm_run") / "work"
    # A limit for a hung run, not a speed test: ~200 s alone on 2 quiet cores; beside another pytest-xdist worker's
    # whole-DAG runs on a loaded machine it took over 480 s.
    run = snakemake(workdir, *CLUSTER_ARGS, configfile=sweep_config, timeout=1200, cluster=slurm_cluster)
    TIMINGS["tiny sweep on SLURM"] = run.seconds
    assert run.rc == 0, diagnose(run, slurm_cluster)
    return run


@pytest.fixture(scope="module")
def failing_run(slurm_cluster, tmp_path_factory):
    """A workflow whose extract fails inside a SLURM job, started in the background: it mostly waits on
    squeue polls, so it shares the time of the local reference run (which mostly computes)."""
    folder = tmp_path_factory.mktemp("failing_run")
    snakefile = folder / "Snakefile"
    snakefile.write_text(FAILING)
    run = Snakemake(folder / "work", "--workflow-profile", str(PROFILE), *FAST, snakefile=snakefile, configfile=None)
    yield run
    if run.proc.poll() is None:  # its test was not run, or failed before waiting for it
        run.proc.kill()
        run.proc.wait()


@pytest.fixture(scope="module")
def local_run(failing_run, sweep_config, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("local_run") / "work"
    run = snakemake(workdir, "--cores", "2", configfile=sweep_config, timeout=600)
    TIMINGS["tiny sweep locally"] = run.seconds
    assert run.rc == 0, diagnose(run)
    return run


def test_sweep_goes_through_slurm(cluster_run, slurm_cluster):
    out, workdir = cluster_run.out, cluster_run.workdir
    # The workflow profile replaced profiles/default: no workstation cores or gpu limit in a cluster run.
    using = next(line for line in out.splitlines() if line.startswith("Using"))
    assert using == f"Using workflow specific profile {PROFILE} for setting default command line arguments.", using
    assert not re.search(r"^Provided resources:.*\bgpu=", out, re.M)

    submitted = SUBMITTED.findall(out)
    logdir = workdir / ".snakemake" / "slurm_logs"
    kinds = Counter(Path(log).relative_to(logdir).parts[0] for _, log in submitted)
    n_checkpoints = len(list((workdir / "results").glob("*/*/step*/metrics.parquet")))
    assert n_checkpoints == len(CHECKPOINTS)
    # extracts, and metrics, in groups of up to PER_GROUP checkpoints, a job per gradient analysis; nothing else.
    n_gradients = len(list((workdir / "results").glob("*/*/step*/gradients.parquet")))
    assert n_gradients > 0
    n_groups = -(-n_checkpoints // PER_GROUP)
    # the comparisons of pairs of checkpoints in groups of their own, up to the profile's number a job
    compared = {kind: n for kind, n in kinds.items() if kind.startswith("group_compare")}
    n_compared = len(resources_of(out, "compare_pair")) + len(resources_of(out, "compare_layers"))
    assert sum(compared.values()) == -(-n_compared // GROUP_COMPONENTS["compare"]), (compared, n_compared)
    kinds = {kind: n for kind, n in kinds.items() if kind not in compared}
    assert kinds == {"group_sweep_extract": n_groups, "group_measure_metrics": n_groups, "rule_gradients": n_gradients}
    for rule in ("train_toy", "fetch", "sweep", "plot_model", "plot_family"):
        assert f"localrule {rule}:" in out, rule

    controller = slurm_cluster.controller_log()
    for job_id, log in submitted:
        assert re.search(rf"_slurm_rpc_submit_batch_job: JobId={job_id}\b", controller), job_id
        assert re.search(rf"_job_complete: JobId={job_id} WEXITSTATUS 0\b", controller), job_id
        job = scontrol_job(job_id)
        assert job["JobState"] == "COMPLETED" and job["Partition"] == slurm_cluster.partition, job
        assert Path(log).is_file() and "Finished jobid" in Path(log).read_text(), log

    # A group job runs its checkpoints one after the other, and is sized so: the largest memory and thread
    # count of one member, the wall times of all members summed (not memory summed as for parallel members).
    # (extract asks for more at the gradient steps, where it runs the backward pass too)
    extract, metrics = resources_of(out, "extract"), resources_of(out, "metrics")
    assert {r["gpu"] for r in extract} == {"0"}  # extract.device: cpu
    for group, members in (("group_sweep", extract), ("group_measure", metrics)):
        assert len(members) == n_checkpoints
        memory, runtime = {int(m["mem_mb"]) for m in members}, [int(m["runtime"]) for m in members]
        jobs = [scontrol_job(job_id) for job_id, log in submitted if group in log]
        for job in jobs:
            assert job["MinMemoryNode"] in {f"{mb}M" for mb in memory}, job
            assert job["NumCPUs"] == "1", job
            assert minutes(job["TimeLimit"]) <= PER_GROUP * max(runtime), job
        assert sum(minutes(job["TimeLimit"]) for job in jobs) == sum(runtime)
    groups = [scontrol_job(job_id) for job_id, log in submitted if "group_sweep" in log]
    # ... and `jobslot` limits the members of one group job only, not the SLURM jobs: the two ran together
    # (where the node has room for both).
    node = subprocess.run(
        ["scontrol", "--oneliner", "show", "node", slurm_cluster.node],
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
    ).stdout
    cpus, memory = (int(re.search(rf"\b{key}=(\d+)", node)[1]) for key in ("CPUTot", "RealMemory"))
    first, second = (sorted(groups, key=lambda job: job["StartTime"]) * 2)[:2]
    if len(groups) >= 2 and cpus >= 2 and memory >= 2 * int(first["MinMemoryNode"].rstrip("M")):
        assert second["StartTime"] < first["EndTime"], (first["StartTime"], first["EndTime"], second["StartTime"])


def test_sweep_on_slurm_equals_local_sweep(cluster_run, local_run):
    tables = sorted(p.relative_to(local_run.workdir) for p in (local_run.workdir / "results").rglob("*.parquet"))
    on_slurm = sorted(p.relative_to(cluster_run.workdir) for p in (cluster_run.workdir / "results").rglob("*.parquet"))
    assert tables == on_slurm
    assert len(tables) >= len(CHECKPOINTS) * 7 + len(SWEEP["models"])  # per checkpoint 6 extract tables + metrics
    different = [
        str(p)
        for p in tables
        if not pl.read_parquet(local_run.workdir / p).equals(pl.read_parquet(cluster_run.workdir / p))
    ]
    assert not different, f"differ between the local and the SLURM run: {different}"
    figures = sorted(p.relative_to(local_run.workdir) for p in (local_run.workdir / "results").rglob("*.png"))
    assert figures and figures == sorted(
        p.relative_to(cluster_run.workdir) for p in (cluster_run.workdir / "results").rglob("*.png")
    )


FAILING = """\
# extract fails inside a SLURM group job (the profile groups extracts).
rule all:
    input: expand("m{i}.txt", i=range(2))

rule extract:
    output: "e{i}.txt"
    shell: "echo 'deliberate failure of {output}' >&2; exit 3"

rule metrics:
    input: "e{i}.txt"
    output: "m{i}.txt"
    shell: "cp {input} {output}"
"""


def test_failed_job_is_reported_not_waited_on(failing_run, slurm_cluster):
    run = failing_run.result(timeout=300, cluster=slurm_cluster)
    TIMINGS["failing job on SLURM"] = run.seconds
    assert run.rc != 0, diagnose(run, slurm_cluster)
    assert run.seconds < 240, f"a failed SLURM job took {run.seconds:.0f} s to be reported"
    assert "Error in group sweep" in run.out and "Trying to restart job" in run.out, diagnose(run, slurm_cluster)
    submitted = SUBMITTED.findall(run.out)
    assert len(submitted) == 2, submitted  # the first try and the profile's one retry
    for job_id, log in submitted:
        assert scontrol_job(job_id)["JobState"] == "FAILED"
        assert "deliberate failure" in Path(log).read_text(), log  # a failed job's SLURM log is kept


def test_gpu_only_for_cuda_and_profile_semantics(tmp_path):
    """Dry runs (no cluster needed): extract's gpu resource follows extract.device, and `--profile` would
    bring profiles/default (cores: all, gpu=1 as a global limit) into a cluster run."""
    config = yaml.safe_load(TINY.read_text())
    config["extract"]["device"] = "cuda"
    cuda = tmp_path / "cuda.yaml"
    cuda.write_text(yaml.safe_dump(config))
    run = snakemake(tmp_path / "cuda", "-n", "--workflow-profile", str(PROFILE), configfile=cuda, timeout=120)
    assert run.rc == 0, run.out[-4000:]
    assert {r["gpu"] for r in resources_of(run.out, "extract")} == {"1"}
    assert "profiles/default" not in run.out

    run = snakemake(tmp_path / "profile", "-n", "--profile", str(PROFILE), timeout=120)
    assert run.rc == 0, run.out[-4000:]
    assert re.search(r"^Using profiles? \S+ and workflow specific profile \S*profiles/default for", run.out, re.M)
    assert {r["gpu"] for r in resources_of(run.out, "extract")} == {"0"}
