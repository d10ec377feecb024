"""A corpus the tokenizer cannot read stops the run before any weights move, naming the share of unknown tokens, the
token, the tokenizer, a sample of the text and the key that lets it through; extract.json records the share."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest

from anisweep.checkpoints.preflight import PreflightError, evaluation_batch
from anisweep.corpus import builtin_text, make_batch, unknown_token_share
from anisweep.extract.model import ExtractSettings
from anisweep.toy.tokenizers import build_bert_tokenizer, build_neox_tokenizer

CHINESE = ["机器学习是人工智能的一个分支。它研究计算机如何从数据中学习，并改进自己的表现。"] * 40
ENGLISH = builtin_text()[:200]
SETTINGS = ExtractSettings(n_sequences=4, seq_len=32, sample_tokens=64, device="cpu")


@functools.cache
def toy_tokenizer(arch: str):
    build = build_bert_tokenizer if arch == "bert" else build_neox_tokenizer
    return build(builtin_text(), 512)


def checkpoint_folder(tmp_path: Path, arch: str) -> Path:
    """config.json and the toy's tokenizer: all that the checks before the weights read."""
    folder = tmp_path / arch
    toy_tokenizer(arch).save_pretrained(folder)
    config = {"model_type": arch, "vocab_size": 512, "hidden_size": 32, "num_attention_heads": 4}
    config["max_position_embeddings"] = 64
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_chinese_through_the_toy_bert_tokenizer_stops_naming_the_share_and_the_key(tmp_path):
    folder = checkpoint_folder(tmp_path, "bert")
    with pytest.raises(PreflightError) as error:
        evaluation_batch(folder, folder, SETTINGS, CHINESE, "toy/toy-bert/step64")
    message = str(error.value)
    assert re.match(r"toy/toy-bert/step64: 9\d\.\d% of the evaluation batch's 128 tokens are the unknown", message)
    assert "'[UNK]' (id 1)" in message and f"the tokenizer {folder}" in message
    assert "机器学习" in message  # a sample of the text it cannot read
    assert "raise extract.max_unknown_token_share (now 0.01)" in message


def test_the_config_may_let_an_unreadable_corpus_through_and_extract_json_records_its_share(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    from anisweep.extract.run import extract_checkpoint

    from conftest import TINY_DIMS, saved

    config = BertConfig(**{**TINY_DIMS, "vocab_size": 512, "max_position_embeddings": 64})
    folder = saved(tmp_path, BertForMaskedLM, config, "bert")
    toy_tokenizer("bert").save_pretrained(folder)
    lenient = ExtractSettings(**{**SETTINGS.__dict__, "max_unknown_token_share": 1.0})
    batch = evaluation_batch(folder, folder, lenient, CHINESE, "toy/toy-bert/step64")
    ids, tokenizer = batch["input_ids"], toy_tokenizer("bert")
    text = (ids != tokenizer.cls_token_id) & (ids != tokenizer.sep_token_id)  # [SEP] also separates documents
    assert unknown_token_share(batch) == pytest.approx(float(text.float().mean()))
    ident = {"family": "toy", "model": "toy-bert", "step": 64, "seed": 0, "tokens_seen": 0}
    manifest = {**ident, "path": str(folder), "tokenizer_path": str(folder)}
    extract_checkpoint(manifest, CHINESE, lenient, tmp_path / "out", progress=False)
    info = json.loads((tmp_path / "out" / "extract.json").read_text())
    assert info["unknown_token_share"] == pytest.approx(unknown_token_share(batch))
    assert info["unknown_token_share"] > 0.9


def test_english_through_the_toy_bert_tokenizer_has_no_unknown_token(tmp_path):
    folder = checkpoint_folder(tmp_path, "bert")
    assert unknown_token_share(evaluation_batch(folder, folder, SETTINGS, ENGLISH, "toy/toy-bert/step64")) == 0


def test_a_byte_level_tokenizer_reads_any_text_though_its_unknown_token_separates_documents(tmp_path):
    """The toy GPT-NeoX's `<|endoftext|>` is its unknown token and the separator between documents: separators
    are not unknown tokens, and byte-level BPE reads Chinese."""
    tokenizer = toy_tokenizer("gpt_neox")
    assert tokenizer.unk_token_id == tokenizer.eos_token_id
    batch = make_batch(tokenizer, ["short text"] * 200, 4, 32, seed=0)
    assert (batch["input_ids"] == tokenizer.unk_token_id).any()  # separators in the windows
    assert unknown_token_share(batch) == 0
    folder = checkpoint_folder(tmp_path, "gpt_neox")
    assert unknown_token_share(evaluation_batch(folder, folder, SETTINGS, CHINESE, "toy/toy-neox/step8")) == 0


def test_a_live_trainer_callback_stops_before_training_on_a_corpus_its_tokenizer_cannot_read():
    from anisweep.live.callback import AnisweepCallback

    with pytest.raises(PreflightError, match=r"local/run: 9\d\.\d% of .* unknown token '\[UNK\]'"):
        AnisweepCallback([0], CHINESE, toy_tokenizer("bert"), "run", settings=SETTINGS)
