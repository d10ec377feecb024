"""A sweep of a planted grid, online against a local Hub (tests/fakehub.py) that serves tiny Pythia models under
``EleutherAI/pythia-70m`` with a defect of each kind the audit looks for:

- ``step0``: the final model's bytes (EleutherAI/pythia#205): a duplicate, never downloaded;
- ``step2``: its first shard is the final model's (EleutherAI/pythia#206): a partial duplicate, analysed and flagged;
- ``step4``: a branch without weights (EleutherAI/pythia#202); ``step8``: no branch at all;
- ``step16``: its shard index names three shards, the branch holds two: incomplete, never downloaded;
- ``step1`` and ``step143000`` (= ``main``): sound.

Snakemake runs in a subprocess with ``HF_ENDPOINT`` pointed at the server; the server records every request, so
the test sees what was downloaded, and that the audit named every defect before the first download.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import polars as pl
import pytest
import yaml
from fakehub import FakeHub, read_folder

from conftest import job_stats, snakemake_command
from hubcache import save_tiny_pythia, write_eval_corpus

# fetch, extract and metrics of three tiny checkpoints through Snakemake; its Snakemake runs share one warm worker
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_worker")]

REPO = "EleutherAI/pythia-70m"
STEPS = [0, 1, 2, 4, 8, 16, 143000]
EXTRACT = {"n_sequences": 8, "seq_len": 32, "batch_size": 4, "sample_tokens": 64, "device": "cpu", "seed": 0}
FIRST = "model-00001-of-00003.safetensors"
LAST = "model-00003-of-00003.safetensors"
INDEX = "model.safetensors.index.json"


def planted(models: Path) -> dict[str, dict[str, bytes]]:
    final = read_folder(save_tiny_pythia(models / "final", seed=0, max_shard_size="60KB"))
    own = read_folder(save_tiny_pythia(models / "one", seed=1, max_shard_size="60KB"))
    two = read_folder(save_tiny_pythia(models / "two", seed=2, max_shard_size="60KB"))
    assert FIRST in final and LAST in final and final[INDEX] == two[INDEX]
    bare = {name: data for name, data in own.items() if not name.startswith("model")}
    return {
        "main": final,
        "step143000": final,
        "step0": final,
        "step1": own,
        "step2": two | {FIRST: final[FIRST]},
        "step4": bare,
        "step16": {name: data for name, data in two.items() if name != LAST},
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("auditsweep")
    hub = FakeHub({REPO: planted(root / "models")})
    corpus = write_eval_corpus(root / "eval.txt")
    config = {
        "models": [{"family": "pythia", "name": "pythia-70m", "steps": STEPS}],
        "corpus": {"source": "text", "paths": [str(corpus)]},
        "extract": EXTRACT,
        "fetch": {"keep_weights": False, "retries": 0},
        "resources": {"extract_threads": 1},
    }
    configfile = root / "config.yaml"
    configfile.write_text(yaml.safe_dump(config, sort_keys=False))
    workdir = root / "work"
    workdir.mkdir()
    with hub.serving():
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
        env.update(
            HF_HOME=str(root / "hf"),
            HF_ENDPOINT=hub.url,
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_XET="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
        )
        yield {"hub": hub, "env": env, "workdir": workdir, "config": configfile, "root": root}


def snakemake(world, *args, timeout=900):
    command = snakemake_command(world["workdir"], "--configfile", str(world["config"]), "--cores", "2", *args)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=world["env"])


@pytest.fixture(scope="module")
def swept(world):
    hub = world["hub"]
    done = snakemake(world, "results/pythia/pythia-70m/sweep.parquet")
    assert done.returncode == 0, done.stderr[-6000:]
    return {"done": done, "requests": list(hub.requests), "downloads": hub.downloads(), "served": list(hub.served)}


def branch_of(world, commit: str) -> str:
    return {c: b for b, c in world["hub"].commits[REPO].items()}[commit]


def test_nothing_the_audit_flags_is_downloaded(swept, world):
    fetched = {(branch_of(world, d.split("@")[1].split("/")[0]), d.rsplit("/", 1)[1]) for d in swept["downloads"]}
    weights = {(b, f) for b, f in fetched if f.endswith(".safetensors")}
    assert {b for b, _ in weights} == {"step1", "step2", "step143000"}, sorted(fetched)
    # of a flagged branch, at most the shard index the audit reads
    assert all(f == INDEX for b, f in fetched if b in ("step0", "step4", "step16", "main")), sorted(fetched)


def test_each_weight_byte_moves_once(swept, world):
    """fetch downloads each analysed branch's weight files whole, once; the weights and logit-lens jobs (run with
    the sweep: its metrics join their rows) read the copies fetch shared with them, moving nothing more: no range
    read of a header or a tensor. The shard indexes and configs are small files of their own, not counted here."""
    hub = world["hub"]
    moved: dict[tuple[str, str], int] = {}
    for path, n in swept["served"]:
        revision, name = path.split("/resolve/", 1)[1].split("/", 1)
        if name.endswith(".safetensors"):
            key = (hub.commits[REPO].get(revision, revision), name)
            moved[key] = moved.get(key, 0) + n
    sizes = {
        (hub.commits[REPO][branch], name): len(data)
        for branch in ("step1", "step2", "step143000")
        for name, data in hub.repos[REPO][branch].items()
        if name.endswith(".safetensors")
    }
    assert moved == sizes
    gets = [p for m, p in swept["requests"] if m == "GET" and p.endswith(".safetensors")]
    assert len(gets) == len(sizes)  # one request per file: no range read after it
    for step in (1, 2, 143000):
        folder = world["workdir"] / f"results/pythia/pythia-70m/step{step}"
        assert (folder / "weights.parquet").is_file() and (folder / "logit_lens.parquet").is_file()
        for reader in ("weights", "logit_lens"):
            log = (world["workdir"] / f"logs/{reader}/pythia/pythia-70m/step{step}.log").read_text()
            assert "in the copy fetch shared" in log, log[-2000:]
    # the copies removed by their jobs, the downloads once extracted: weights/ holds nothing
    assert not [p for p in (world["workdir"] / "weights").rglob("*") if p.is_file() or p.is_symlink()]


def test_every_defect_is_named_before_the_first_download(swept, world):
    text = swept["done"].stderr
    first_job = text.index("rule fetch") if "rule fetch" in text else len(text)
    audit = text[:first_job]
    for expected in (
        "repeat step143000: steps 0",
        "partial: step2: model-00001-of-00003.safetensors",
        "no_weights: step4",
        f"incomplete: step16: its shard index {INDEX} names {LAST}, which the branch does not hold",
        "swept and flagged: steps 0, 2, 4, 8, 16",
    ):
        assert expected in audit, text[-4000:]
    requests = swept["requests"]
    first_download = next(i for i, (m, p) in enumerate(requests) if m == "GET" and p.endswith(".safetensors"))
    listed = {p.rsplit("/tree/", 1)[1] for m, p in requests[:first_download] if "/tree/" in p}
    assert listed >= set(world["hub"].commits[REPO].values())  # every branch listed before any weight moved


def test_the_sweep_lists_the_flagged_steps_and_analyses_the_rest(swept, world):
    sweep = pl.read_parquet(world["workdir"] / "results/pythia/pythia-70m/sweep.parquet")
    rows = {r["step"]: r for r in sweep.unique("step", keep="first").iter_rows(named=True)}
    assert sorted(rows) == STEPS
    assert (rows[0]["status"], rows[0]["repeats"], rows[0]["duplicate_of_step"]) == ("duplicate", "step143000", 143000)
    assert (rows[4]["status"], rows[8]["status"]) == ("no_weights", "missing")
    assert (rows[16]["status"], rows[16]["audit"]) == ("incomplete", "incomplete")
    assert rows[2]["audit"] == "partial" and "step143000" in rows[2]["repeats"]
    assert rows[1]["audit"] == "ok" and rows[143000]["audit"] == "ok"
    for step in (1, 2, 143000):  # analysed, the partial duplicate too
        assert (world["workdir"] / f"results/pythia/pythia-70m/step{step}/metrics.parquet").is_file()
    for step in (0, 4, 8, 16):
        assert not (world["workdir"] / f"results/pythia/pythia-70m/step{step}").exists()
    grid = pl.read_parquet(world["workdir"] / "results/pythia/pythia-70m/grid.parquet")
    assert grid.filter(pl.col("step") == 0)["status"].item() == "duplicate"


def planned(world) -> tuple[dict[str, int], str]:
    """What a dry run would do: Snakemake's job counts (without `all`), and its output."""
    done = snakemake(world, "-n", "results/pythia/pythia-70m/sweep.parquet", timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return job_stats(done), done.stdout + done.stderr


def test_a_branch_pushed_again_reruns_that_checkpoint_alone(swept, world):
    """And the dry runs write nothing: the audit's grid.parquet, which the sweep reads, is written when a run starts
    (issue 43: a dry run wrote the audit of the pushed branch, which a run going on beside it would have read)."""
    # model runs only: other jobs rerun when the package's analysis code is edited (others work in this checkout)
    grid = world["workdir"] / "results/pythia/pythia-70m/grid.parquet"
    written = grid.read_bytes(), grid.stat().st_mtime_ns
    before, _ = planned(world)
    assert (before.get("fetch"), before.get("extract")) == (None, None), before  # audited again, branches unchanged
    hub = world["hub"]
    fixed = read_folder(save_tiny_pythia(world["root"] / "models" / "one-again", seed=3, max_shard_size="60KB"))
    old = hub.repos[REPO]["step1"]
    hub.push(REPO, "step1", fixed)
    try:
        jobs, text = planned(world)
    finally:
        hub.push(REPO, "step1", old)
    assert (jobs.get("fetch"), jobs.get("extract"), jobs.get("metrics", 0) >= 1, jobs.get("sweep")) == (1, 1, True, 1)
    assert "output: weights/pythia/pythia-70m/step1\n" in text, text[-3000:]  # the one fetch is step1's
    assert (grid.read_bytes(), grid.stat().st_mtime_ns) == written


def test_with_the_hub_unreachable_and_nothing_cached_it_stops_before_any_job(world, tmp_path):
    env = world["env"] | {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "empty")}
    workdir = tmp_path / "work"
    workdir.mkdir()
    command = snakemake_command(workdir, "--configfile", str(world["config"]), "--cores", "1", "-n")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode != 0
    text = done.stdout + done.stderr  # Snakemake prints a WorkflowError on stdout
    assert "could not be audited" in text and "audit.allow_unaudited: true" in text, text[-3000:]
    assert "Job stats" not in text
    allowed = tmp_path / "allowed.yaml"
    allowed.write_text(
        yaml.safe_dump(yaml.safe_load(world["config"].read_text()) | {"audit": {"allow_unaudited": True}})
    )
    command = snakemake_command(workdir, "--configfile", str(allowed), "--cores", "1", "-n")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "swept unaudited" in done.stderr


def test_a_weights_only_run_fetches_nothing_and_a_sweep_reads_after_fetch(world, tmp_path):
    """Checkpoints never extracted: `snakemake weights_only` plans their weight measures without a fetch (range
    requests read what they need); the default target orders each after its checkpoint's fetch, whose weights they
    read."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    plans = {}
    for target in ("weights_only", "results/pythia/pythia-70m/sweep.parquet"):
        command = snakemake_command(workdir, "--configfile", str(world["config"]), "--cores", "1", "-n", target)
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=world["env"])
        assert done.returncode == 0, done.stderr[-3000:]
        plans[target] = job_stats(done), done.stdout + done.stderr
    jobs, _ = plans["weights_only"]
    assert (jobs.get("fetch"), jobs.get("extract"), jobs.get("weights")) == (None, None, 3), jobs
    jobs, text = plans["results/pythia/pythia-70m/sweep.parquet"]
    assert (jobs.get("fetch"), jobs.get("weights")) == (3, 3), jobs
    assert "input: logs/fetch/pythia/pythia-70m/step1.log" in text, text[-3000:]
