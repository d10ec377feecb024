"""config/godey2024_survey.yaml (Godey et al. 2024, Sections 3.1 and 3.3) through the whole workflow, offline: a tiny
random model of each architecture under each real repository id in a Hugging Face cache (tests/hubcache.py), the
config's models as written, a small evaluation text instead of WikiText-103 (a dataset download)."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import polars as pl
import pytest
import transformers
import yaml

from anisweep import config as anisweep_config
from anisweep.plots.survey import FIGURES

from conftest import canine_config, snakemake_command, t5_config
from hubcache import build_hub_cache, offline_env, save_tiny_bert, save_tiny_decoder, tiny_neox_tokenizer

pytestmark = pytest.mark.slow  # the whole workflow over seven models

ROOT = Path(__file__).resolve().parents[2]
SURVEY = yaml.safe_load((ROOT / "config" / "godey2024_survey.yaml").read_text())
SENTENCES = [  # the tiny BPE and WordPiece tokenizers were built from these: real tokens, no unknown ones
    "the cat sat on the mat and the dog sat on the log",
    "a model of the world is a map of the territory",
    "attention is all you need said the paper in 2017",
]


def with_bpe(folder: Path, model_of) -> Path:
    """`model_of(tokenizer)`'s model saved with the byte-level BPE of tests/hubcache.py, given a pad and an eos."""
    tok = tiny_neox_tokenizer()
    tok.add_special_tokens({"pad_token": "<pad>", "eos_token": "</s>", "mask_token": "<mask>"})
    model_of(tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def tiny_model(folder: Path, repo: str) -> Path:
    """A tiny random model of the architecture `repo` has, with a tokenizer of the same kind."""
    if repo == "google-bert/bert-base-uncased":
        return save_tiny_bert(folder, safetensors=True)
    if repo == "openai-community/gpt2":
        return save_tiny_decoder(folder, "gpt2")
    if repo == "FacebookAI/roberta-base":
        return with_bpe(
            folder,
            lambda tok: transformers.RobertaForMaskedLM(
                transformers.RobertaConfig(
                    vocab_size=len(tok),
                    hidden_size=32,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    intermediate_size=64,
                    pad_token_id=tok.pad_token_id,
                    max_position_embeddings=tok.pad_token_id + 40,  # positions start after the padding id
                )
            ),
        )
    if repo == "google-t5/t5-base":
        return with_bpe(
            folder,
            lambda tok: transformers.T5ForConditionalGeneration(
                t5_config(
                    vocab_size=len(tok),
                    pad_token_id=tok.pad_token_id,
                    eos_token_id=tok.eos_token_id,
                    decoder_start_token_id=tok.pad_token_id,
                )
            ),
        )
    if repo == "google/byt5-base":
        transformers.T5ForConditionalGeneration(
            t5_config(vocab_size=384, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
        ).save_pretrained(folder)
        transformers.ByT5Tokenizer().save_pretrained(folder)
        return folder
    if repo in ("google/canine-s", "google/canine-c"):
        transformers.CanineModel(canine_config()).save_pretrained(folder)
        transformers.CanineTokenizer().save_pretrained(folder)
        return folder
    raise AssertionError(f"no tiny model for {repo}")


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    root = tmp_path_factory.mktemp("survey")
    hf_home = root / "hf"
    for entry in SURVEY["models"]:
        folder = tiny_model(root / "models" / entry["name"], entry["repo"])
        build_hub_cache(hf_home, entry["repo"], {"main": folder})
    rng = random.Random(0)
    corpus = root / "eval.txt"
    corpus.write_text("\n\n".join(" ".join(rng.choices(SENTENCES, k=3)) for _ in range(200)) + "\n")
    config = {
        **SURVEY,
        "corpus": {"source": "text", "paths": [str(corpus)]},
        "extract": {"n_sequences": 8, "seq_len": 32, "batch_size": 4, "sample_tokens": 256, "device": "cpu"},
        "resources": {"extract_threads": 1},
    }
    configfile = root / "survey.yaml"
    configfile.write_text(yaml.safe_dump(config, sort_keys=False))
    env = offline_env(hf_home)
    workdir = root / "work"
    # what the tests read: each model's sweep and the survey figures, not the per-model figures
    targets = [f"results/hub/{entry['name']}/sweep.parquet" for entry in SURVEY["models"]]
    targets += [f"results/figures/{name}" for name in FIGURES]
    command = snakemake_command(workdir, "--configfile", str(configfile), "--cores", "2", *targets)
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stderr[-6000:]
    return workdir


def test_the_survey_config_dry_runs_offline_on_the_real_repository_ids(survey, tmp_path):
    """The config file as it is (its WikiText-103 corpus is read only when the corpus job runs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HOME=str(survey.parent / "hf"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    configfile = ROOT / "config" / "godey2024_survey.yaml"
    command = snakemake_command(tmp_path, "--configfile", str(configfile), "--cores", "2", "-n")
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "plot_survey" in done.stdout and "extract" in done.stdout


def test_every_model_of_the_survey_is_measured_layer_by_layer(survey):
    for entry in SURVEY["models"]:
        sweep = pl.read_parquet(survey / "results" / "hub" / entry["name"] / "sweep.parquet")
        not_ok = sweep.filter(pl.col("status") != "ok")
        # T5's RMSNorm has no bias: NaN, not ok; the weight measures and the logit lens of an architecture no weight
        # layout names (RoBERTa, T5, CANINE): their one row each, with the reason
        unmeasurable = ["circuits", "weight_matrices", "logit_lens"]
        assert set(not_ok["metric"]) <= {"bias_norm", *unmeasurable}, entry["name"]
        said = not_ok.filter(pl.col("metric").is_in(unmeasurable))
        assert said["reason"].str.starts_with("weight measures read the tensors of").all(), entry["name"]
        resid = sweep.filter((pl.col("site") == "resid") & (pl.col("metric") == "avg_cos_pairs"))
        config = transformers.AutoConfig.from_pretrained(survey.parent / "models" / entry["name"])
        blocks = (config.num_layers + config.num_decoder_layers) if config.model_type == "t5" else None
        if blocks is not None:  # encoder and decoder numbered straight through
            assert resid["layer"].max() == blocks, entry["name"]
        assert resid["value"].is_finite().all() and resid.height >= 3, entry["name"]
        for metric in ("isotropic_cos_q95", "avg_cos_isotropic_sf", "drift_avg_cos_spearman_p"):
            assert sweep.filter(pl.col("metric") == metric)["value"].is_finite().all(), (entry["name"], metric)


def test_the_survey_figures_are_drawn(survey):
    for name in FIGURES:
        assert (survey / "results" / "figures" / name).stat().st_size > 20_000, name
    groups = {f"hub/{entry['name']}": entry["group"] for entry in SURVEY["models"]}
    assert set(groups.values()) == {"token-level", "character-level"}
    assert anisweep_config.groups(SURVEY) == groups
