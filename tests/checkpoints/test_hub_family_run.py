"""A user's tiny model pushed to a local Hub cache, swept with `family: hub` by the whole workflow, offline.

The cache (tests/hubcache.py) holds a tiny GPT-NeoX pushed as branches ``step0``, ``step100``, ``step200`` of
``me/tiny-run`` (``main`` the last push), a tiny BERT at ``main`` of ``me/tiny-bert`` (``steps: final``), and a
Trainer's pushes as folders ``checkpoint-10/``, ``checkpoint-20/`` of ``me/trainer-pushes`` with the tokenizer once
at the top (named ``trainer`` in the results, ``repo:`` holding the id). Snakemake runs the sweep tables with
``HF_HUB_OFFLINE=1``; dry runs then show what a change reruns (docs/reruns.md): a branch pushed again, a folder
pushed beside the others, an entry's keys.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest
import yaml

from conftest import job_stats, snakemake_command
from hubcache import build_hub_cache, offline_env, save_tiny_bert, save_tiny_pythia, write_eval_corpus

# Snakemake runs on the offline hub; its Snakemake runs share one warm worker
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_worker")]

EXTRACT = {"n_sequences": 8, "seq_len": 32, "batch_size": 4, "sample_tokens": 64, "device": "cpu", "seed": 0}
RUN = {"family": "hub", "name": "me/tiny-run", "revision": "step{step}", "steps": "all"}
BERT = {"family": "hub", "name": "me/tiny-bert", "steps": "final"}
PUSHES = {
    "family": "hub",
    "name": "trainer",
    "repo": "me/trainer-pushes",
    "subfolder": "checkpoint-{step}",
    "steps": "all",
}
MODELS = [RUN, BERT, PUSHES]
SWEEPS = ["results/hub/me--tiny-run/sweep.parquet", "results/hub/me--tiny-bert/sweep.parquet"]
SWEEPS += ["results/hub/trainer/sweep.parquet"]


def trainer_files(models: dict[int, Path], tokenizer: Path) -> dict[str, bytes]:
    files = {
        f"checkpoint-{step}/{p.name}": p.read_bytes()
        for step, folder in models.items()
        for p in folder.iterdir()
        if "tokenizer" not in p.name
    }
    files |= {f"checkpoint-{step}/optimizer.pt": b"not a model" for step in models}
    return files | {p.name: p.read_bytes() for p in tokenizer.iterdir() if "tokenizer" in p.name}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("hubfamily")
    m = root / "models"
    a, b, c = (save_tiny_pythia(m / name, seed=seed) for name, seed in (("a", 0), ("b", 1), ("c", 2)))
    bert = save_tiny_bert(m / "bert", seed=0)
    hf_home = root / "hf"
    commits = build_hub_cache(hf_home, "me/tiny-run", {"step0": a, "step100": b, "step200": c, "main": c})
    build_hub_cache(hf_home, "me/tiny-bert", {"main": bert})
    build_hub_cache(hf_home, "me/trainer-pushes", {"main": trainer_files({10: a, 20: b}, a)})
    corpus = write_eval_corpus(root / "eval.txt")
    env = offline_env(hf_home)
    return {"root": root, "hf_home": hf_home, "commits": commits, "corpus": corpus, "env": env, "models": m}


def write_config(world, path: Path, models: list[dict]) -> Path:
    config = {
        "models": models,
        "corpus": {"source": "text", "paths": [str(world["corpus"])]},
        "extract": EXTRACT,
        "fetch": {"keep_weights": False, "retries": 1},
        "resources": {"extract_threads": 1},
        "weights": {
            "enabled": False
        },  # which checkpoints are swept is the point; test_hub_pipeline.py measures Hub weights
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def snakemake(env, workdir: Path, configfile: Path, *args: str) -> subprocess.CompletedProcess:
    command = snakemake_command(workdir, "--configfile", str(configfile), "--cores", "2", *args, *SWEEPS)
    return subprocess.run(command, capture_output=True, text=True, timeout=1200, env=env)


def planned(env, workdir: Path, configfile: Path) -> dict[str, int]:
    """The jobs a dry run schedules (Snakemake's `Job stats`), without `all` and `total`."""
    done = snakemake(env, workdir, configfile, "-n")
    assert done.returncode == 0, done.stderr[-3000:]
    return job_stats(done)


@pytest.fixture(scope="module")
def swept(world):
    workdir = world["root"] / "work"
    workdir.mkdir()
    configfile = write_config(world, world["root"] / "config.yaml", MODELS)
    done = snakemake(world["env"], workdir, configfile)
    assert done.returncode == 0, done.stderr[-6000:]
    return {"workdir": workdir, "config": configfile}


def info(swept, model: str, step: int) -> dict:
    return json.loads((swept["workdir"] / f"results/hub/{model}/step{step}/extract.json").read_text())["checkpoint"]


def test_branches_pushed_by_a_user_are_swept(swept, world):
    sweep = pl.read_parquet(swept["workdir"] / "results/hub/me--tiny-run/sweep.parquet")
    assert sorted(sweep["step"].unique()) == [0, 100, 200] and sweep["tokens_seen"].is_null().all()
    for step in (0, 100, 200):
        checkpoint = info(swept, "me--tiny-run", step)
        assert (checkpoint["repo_id"], checkpoint["revision"]) == ("me/tiny-run", f"step{step}")
        assert checkpoint["commit"] == world["commits"][f"step{step}"]
        assert checkpoint["trust_remote_code"] is False and checkpoint["subfolder"] is None
        qk = pl.read_parquet(swept["workdir"] / f"results/hub/me--tiny-run/step{step}/qk.parquet")
        assert set(qk["rope"]) == {"pre", "post"} and qk["qk_cos"].is_finite().all()
    assert not list((swept["workdir"] / "weights").rglob("*.safetensors"))  # temporary, deleted once extracted


def test_the_default_revision_and_a_trainers_folders(swept):
    bert = info(swept, "me--tiny-bert", 0)
    assert (bert["repo_id"], bert["revision"], bert["tokens_seen"]) == ("me/tiny-bert", "main", None)
    for step in (10, 20):
        checkpoint = info(swept, "trainer", step)
        assert (checkpoint["revision"], checkpoint["subfolder"]) == ("main", f"checkpoint-{step}")
        assert checkpoint["weight_files"] == ["model.safetensors"]
    sweep = pl.read_parquet(swept["workdir"] / "results/hub/trainer/sweep.parquet")
    assert sorted(sweep["step"].unique()) == [10, 20] and (sweep["status"] == "ok").all()


# ---------------------------------------------------------------------------------------------- reruns


def test_nothing_changed_reruns_nothing(swept, world):
    assert planned(world["env"], swept["workdir"], swept["config"]) == {}


def test_a_branch_pushed_again_reruns_that_checkpoint(swept, world, tmp_path):
    hf_home = tmp_path / "hf"
    shutil.copytree(world["hf_home"], hf_home, symlinks=True)
    # new weights (of no other step: the audit of the grid would leave a duplicate out), a new commit
    build_hub_cache(hf_home, "me/tiny-run", {"step100": save_tiny_pythia(tmp_path / "d", seed=3)})
    jobs = planned({**world["env"], "HF_HOME": str(hf_home)}, swept["workdir"], swept["config"])
    assert (jobs.get("fetch"), jobs.get("extract"), jobs.get("metrics")) == (1, 1, 1), jobs


def test_a_folder_pushed_beside_the_others_runs_that_one_only(swept, world, tmp_path):
    hf_home = tmp_path / "hf"
    shutil.copytree(world["hf_home"], hf_home, symlinks=True)
    m = world["models"]
    build_hub_cache(
        hf_home, "me/trainer-pushes", {"main": trainer_files({10: m / "a", 20: m / "b", 30: m / "c"}, m / "a")}
    )
    jobs = planned({**world["env"], "HF_HOME": str(hf_home)}, swept["workdir"], swept["config"])
    assert (jobs.get("fetch"), jobs.get("extract"), jobs.get("metrics")) == (1, 1, 1), jobs


@pytest.mark.parametrize("change", [{"tokens_per_step": 2048}, {"trust_remote_code": True}, {"seed": 3}])
def test_an_entry_key_reruns_its_checkpoints(swept, world, tmp_path, change):
    configfile = write_config(world, tmp_path / "config.yaml", [{**RUN, **change}, BERT, PUSHES])
    jobs = planned(world["env"], swept["workdir"], configfile)
    assert (jobs.get("fetch"), jobs.get("extract"), jobs.get("metrics")) == (3, 3, 3), jobs


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "repo, config, message",
    [
        (
            "facebook/wav2vec2-conformer-rel-pos-large",
            {"model_type": "wav2vec2-conformer", "architectures": ["Wav2Vec2ConformerForPreTraining"]},
            r"config: hub/facebook--wav2vec2-conformer-rel-pos-large/step0: no adapter knows the architecture "
            r"'Wav2Vec2ConformerForPreTraining'.*supported: ",
        ),
        (
            "helboukkouri/character-bert",
            {"model_type": "character_bert", "auto_map": {"AutoModel": "modeling_character_bert.CharacterBertModel"}},
            r"needs the repository's own code .*set trust_remote_code: true",
        ),
    ],
)
def test_a_cached_config_json_stops_the_workflow_before_any_job(world, tmp_path, repo, config, message):
    """Offline the cache holds config.json: an architecture without an adapter, or remote code the entry does not
    allow, stops the workflow when the config is read (online, at the checkpoint's fetch, before its weights)."""
    import re

    hf_home = tmp_path / "hf"
    shutil.copytree(world["hf_home"], hf_home, symlinks=True)
    build_hub_cache(
        hf_home, repo, {"main": {"config.json": json.dumps(config).encode()}}, remote_only={"model.safetensors": b"w"}
    )
    configfile = write_config(world, tmp_path / "config.yaml", [{"family": "hub", "name": repo, "steps": "final"}])
    workdir = tmp_path / "work"
    workdir.mkdir()
    command = snakemake_command(workdir, "--configfile", str(configfile), "--cores", "1", "-n")
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**world["env"], "HF_HOME": str(hf_home)}
    )
    assert done.returncode != 0 and re.search(message, done.stdout + done.stderr), (done.stdout + done.stderr)[-3000:]
