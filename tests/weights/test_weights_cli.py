"""`anisweep weights` and `anisweep logit-lens` of one checkpoint, as the rules run them: the built-in circuits' two
tables; for an architecture no layout names (an encoder-decoder here; image and audio models alike) and for what a
checkpoint saved without its head or a tokenizer without a mask token cannot give, the one row that says why and a
job that succeeds, so that the checkpoint's metrics stand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
from transformers import (
    AutoTokenizer,
    BertForPreTraining,
    GPTNeoXForCausalLM,
    PreTrainedTokenizerFast,
    T5ForConditionalGeneration,
)

from anisweep.cli import main
from anisweep.config import checkpoints, complete
from anisweep.corpus import write_texts

from conftest import neox_config, saved, t5_config
from hubcache import save_tiny_bert


def checkpoint_arg(path) -> str:
    return json.dumps({"family": "local", "model": "m", "step": 3, "tokens_seen": 30, "seed": 0, "path": str(path)})


def run(path, tmp_path) -> tuple[int, pl.DataFrame, pl.DataFrame]:
    out, pairs = tmp_path / "weights.parquet", tmp_path / "weight_pairs.parquet"
    code = main(["weights", "--checkpoint", checkpoint_arg(path), "--out", str(out), "--pairs-out", str(pairs)])
    return code, pl.read_parquet(out), pl.read_parquet(pairs)


def test_the_builtin_writes_its_rows_and_pairs(tmp_path):
    code, rows, pairs = run(saved(tmp_path, GPTNeoXForCausalLM, neox_config(), "lm"), tmp_path)
    assert code == 0
    circuits = rows.filter(pl.col("measure") == "circuits")
    assert set(rows["measure"]) == {"circuits", "weight_matrices"} and rows["step"][0] == 3
    assert set(circuits["site"]) == {"weights"}
    assert set(rows.filter(pl.col("measure") == "weight_matrices")["site"]) == {
        "w_q",
        "w_k",
        "w_v",
        "w_o",
        "embed_in",
        "embed_out",
    }
    assert pairs.height == 2 * 4 * 2 * 5 and set(pairs["kind"]) == {"qk", "ov"}  # layers x heads x kinds x ranks


def test_an_architecture_without_a_layout_gets_the_row_that_says_why(tmp_path, capsys):
    code, rows, pairs = run(saved(tmp_path, T5ForConditionalGeneration, t5_config(), "t5"), tmp_path)
    assert code == 0 and pairs.height == 0
    assert rows.select("measure", "metric", "site").rows() == [
        ("circuits", "circuits", "weights"),
        ("weight_matrices", "weight_matrices", "weights"),
    ]
    assert all(math.isnan(v) for v in rows["value"])
    assert all("this checkpoint's model_type is 't5'" in reason for reason in rows["reason"])
    assert "model_type is 't5'" in capsys.readouterr().err


# ------------------------------------------------------------------------- a BERT without its head, or without [MASK]

SENTENCES = [
    "the cat sat on the mat and the dog sat on the log",
    "a model of the world is a map of the territory",
    "attention is all you need said the paper in 2017",
]
EXTRACT = {"n_sequences": 4, "seq_len": 16, "batch_size": 2, "sample_tokens": 64, "device": "cpu"}


def bert_step(tmp_path, *, headless: bool = False, mask_token: bool = True) -> Path:
    """A local run's step1/ of a tiny BERT with its tokenizer: the whole BertForPreTraining, or its BertModel alone
    (saved without its head: no cls.predictions.*, as a sentence-embedding model is); the tokenizer with or
    without a mask token."""
    full = save_tiny_bert(tmp_path / "full", safetensors=True)
    step = tmp_path / "run" / "step1"
    model = BertForPreTraining.from_pretrained(full)
    (model.bert if headless else model).save_pretrained(step)
    tokenizer = AutoTokenizer.from_pretrained(str(full))
    if not mask_token:
        specials = {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]"}
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, **specials)
    tokenizer.save_pretrained(step)
    return step


def extracted(step: Path, tmp_path, capsys) -> tuple[dict, Path, Path]:
    """(the checkpoint, its extract folder, the corpus) after fetch and extract, as the rules run them."""
    texts = tmp_path / "texts.parquet"
    write_texts([" ".join(SENTENCES * 3)] * 20, texts)
    entry = {"family": "local", "name": "run", "path": str(step.parent), "steps": [1]}
    ckpt = checkpoints(complete({"models": [entry], "extract": EXTRACT}))[0].to_dict()
    weights, results = tmp_path / "weights", tmp_path / "results" / "local" / "run" / "step1"
    settings = json.dumps(EXTRACT)
    fetch = ["fetch", "--checkpoint", json.dumps(ckpt), "--out", str(weights), "--texts", str(texts)]
    assert main([*fetch, "--settings", settings]) == 0, capsys.readouterr().err[-2000:]
    manifest = str(weights / "checkpoint.json")
    extract = ["extract", "--manifest", manifest, "--texts", str(texts), "--settings", settings, "--out", str(results)]
    assert main(extract) == 0, capsys.readouterr().err[-2000:]
    return ckpt, results, texts


def logit_lens(ckpt: dict, results: Path, texts: Path) -> tuple[int, pl.DataFrame]:
    out = results / "logit_lens.parquet"
    command = ["logit-lens", "--checkpoint", json.dumps(ckpt), "--extract-dir", str(results), "--texts", str(texts)]
    code = main([*command, "--settings", json.dumps(EXTRACT), "--out", str(out)])
    return code, pl.read_parquet(out)


def test_a_bert_saved_without_its_head_keeps_its_circuits_and_says_why_it_has_no_lens(tmp_path, capsys):
    step = bert_step(tmp_path, headless=True)
    code, rows, pairs = run(step, tmp_path)
    assert code == 0 and pairs.height == 2 * 4 * 2 * 5
    circuits = rows.filter((pl.col("measure") == "circuits") & pl.col("head").is_null())
    value = {r["metric"]: r["value"] for r in circuits.iter_rows(named=True)}
    assert value == {"tied_embeddings": 1.0, "head_saved": 0.0, "probe_tokens": value["probe_tokens"]}
    matrices = rows.filter(pl.col("measure") == "weight_matrices")
    assert "embed_out" not in set(matrices["site"]) and matrices["value"].is_finite().all()  # tied: embed_in alone
    assert rows.filter(pl.col("head").is_not_null())["value"].is_finite().all()
    assert rows["reason"].is_null().all()

    ckpt, results, texts = extracted(step, tmp_path, capsys)
    code, lens = logit_lens(ckpt, results, texts)
    assert code == 0
    assert lens.select("measure", "metric", "site", "layer").rows() == [("logit_lens", "logit_lens", "resid", None)]
    assert math.isnan(lens["value"][0])
    assert lens["reason"][0].startswith("bert: the checkpoint was saved without its MLM head (no cls.predictions.*")
    assert "extract" not in lens["reason"][0]


def test_an_encoder_whose_tokenizer_has_no_mask_token_says_why_it_has_no_lens(tmp_path, capsys):
    step = bert_step(tmp_path, mask_token=False)
    ckpt, results, texts = extracted(step, tmp_path, capsys)
    assert pl.read_parquet(results / "masked_resid.parquet").height == 0  # extract's masked pass had nothing to mask
    code, lens = logit_lens(ckpt, results, texts)
    assert code == 0
    assert lens.select("metric", "value").rows()[0][0] == "logit_lens" and math.isnan(lens["value"][0])
    assert lens["reason"][0].startswith("the tokenizer has no mask token: an encoder's logit lens reads its states")
    assert "rerun extract" not in lens["reason"][0] and "forcerun" not in lens["reason"][0]
    assert "the tokenizer has no mask token" in capsys.readouterr().err
