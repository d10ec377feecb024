"""The real-checkpoint families through the workflow (fetch, extract, metrics, sweep), offline.

A Hugging Face cache built by the test (tests/hubcache.py) holds tiny random models under the real repo ids
and revisions: ``EleutherAI/pythia-70m`` at ``step0``/``step1000``/``step143000`` (``step0`` serves the same
bytes as ``step143000``: the known Pythia defect of an early branch serving the final weights) and
``google/multiberts-seed_0-step_{20,40}k`` at ``main`` (one repo per step, ``BertForPreTraining`` in
``pytorch_model.bin`` beside a ``tf_model.h5`` that must never be fetched). Two local runs sit beside it: a
Trainer-style one (``checkpoint-500/``, ``checkpoint-1000/``, tokenizer only in the run folder) and a
``step{N}/`` one. Snakemake runs the workflow on them in a subprocess with ``HF_HUB_OFFLINE=1`` and
``HF_HOME`` pointing at the test cache, as a user runs it. Figures are left to test_workflow.py (they are drawn
from the same sweep tables) to keep this under a minute of CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from anisweep.checkpoints.catalogue import resolve
from anisweep.checkpoints.fetch import fetch
from anisweep.checkpoints.weight_files import WeightFiles
from anisweep.measures.sweep import aggregate, find_duplicates
from anisweep.tables import METRIC_SCHEMA, extract_columns, write_atomic

from conftest import snakemake_command
from hubcache import (
    build_hub_cache,
    offline_env,
    offline_hub,
    repo_cache_dir,
    save_tiny_bert,
    save_tiny_decoder,
    save_tiny_pythia,
    write_eval_corpus,
)

pytestmark = pytest.mark.usefixtures("shared_worker")  # the Snakemake runs share one warm worker

ROOT = Path(__file__).resolve().parents[2]

PYTHIA_TOKENS = 2_097_152
MULTIBERTS_TOKENS = 131_072
TF = b"\x89HDF\r\n\x1a\n" + b"\0" * 64  # a dummy tf_model.h5: never fetched

CONTRACT = {
    **{f"{name}.parquet": extract_columns(name) for name in ("qk", "attention")},
    "metrics.parquet": ["family", "model", "step", "tokens_seen", "layer", "head", "site", "metric", "value"],
}

EXTRACT = {
    "n_sequences": 8,
    "seq_len": 32,
    "batch_size": 4,
    "sample_tokens": 64,
    "device": "cpu",
    "dtype": "float32",
    "seed": 0,
}

# The sentences the tiny tokenizers were built from (tests/hubcache.py), so that both tokenize the corpus into
# real tokens, not [UNK]s.


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_state(root: Path) -> dict[str, tuple]:
    """Every entry under root: link target for symlinks, (size, mtime, sha256) for files."""
    state = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            state[rel] = ("link", os.readlink(p))
        elif p.is_file():
            state[rel] = ("file", p.stat().st_size, p.stat().st_mtime_ns, sha256(p))
        else:
            state[rel] = ("dir",)
    return state


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The offline hub, the local runs, the corpus and the environment every snakemake call gets."""
    root = tmp_path_factory.mktemp("hubpipe")
    m = root / "models"
    pythia_a = save_tiny_pythia(m / "pythia_a", seed=0)
    pythia_b = save_tiny_pythia(m / "pythia_b", seed=1)
    bert_a = save_tiny_bert(m / "bert_a", seed=0)
    bert_b = save_tiny_bert(m / "bert_b", seed=1)
    (bert_b / "tokenizer_config.json").unlink()  # vocab.txt + config.json only: AutoTokenizer must cope

    hf_home = root / "hf"
    commits = {
        "pythia-70m": build_hub_cache(
            hf_home,
            "EleutherAI/pythia-70m",
            {"step0": pythia_a, "step1000": pythia_b, "step143000": pythia_a, "main": pythia_a},
        )
    }
    for step, folder in ((20, bert_a), (40, bert_b)):
        commits[f"multiberts-{step}k"] = build_hub_cache(
            hf_home,
            f"google/multiberts-seed_0-step_{step}k",
            {"main": folder},
            extra_files={"tf_model.h5": TF},
            remote_only={"flax_model.msgpack": b"flax"},
        )

    # The other suites under their real ids and revisions: OLMo and OLMo 2 branches carry rounded token counts
    # that fetch looks up by step; the Mistral GPT-2 runs have checkpoint-N branches; TinyLlama one repo per step.
    decoders = {kind: save_tiny_decoder(m / kind, kind) for kind in ("olmo", "olmo2", "llama", "gpt2")}
    commits["olmo"] = build_hub_cache(
        hf_home,
        "allenai/OLMo-1B-hf",
        {"step1000-tokens4B": decoders["olmo"], "step10000-tokens41B": decoders["olmo"], "main": decoders["olmo"]},
    )
    commits["olmo2"] = build_hub_cache(
        hf_home, "allenai/OLMo-2-0425-1B", {"stage1-step23100-tokens49B": decoders["olmo2"]}
    )
    commits["gpt2"] = build_hub_cache(
        hf_home,
        "stanford-crfm/alias-gpt2-small-x21",
        {"checkpoint-400000": decoders["gpt2"]},
    )
    commits["tinyllama"] = build_hub_cache(
        hf_home, "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", {"main": decoders["llama"]}
    )

    runs = root / "runs"
    trainer = runs / "trainer"  # transformers.Trainer output_dir: checkpoint-{step}/, tokenizer saved once at the top
    for step, source in ((500, pythia_a), (1000, pythia_b)):
        ck = trainer / f"checkpoint-{step}"
        ck.mkdir(parents=True)
        for name in ("config.json", "model.safetensors", "generation_config.json"):
            if (source / name).exists():
                shutil.copy(source / name, ck / name)
        (ck / "optimizer.pt").write_bytes(b"not a model")
        (ck / "training_args.bin").write_bytes(b"not a model either")
        (ck / "trainer_state.json").write_text(json.dumps({"global_step": step, "num_input_tokens_seen": step * 256}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pythia_a / name, trainer / name)
    steps_run = runs / "steps"  # step{N}/ folders, each a full save_pretrained with its tokenizer
    for step, source in ((0, bert_a), (10, bert_b)):
        shutil.copytree(source, steps_run / f"step{step}")
        if not (steps_run / f"step{step}" / "tokenizer_config.json").exists():
            shutil.copy(bert_a / "tokenizer_config.json", steps_run / f"step{step}")

    corpus = write_eval_corpus(root / "eval.txt")

    env = offline_env(hf_home)
    return {
        "root": root,
        "hf_home": hf_home,
        "commits": commits,
        "trainer": trainer,
        "steps_run": steps_run,
        "corpus": corpus,
        "env": env,
        "models": {"pythia_a": pythia_a, "pythia_b": pythia_b, "bert_a": bert_a, "bert_b": bert_b},
    }


def write_config(world, path: Path, models: list[dict], **sections) -> Path:
    config = {
        "models": models,
        "corpus": {"source": "text", "paths": [str(world["corpus"])]},
        "extract": EXTRACT,
        "fetch": {"keep_weights": False, "retries": 1},
        "resources": {"extract_threads": 1},
        # the tiny models stand for several steps each (pythia-70m step0 serves step143000's bytes, OLMo's branches
        # main's): the audit of the grid flags them, and `keep` still analyses them, so that these tests see every
        # family's checkpoints through extract, and the sweep's own check of extract's hashes
        # (tests/workflow/test_audit_sweep.py runs the default, `skip`)
        "audit": {"flagged": "keep"},
        **sections,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


HUB_MODELS = [
    {"family": "pythia", "name": "pythia-70m", "steps": [0, 1000, 143000]},
    {"family": "multiberts", "name": "seed_0", "steps": {"start": 20000, "stop": 40000, "every": 20000}},
    {"family": "olmo", "name": "OLMo-1B-hf", "steps": [1000]},
    {"family": "olmo2", "name": "OLMo-2-0425-1B", "steps": [23100]},
    {"family": "gpt2", "name": "alias-gpt2-small-x21", "steps": [400000]},
    {"family": "tinyllama", "name": "TinyLlama-1.1B", "steps": "final"},
]


def local_models(world):
    return [
        {"family": "local", "name": "trainer-run", "path": str(world["trainer"]), "steps": "all"},
        {"family": "local", "name": "step-run", "path": str(world["steps_run"]), "steps": [10], "tokens_per_step": 64},
    ]


def snakemake(world, workdir: Path, configfile: Path, *targets: str, timeout: int = 600):
    command = snakemake_command(workdir, "--configfile", str(configfile), "--cores", "2", *targets)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=world["env"])


# Every sweep.parquet: fetch, extract, metrics and aggregate of every checkpoint. Figures are left to
# test_workflow.py, which draws them from the same tables.
def sweep_targets(models):
    return [f"results/{m['family']}/{m['name']}/sweep.parquet" for m in models]


@pytest.fixture(scope="module")
def sweep_run(world):
    """The workflow up to every sweep table on the hub and local models, weights temporary."""
    workdir = world["root"] / "work"
    workdir.mkdir()
    configfile = write_config(world, world["root"] / "config.yaml", HUB_MODELS + local_models(world))
    cache_before = tree_state(world["hf_home"])
    runs_before = tree_state(world["root"] / "runs")
    # a guard against a hung run, not a speed test: twelve checkpoints on cores that other jobs may share
    done = snakemake(world, workdir, configfile, *sweep_targets(HUB_MODELS + local_models(world)), timeout=1800)
    assert done.returncode == 0, done.stderr[-6000:]
    return {"workdir": workdir, "done": done, "cache_before": cache_before, "runs_before": runs_before}


def results(sweep_run, family, model, step) -> Path:
    return sweep_run["workdir"] / "results" / family / model / f"step{step}"


# ---------------------------------------------------------------------------------------------- hub families


EXPECTED = [
    ("pythia", "pythia-70m", 0, 0),
    ("pythia", "pythia-70m", 1000, 1000 * PYTHIA_TOKENS),
    ("pythia", "pythia-70m", 143000, 143000 * PYTHIA_TOKENS),
    ("multiberts", "seed_0", 20000, 20000 * MULTIBERTS_TOKENS),
    ("multiberts", "seed_0", 40000, 40000 * MULTIBERTS_TOKENS),
    ("olmo", "OLMo-1B-hf", 1000, 1000 * 4_194_304),
    ("olmo2", "OLMo-2-0425-1B", 23100, 23100 * 2_097_152),
    ("gpt2", "alias-gpt2-small-x21", 400000, 400000 * 524_288),
    ("tinyllama", "TinyLlama-1.1B", 1431000, 1431000 * 2_097_152),
    ("local", "trainer-run", 500, 500 * 256),
    ("local", "trainer-run", 1000, 1000 * 256),
    ("local", "step-run", 10, 10 * 64),
]


@pytest.mark.slow  # Snakemake runs on the offline hub
@pytest.mark.parametrize(
    ("family", "model", "step", "tokens"), EXPECTED, ids=[f"{f}-{m}-{s}" for f, m, s, _ in EXPECTED]
)
def test_tables_are_labelled_with_step_and_tokens_seen(sweep_run, family, model, step, tokens):
    folder = results(sweep_run, family, model, step)
    for name, columns in CONTRACT.items():
        df = pl.read_parquet(folder / name)
        assert set(columns) <= set(df.columns), (name, set(columns) - set(df.columns))
        assert df.height > 0
        assert df["step"].unique().to_list() == [step], name
        assert df["tokens_seen"].unique().to_list() == [tokens], name
    qk = pl.read_parquet(folder / "qk.parquet")
    rotary = family in ("pythia", "olmo", "olmo2", "tinyllama") or model == "trainer-run"
    assert set(qk["rope"]) == ({"pre", "post"} if rotary else {"pre"}) | ({"pre_norm"} if family == "olmo2" else set())
    assert qk["qk_cos"].is_finite().all()


@pytest.mark.slow  # Snakemake runs on the offline hub
def test_extract_records_commit_and_weight_hash(sweep_run, world):
    hf = world["hf_home"]
    for step, revision in ((0, "step0"), (1000, "step1000"), (143000, "step143000")):
        info = json.loads((results(sweep_run, "pythia", "pythia-70m", step) / "extract.json").read_text())["checkpoint"]
        commit = world["commits"]["pythia-70m"][revision]
        assert (info["repo_id"], info["revision"], info["commit"]) == ("EleutherAI/pythia-70m", revision, commit)
        blob = repo_cache_dir(hf, "EleutherAI/pythia-70m") / "snapshots" / commit / "model.safetensors"
        assert info["weight_files"] == ["model.safetensors"]  # safetensors; no .bin, no tf
        assert info["weights_sha256"] == sha256(blob)
    for step in (20000, 40000):
        info = json.loads((results(sweep_run, "multiberts", "seed_0", step) / "extract.json").read_text())["checkpoint"]
        repo = f"google/multiberts-seed_0-step_{step // 1000}k"
        commit = world["commits"][f"multiberts-{step // 1000}k"]["main"]
        assert (info["repo_id"], info["revision"], info["commit"]) == (repo, "main", commit)
        assert info["weight_files"] == ["pytorch_model.bin"]  # the .bin, since the repo has no safetensors
        assert info["weights_sha256"] == sha256(repo_cache_dir(hf, repo) / "snapshots" / commit / "pytorch_model.bin")


@pytest.mark.slow  # Snakemake runs on the offline hub
def test_multiberts_pretraining_checkpoint_loads_with_its_heads(sweep_run):
    """BertForPreTraining (pooler, MLM and NSP heads) loads; only the encoder runs; the MLM decoder is the
    output embedding, tied to the input one as in BERT."""
    for step in (20000, 40000):
        folder = results(sweep_run, "multiberts", "seed_0", step)
        emb = pl.read_parquet(folder / "embeddings.parquet")
        assert set(emb["matrix"]) == {"embed_in", "embed_out"} and emb["tied"].all()
        hidden = pl.read_parquet(folder / "hidden.parquet")
        assert {"resid", "final_ln_in", "final_ln_out"} == set(hidden["site"])
        attention = pl.read_parquet(folder / "attention.parquet")
        assert attention["entropy_mean"].is_finite().all() and (attention["p_max_mean"] <= 1).all()


@pytest.mark.slow  # Snakemake runs on the offline hub
def test_other_suites_record_their_branches_and_architectures(sweep_run, world):
    """The branch fetch looked up is in extract.json; TinyLlama's grouped-query attention maps 4 query heads
    onto 2 key heads; OLMo's norms have no parameters, OLMo 2's sit after the sublayers."""
    olmo = json.loads((results(sweep_run, "olmo", "OLMo-1B-hf", 1000) / "extract.json").read_text())["checkpoint"]
    assert (olmo["revision"], olmo["commit"]) == ("step1000-tokens4B", world["commits"]["olmo"]["step1000-tokens4B"])
    gpt2 = json.loads((results(sweep_run, "gpt2", "alias-gpt2-small-x21", 400000) / "extract.json").read_text())
    assert gpt2["checkpoint"]["revision"] == "checkpoint-400000" and gpt2["checkpoint"]["seed"] == 21
    qk = pl.read_parquet(results(sweep_run, "tinyllama", "TinyLlama-1.1B", 1431000) / "qk.parquet")
    assert qk.filter((pl.col("layer") == 0) & (pl.col("rope") == "post")).sort("head")["kv_head"].to_list() == [
        0,
        0,
        1,
        1,
    ]
    ln = pl.read_parquet(results(sweep_run, "olmo", "OLMo-1B-hf", 1000) / "layernorm.parquet")
    assert ln["gain"].is_null().all() and ln["bias"].is_null().all()
    ln2 = pl.read_parquet(results(sweep_run, "olmo2", "OLMo-2-0425-1B", 23100) / "layernorm.parquet")
    assert set(ln2["site"]) == {"ln_attn_post", "ln_mlp_post", "final_ln"} and ln2["bias"].is_null().all()
    for family, model in (("olmo", "OLMo-1B-hf"), ("olmo2", "OLMo-2-0425-1B"), ("tinyllama", "TinyLlama-1.1B")):
        sweep = pl.read_parquet(sweep_run["workdir"] / "results" / family / model / "sweep.parquet")
        final = sweep.filter((pl.col("site") == "final_ln_out") & (pl.col("metric") == "avg_cos"))
        assert final.height > 0 and final["value"].is_finite().all(), (family, model)


@pytest.mark.slow  # Snakemake runs on the offline hub
def test_byte_identical_revisions_are_flagged_with_a_warning(sweep_run):
    workdir = sweep_run["workdir"]
    sweep = pl.read_parquet(workdir / "results" / "pythia" / "pythia-70m" / "sweep.parquet")
    status = {
        r["step"]: (r["status"], r["duplicate_of_step"])
        for r in sweep.select("step", "status", "duplicate_of_step").unique().iter_rows(named=True)
    }
    # step0 serves step143000's bytes: step0 is flagged, never analysed as a training step
    assert status == {0: ("duplicate", 143000), 1000: ("ok", None), 143000: ("ok", None)}
    log = (workdir / "logs" / "sweep" / "pythia" / "pythia-70m.log").read_text()
    assert "step 0 has byte-identical weights to step 143000" in log
    for family, model in (
        ("multiberts", "seed_0"),
        ("olmo", "OLMo-1B-hf"),
        ("local", "trainer-run"),
        ("local", "step-run"),
    ):
        other = pl.read_parquet(workdir / "results" / family / model / "sweep.parquet")
        assert (other["status"] == "ok").all(), (family, model)


@pytest.mark.slow  # Snakemake runs on the offline hub
def test_weights_are_temporary_and_the_cache_is_untouched(sweep_run, world):
    weights = sweep_run["workdir"] / "weights"
    assert not [p for p in weights.rglob("*") if p.is_file() or p.is_symlink()]
    assert tree_state(world["hf_home"]) == sweep_run["cache_before"]
    assert tree_state(world["root"] / "runs") == sweep_run["runs_before"]  # local runs are read in place


# ---------------------------------------------------------------------------------------------- local runs


@pytest.mark.slow  # Snakemake runs on the offline hub
def test_local_runs_are_read_in_place_with_their_tokenizers(sweep_run, world):
    trainer = world["trainer"]
    for step in (500, 1000):
        info = json.loads((results(sweep_run, "local", "trainer-run", step) / "extract.json").read_text())["checkpoint"]
        assert info["path"] == str(trainer / f"checkpoint-{step}")
        assert info["tokenizer_path"] == str(trainer)  # the checkpoint folders have none
        assert info["commit"] is None and info["repo_id"] is None
        assert info["weight_files"] == ["model.safetensors"]  # not optimizer.pt / training_args.bin
        assert info["weights_sha256"] == sha256(trainer / f"checkpoint-{step}" / "model.safetensors")
    assert not results(sweep_run, "local", "step-run", 0).exists()  # step0/ exists but was not selected
    for step in (10,):
        info = json.loads((results(sweep_run, "local", "step-run", step) / "extract.json").read_text())["checkpoint"]
        assert info["path"] == info["tokenizer_path"] == str(world["steps_run"] / f"step{step}")
        assert info["weight_files"] == ["pytorch_model.bin"]


# ---------------------------------------------------------------------------------------------- keep_weights, errors


@pytest.mark.slow  # Snakemake runs on the offline hub
def test_keep_weights_uses_the_cache_in_place(world):
    workdir = world["root"] / "work-keep"
    workdir.mkdir()
    configfile = write_config(
        world, world["root"] / "keep.yaml", HUB_MODELS, fetch={"keep_weights": True, "retries": 1}
    )
    before = tree_state(world["hf_home"])
    targets = ["results/pythia/pythia-70m/step1000/extract.json", "results/multiberts/seed_0/step20000/extract.json"]
    done = snakemake(world, workdir, configfile, *targets)
    assert done.returncode == 0, done.stderr[-6000:]
    hf = world["hf_home"]
    for target, repo, commit in (
        (targets[0], "EleutherAI/pythia-70m", world["commits"]["pythia-70m"]["step1000"]),
        (targets[1], "google/multiberts-seed_0-step_20k", world["commits"]["multiberts-20k"]["main"]),
    ):
        info = json.loads((workdir / target).read_text())["checkpoint"]
        assert Path(info["path"]) == repo_cache_dir(hf, repo) / "snapshots" / commit
        assert info["commit"] == commit
    assert not [p for p in (workdir / "weights").rglob("*") if p.is_file() or p.is_symlink()]
    assert tree_state(hf) == before  # kept: the weights are still in the cache


@pytest.mark.slow  # Snakemake runs on the offline hub
def test_missing_revision_fails_naming_repo_and_revision(world):
    """A revision the (offline) cache lacks stops the workflow before any job: the audit of the grid cannot see it;
    swept unaudited, it stops the fetch at once, and the log names repo and revision."""
    workdir = world["root"] / "work-missing"
    workdir.mkdir()
    models = [{"family": "pythia", "name": "pythia-70m", "steps": [2000]}]
    configfile = write_config(world, world["root"] / "missing.yaml", models)
    done = snakemake(world, workdir, configfile, "results/pythia/pythia-70m/step2000/extract.json", timeout=300)
    assert done.returncode != 0
    text = done.stdout + done.stderr
    assert "pythia/pythia-70m: steps of the config could not be audited (steps 2000: " in text, text[-3000:]
    assert not (workdir / "logs" / "fetch").exists()
    configfile = write_config(world, world["root"] / "missing.yaml", models, audit={"allow_unaudited": True})
    done = snakemake(world, workdir, configfile, "results/pythia/pythia-70m/step2000/extract.json", timeout=300)
    assert done.returncode != 0
    log = (workdir / "logs" / "fetch" / "pythia" / "pythia-70m" / "step2000.log").read_text()
    assert "EleutherAI/pythia-70m at revision 'step2000'" in log and "HF_HUB_OFFLINE" in log
    assert not (workdir / "results" / "pythia" / "pythia-70m" / "step2000").exists()


def test_a_shard_served_under_another_step_is_flagged(monkeypatch, tmp_path):
    """pythia-12b's defect (EleutherAI/pythia#206): step50000 serves the final model's FIRST shard and its own
    other shards. The combined hash differs from the final model's; the per-shard hashes catch it."""
    hf_home = offline_hub(monkeypatch, tmp_path / "hf")
    final = save_tiny_pythia(tmp_path / "final", seed=0, max_shard_size="60KB")
    s49 = save_tiny_pythia(tmp_path / "s49", seed=1, max_shard_size="60KB")
    s50 = save_tiny_pythia(tmp_path / "s50", seed=2, max_shard_size="60KB")
    shards = sorted(p.name for p in final.glob("model-*.safetensors"))
    assert len(shards) == 3
    shutil.copy(final / shards[0], s50 / shards[0])  # the defect: shard 1 of the final model under step50000
    build_hub_cache(hf_home, "EleutherAI/pythia-12b", {"step49000": s49, "step50000": s50, "step143000": final})

    manifests = {}
    for step in (49000, 50000, 143000):
        (ckpt,) = resolve({"family": "pythia", "name": "pythia-12b", "steps": [step]})
        fetched = fetch(ckpt, tmp_path / "w" / str(step), keep_weights=True)
        manifests[step] = {**fetched, **WeightFiles.read(fetched["path"]).manifest()}  # as extract.json holds it
        assert sorted(manifests[step]["weight_files_sha256"]) == shards
    assert manifests[50000]["weights_sha256"] != manifests[143000]["weights_sha256"]
    dups = find_duplicates(manifests.values())
    assert [(d["step"], d["duplicate_of"], d["shared_files"]) for d in dups] == [
        (50000, [143000], [shards[0]]),
        (143000, [50000], [shards[0]]),
    ]

    # aggregate reads the same manifests from extract.json: step50000 flagged, never analysed
    paths = []
    for step, manifest in manifests.items():
        folder = tmp_path / "results" / f"step{step}"
        row = {
            "family": "pythia",
            "model": "pythia-12b",
            "seed": 1234,
            "step": step,
            "tokens_seen": step * PYTHIA_TOKENS,
            "layer": 0,
            "head": None,
            "site": "resid",
            "metric": "avg_cos",
            "value": 0.5,
        }
        write_atomic(pl.DataFrame([row], schema=METRIC_SCHEMA), folder / "metrics.parquet")
        (folder / "extract.json").write_text(json.dumps({"checkpoint": manifest}))
        paths.append(folder / "metrics.parquet")
    with pytest.warns(UserWarning, match="step 50000 has byte-identical weights to step 143000"):
        sweep = aggregate(paths, expected_steps=[49000, 50000, 143000], final_step=143000)
    status = dict(sweep.select("step", "status").iter_rows())
    assert status == {49000: "ok", 50000: "duplicate", 143000: "ok"}


# ---------------------------------------------------------------------------------------------- paper configs


@pytest.mark.parametrize(
    ("name", "n_checkpoints"),
    [("multiberts", 29), ("multiberts_seeds", 5 * 29), ("pythia", 8 * 21), ("norms", 9 + 9 + 7)],
)
def test_paper_configs_validate_without_the_network(name, n_checkpoints):
    """config/{multiberts,multiberts_seeds,pythia,norms}.yaml pass the schema and resolve from the catalogue alone (no
    Hub call)."""
    from anisweep.config import checkpoints, load
    from anisweep.media import corpus_settings

    config = load(ROOT / "config" / f"{name}.yaml")
    found = checkpoints(config)
    assert len(found) == n_checkpoints and len({c.key for c in found}) == n_checkpoints
    assert corpus_settings(config["corpus"]) == {  # the keys the corpus rule records (no image or audio key)
        "source": "hf_dataset",
        "name": "Salesforce/wikitext",
        "config": "wikitext-103-raw-v1",
        "split": "validation",
    }
    assert config["extract"]["sample_tokens"] >= 5120  # IsoScore needs >= d_model points (pythia-12b: 5120)


def test_hf_dataset_corpus_asks_for_the_named_split(monkeypatch):
    """The corpus form of the paper configs reaches datasets.load_dataset as name, config, split."""
    import types

    from anisweep.corpus import load_texts

    calls = []

    class Split(dict):
        column_names = ["text"]

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        return Split(text=["", " = Robert Boulter = \n", " Robert Boulter is an English actor . \n", "   "])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    texts = load_texts(
        {"source": "hf_dataset", "name": "Salesforce/wikitext", "config": "wikitext-103-raw-v1", "split": "validation"}
    )
    assert calls == [("Salesforce/wikitext", "wikitext-103-raw-v1", "validation")]
    assert texts == [" = Robert Boulter = \n", " Robert Boulter is an English actor . \n"]  # blank lines dropped


def test_download_progress_reaches_a_log_file(tmp_path):
    """huggingface_hub hides its bars when stderr is not a terminal; the fetch rule's stderr is a log file."""
    from anisweep.checkpoints.fetch import LogProgress

    with open(tmp_path / "fetch.log", "w") as log:
        with LogProgress(total=3 * 10**9, desc="Downloading bytes", unit="B", unit_scale=True, file=log) as bar:
            bar.update(3 * 10**9)
    text = (tmp_path / "fetch.log").read_text()
    assert "Downloading bytes" in text and "3.00G" in text
