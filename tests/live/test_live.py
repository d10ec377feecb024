"""The analysis of a model while it trains (anisweep.live) equals extracting its saved checkpoint, and leaves
the training untouched."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import torch
from transformers import GPTNeoXForCausalLM

from anisweep.checkpoints.preflight import PreflightError
from anisweep.corpus import load_texts, make_batch
from anisweep.extract import tables as extract_tables
from anisweep.extract.model import ExtractSettings, load_model
from anisweep.extract.run import run
from anisweep.live.callback import AnisweepCallback, analyse_live, live_ident
from anisweep.tangent.backward import load_lm
from anisweep.tangent.checkpoint import pass_tables_of
from anisweep.tangent.settings import GradientSettings
from anisweep.toy.tokenizers import build_neox_tokenizer

from conftest import assert_tables_equal, neox_config


def _config(vocab_size: int):
    config = neox_config()
    config.vocab_size = vocab_size
    return config


def _assert_tables_equal(a: pl.DataFrame, b: pl.DataFrame, name: str) -> None:
    assert a.columns == b.columns, name
    assert a.height == b.height, name
    for column in a.columns:
        x, y = a[column], b[column]
        if isinstance(x.dtype, pl.List) and x.null_count() == 0:  # lists of any lengths: the lengths, then values
            assert x.list.len().to_list() == y.list.len().to_list(), f"{name}.{column}"
            x, y = x.explode(), y.explode()
        if x.dtype in (pl.Float32, pl.Float64) and x.null_count() == 0:
            xs, ys = x.to_numpy().astype(np.float64), y.to_numpy().astype(np.float64)
            np.testing.assert_allclose(xs, ys, rtol=1e-5, atol=1e-7, err_msg=f"{name}.{column}")
            continue
        assert x.to_list() == y.to_list(), f"{name}.{column}"


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
def test_live_analysis_equals_the_saved_checkpoint_and_leaves_training_alone(tmp_path):
    texts = load_texts({"source": "builtin"})[:300]
    tokenizer = build_neox_tokenizer(texts, 200)
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(_config(len(tokenizer)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    settings = ExtractSettings(
        n_sequences=4, seq_len=16, batch_size=2, sample_tokens=64, device="cpu", sample_precision="float32"
    )
    grads = GradientSettings(enabled=True, rank=4, n_random=5, sample_tokens=64)
    callback = AnisweepCallback([2], texts, tokenizer, "run", tmp_path / "results", settings, grads)
    ids = callback.batch["input_ids"]
    for step in (1, 2, 3):
        model.train()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        if step == 2:
            rng, weights = torch.get_rng_state(), {k: v.clone() for k, v in model.state_dict().items()}
            kept_grads = [p.grad.clone() for p in model.parameters()]
            state = dict(optimizer.state_dict()["state"][0])
            callback.on_step_end(SimpleNamespace(seed=0), SimpleNamespace(global_step=2), None, model=model)
            assert torch.equal(torch.get_rng_state(), rng)
            assert model.training and model.config._attn_implementation != "anisweep"
            assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())
            assert all(torch.equal(a, p.grad) for a, p in zip(kept_grads, model.parameters(), strict=True))
            assert all(torch.equal(v, optimizer.state_dict()["state"][0][k]) for k, v in state.items())
            model.save_pretrained(tmp_path / "step2")
            tokenizer.save_pretrained(tmp_path / "step2")
        optimizer.zero_grad()
    out = tmp_path / "results" / "local" / "run" / "step2"
    assert callback.written == [out]

    loaded = load_model(tmp_path / "step2", device="cpu")
    recorder = run(loaded, callback.batch, settings, progress=False)
    expected = extract_tables.tables(recorder, loaded, live_ident("run", 2, seed=0))
    for name, df in expected.items():
        _assert_tables_equal(pl.read_parquet(out / f"{name}.parquet"), df, name)
    lm, adapter = load_lm(tmp_path / "step2")
    ident = live_ident("run", 2, seed=0)
    passed = pass_tables_of(lm, adapter, callback.batch, tokenizer, grads, settings.batch_size, ident, progress=False)
    for name, df in passed.items():
        live = pl.read_parquet(out / f"{name}.parquet")
        assert live.height == df.height > 0
        assert_tables_equal(live, df, name, rtol=1e-4)


def test_analyse_live_without_gradients_writes_extract_tables_only(tmp_path):
    texts = load_texts({"source": "builtin"})[:200]
    tokenizer = build_neox_tokenizer(texts, 200)
    model = GPTNeoXForCausalLM(_config(len(tokenizer)))
    batch = make_batch(tokenizer, texts, 2, 16, 0)
    settings = ExtractSettings(n_sequences=2, seq_len=16, batch_size=2, sample_tokens=32, device="cpu")
    out = analyse_live(model, batch, tokenizer, tmp_path, live_ident("r", 0), settings, GradientSettings())
    assert (out / "qk.parquet").exists() and not (out / "gradient_sums.parquet").exists()
    assert model(input_ids=batch["input_ids"]).logits.isfinite().all()


def test_analyse_live_checks_the_model_against_the_batch_and_settings_first(tmp_path):
    texts = load_texts({"source": "builtin"})[:200]
    tokenizer = build_neox_tokenizer(texts, 200)
    model = GPTNeoXForCausalLM(_config(len(tokenizer)))  # rotary, 32 positions, d_model 32
    settings = ExtractSettings(batch_size=2, sample_tokens=32, device="cpu")  # seq_len 128: the batch's rules
    long = make_batch(tokenizer, texts, 2, 48, 0)
    with pytest.raises(PreflightError, match=r"r/step0 analysed live.*seq_len = 48 is longer than the 32 positions"):
        analyse_live(model, long, tokenizer, tmp_path / "long", live_ident("r", 0), settings, GradientSettings())
    few = ExtractSettings(batch_size=2, sample_tokens=16, device="cpu")
    batch = make_batch(tokenizer, texts, 2, 16, 0)
    with pytest.raises(PreflightError, match=r"extract.sample_tokens = 16 .* d_model = 32"):
        analyse_live(model, batch, tokenizer, tmp_path / "few", live_ident("r", 0), few, GradientSettings())
    assert not (tmp_path / "long").exists() and not (tmp_path / "few").exists()
    out = analyse_live(model, batch, tokenizer, tmp_path / "ok", live_ident("r", 0), settings, GradientSettings())
    written = json.loads((out / "extract.json").read_text())["settings"]
    assert (written["n_sequences"], written["seq_len"]) == (2, 16)  # what ran, not the settings' defaults
