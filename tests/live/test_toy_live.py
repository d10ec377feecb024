"""A live toy (analysed while it trains, no checkpoint saved) writes what extracting its saved checkpoints writes,
trained the same way; in the workflow, metrics, sweep and figures run on it unchanged."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import polars as pl
import pytest
import torch
import yaml
from transformers import GPTNeoXForCausalLM

from anisweep.corpus import builtin_text, load_texts
from anisweep.extract.model import ExtractSettings
from anisweep.extract.run import extract_checkpoint
from anisweep.live.take import take
from anisweep.live.toy import LiveAnalysis
from anisweep.tables import EXTRACT_TABLES, IDENTITY
from anisweep.tangent.backward import load_lm
from anisweep.tangent.checkpoint import pass_tables_for
from anisweep.tangent.pass_tables import PASS_TABLES
from anisweep.tangent.settings import GradientSettings
from anisweep.toy.tokenizers import build_neox_tokenizer
from anisweep.toy.train import ToySpec, train_toy

from conftest import assert_tables_equal, neox_config, snakemake_command

pytestmark = pytest.mark.usefixtures("shared_worker")  # the Snakemake runs share one warm worker

ROOT = Path(__file__).resolve().parents[2]
STEPS = [0, 3, 6]
TINY = ToySpec(d_model=32, n_layers=2, n_heads=4, d_ff=64, seq_len=32, batch_size=8, lr=5e-3, vocab_size=400, warmup=2)
SETTINGS = ExtractSettings(n_sequences=6, seq_len=24, batch_size=4, sample_tokens=64, device="cpu", seed=0)
GRADIENTS = GradientSettings(enabled=True, steps=[0, 6], rank=4, n_random=5, sample_tokens=64)


@pytest.fixture(scope="module", params=["bert", "gpt_neox"])
def both(request, tmp_path_factory):
    """The same toy trained twice: saved checkpoints, and live (with the live model's weights at each step)."""
    arch, base = request.param, tmp_path_factory.mktemp(request.param)
    train_texts, eval_texts = builtin_text()[:400], load_texts({"source": "builtin"})[:300]
    saved = train_toy(arch, base / "saved", STEPS, 1, TINY, texts=train_texts, num_threads=1, progress=False)
    analysis = LiveAnalysis("toy-x", 1, TINY.tokens_per_step, eval_texts, SETTINGS, GRADIENTS, base / "live")
    weights = {}

    def analyse(step, model, tokenizer):
        weights[step] = {k: v.clone() for k, v in model.state_dict().items()}
        analysis(step, model, tokenizer)

    kw = {"texts": train_texts, "num_threads": 1, "progress": False}
    train_toy(arch, base / "live", STEPS, 1, dataclasses.replace(TINY, live=True), analyse=analyse, **kw)
    return arch, saved, base / "live", weights, eval_texts


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_live_toy_saves_no_checkpoint_and_trains_as_the_saved_one(both):
    _, saved, live, weights, _ = both
    assert sorted(p.name for p in live.iterdir()) == sorted(
        [f"step{s}" for s in STEPS] + ["token_counts.parquet", "train_log.json"]
    )
    assert not list(live.rglob("*.safetensors")) and not list(live.rglob("config.json"))
    for step in STEPS:  # training is deterministic on the CPU, and the analysis leaves it alone
        stored = load_lm(saved / f"step{step}")[0].state_dict()
        assert stored.keys() == weights[step].keys()
        for name, tensor in stored.items():
            assert torch.equal(weights[step][name], tensor), (step, name)
    assert len(weights) == len(STEPS)


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_live_toy_tables_equal_extracting_its_saved_checkpoints(both, tmp_path):
    _, saved, live, _, texts = both
    for step in STEPS:
        manifest = {
            "family": "toy",
            "model": "toy-x",
            "seed": 1,
            "step": step,
            "tokens_seen": step * TINY.tokens_per_step,
            "path": str(saved / f"step{step}"),
            "tokenizer_path": str(saved / f"step{step}"),
        }
        out = tmp_path / f"step{step}"
        more = pass_tables_for(manifest, GRADIENTS, SETTINGS.batch_size, progress=False)
        extract_checkpoint(manifest, texts, dataclasses.replace(SETTINGS, threads=2), out, False, more_tables=more)
        for name in EXTRACT_TABLES:
            expected = pl.read_parquet(out / f"{name}.parquet")
            got = pl.read_parquet(live / f"step{step}" / f"{name}.parquet")
            assert got.select(IDENTITY).unique().rows() == (
                [("toy", "toy-x", 1, step, step * TINY.tokens_per_step)] if expected.height else []
            )
            assert_tables_equal(got, expected, f"step{step}/{name}")
        has_gradients = (live / f"step{step}" / "gradient_sums.parquet").exists()
        assert has_gradients == (step in GRADIENTS.steps)
        for name in PASS_TABLES if has_gradients else ():
            got, expected = (pl.read_parquet(folder / f"{name}.parquet") for folder in (live / f"step{step}", out))
            assert got.height == expected.height > 0
            assert_tables_equal(got, expected, f"step{step}/{name}", rtol=1e-4)


def test_take_copies_a_step_and_names_what_is_missing(both, tmp_path):
    _, _, live, _, _ = both
    take(live, 3, ["qk.parquet", "extract.json"], tmp_path / "out")
    assert (tmp_path / "out" / "qk.parquet").read_bytes() == (live / "step3" / "qk.parquet").read_bytes()
    with pytest.raises(FileNotFoundError, match="gradient_sums.parquet.*delete"):
        take(live, 3, ["gradient_sums.parquet"], tmp_path / "out")


def test_a_live_toy_needs_its_analysis(tmp_path):
    with pytest.raises(ValueError, match="analyse"):
        train_toy("bert", tmp_path, [0], 0, TINY, live=True, texts=builtin_text()[:200], progress=False)


MODELS = ("live-neox", "toy-neox")


@pytest.mark.slow  # two toys through the whole DAG
def test_workflow_with_a_live_toy_runs_to_figures_and_equals_the_saved_toy(tmp_path):
    tiny = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text())
    neox = tiny["toy"]["toy-neox"]
    tiny["toy"] = {"toy-neox": neox, "live-neox": {**neox, "live": True}}
    tiny["models"] = [{"family": "toy", "name": name, "steps": "all"} for name in tiny["toy"]]
    tiny["weights"] = {"enabled": False}  # a live model saves no weights to read: the saved toy's would be extra rows
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tiny))
    # what the assertions read, not every figure of the DAG (tests/workflow/test_workflow.py draws those)
    targets = [f"results/toy/{m}/{table}.parquet" for m in MODELS for table in ("sweep", "gradients_sweep")]
    targets.append("results/toy/live-neox/figures/isotropy.png")
    command = snakemake_command(tmp_path, "--configfile", str(tmp_path / "config.yaml"), "--cores", "2", *targets)
    run = subprocess.run(command, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "rule train_toy_live" in run.stderr and "rule extract_live" in run.stderr
    results = tmp_path / "results" / "toy"
    for path in ("sweep.parquet", "gradients_sweep.parquet", "figures/isotropy.png"):
        assert (results / "live-neox" / path).is_file(), path
    assert not (tmp_path / "resources" / "toy" / "live-neox").exists()
    assert not (tmp_path / "weights").exists() or not list((tmp_path / "weights").rglob("live-neox"))
    for step in neox["steps"]:
        for name in [*EXTRACT_TABLES, "metrics"]:
            live = pl.read_parquet(results / "live-neox" / f"step{step}" / f"{name}.parquet")
            saved = pl.read_parquet(results / "toy-neox" / f"step{step}" / f"{name}.parquet")
            assert set(live["model"].unique()) == ({"live-neox"} if saved.height else set())  # masked_resid: none
            assert_tables_equal(live.drop("model"), saved.drop("model"), f"step{step}/{name}")
    sweeps = [pl.read_parquet(results / m / "sweep.parquet").drop("model") for m in MODELS]
    assert_tables_equal(sweeps[0].drop("weights_sha256"), sweeps[1].drop("weights_sha256"), "sweep", rtol=1e-4)
    # the gradient analysis from the tables written while it trained, fixed subspaces and embedding change too
    assert set(sweeps[0].filter(pl.col("metric").str.starts_with("grad_"))["fit"].unique()) == {"checkpoint", "fixed"}
    gradients = [
        pl.read_parquet(results / m / "gradients_sweep.parquet").drop("model") for m in ("live-neox", "toy-neox")
    ]
    assert gradients[0]["measure"].str.starts_with("embedding_change").any()
    assert_tables_equal(gradients[0], gradients[1], "gradients_sweep", rtol=1e-4)


def test_a_half_precision_analysis_runs_a_cast_copy(tmp_path):
    texts = load_texts({"source": "builtin"})[:200]
    tokenizer = build_neox_tokenizer(texts, 200)
    config = neox_config()
    config.vocab_size = len(tokenizer)
    model = GPTNeoXForCausalLM(config)
    settings = dataclasses.replace(SETTINGS, dtype="bfloat16")
    LiveAnalysis("m", 0, 10, texts, settings, GradientSettings(), tmp_path)(2, model, tokenizer)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    qk = pl.read_parquet(tmp_path / "step2" / "qk.parquet")
    assert qk.height and qk["tokens_seen"].unique().to_list() == [20]


@pytest.mark.parametrize(
    "change, named",
    [
        (
            {"gradients": {"enabled": False}, "untrained": {"enabled": True, "inits": ["bert", {"model": "toy-neox"}]}},
            "untrained.inits",
        ),
    ],
)
def test_what_needs_saved_weights_is_refused_for_a_live_toy(change, named):
    from anisweep import config as anisweep_config
    from anisweep.errors import ConfigError

    tiny = yaml.safe_load((ROOT / "tests" / "configs" / "tiny.yaml").read_text())
    tiny["toy"]["toy-neox"]["live"] = True
    with pytest.raises(ConfigError, match=named) as error:
        anisweep_config.checkpoints(anisweep_config.complete({**tiny, **change}))
    assert "live: false" in str(error.value)
