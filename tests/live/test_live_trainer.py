"""AnisweepCallback inside a real transformers Trainer.train(): it writes the chosen steps, leaves the training
as it would have been without it, and its tables equal extracting the model the Trainer saved at that step."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import torch
from transformers import GPTNeoXForCausalLM, Trainer, TrainingArguments

from anisweep.corpus import load_texts, make_batch
from anisweep.extract import run as extract_run
from anisweep.extract import tables as extract_tables
from anisweep.extract.model import ExtractSettings, load_model
from anisweep.live.callback import AnisweepCallback, live_ident
from anisweep.tables import EXTRACT_TABLES
from anisweep.tangent.settings import GradientSettings
from anisweep.toy.tokenizers import build_neox_tokenizer

from conftest import assert_tables_equal, neox_config

pytest.importorskip("accelerate")  # the Trainer needs it (the `test` extra)

MAX_STEPS, CHOSEN = 4, [2, 3]
SETTINGS = ExtractSettings(n_sequences=4, seq_len=16, batch_size=2, sample_tokens=64, device="cpu")
GRADIENTS = GradientSettings(enabled=True, rank=4, n_random=5, sample_tokens=64, max_iter=30)


def _train(out: Path, tokenizer, windows, callbacks) -> GPTNeoXForCausalLM:
    torch.manual_seed(0)
    config = neox_config(hidden_dropout=0.1, attention_dropout=0.1)  # dropout: the training draws from the RNG
    config.vocab_size = len(tokenizer)
    model = GPTNeoXForCausalLM(config)
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=MAX_STEPS,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        seed=0,
        data_seed=0,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
        save_strategy="steps",
        save_steps=CHOSEN[0],
        logging_strategy="no",
        dataloader_num_workers=0,
    )
    dataset = [{"input_ids": ids, "labels": ids} for ids in windows]
    Trainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks).train()
    return model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    base = tmp_path_factory.mktemp("trainer")
    texts = load_texts({"source": "builtin"})[:300]
    tokenizer = build_neox_tokenizer(texts, 200)
    windows = list(make_batch(tokenizer, texts, 16, 16, seed=7)["input_ids"])
    callback = AnisweepCallback(CHOSEN, texts, tokenizer, "run", base / "results", SETTINGS, GRADIENTS)
    with_callback = _train(base / "with", tokenizer, windows, [callback])
    without = _train(base / "without", tokenizer, windows, [])
    return base, callback, with_callback, without


def test_the_callback_writes_the_chosen_steps(trained):
    base, callback, _, _ = trained
    run = base / "results" / "local" / "run"
    assert callback.written == [run / f"step{step}" for step in CHOSEN]
    assert sorted(p.name for p in run.iterdir()) == [f"step{step}" for step in CHOSEN]
    for step in CHOSEN:
        for name in [*EXTRACT_TABLES, "gradients"]:
            table = pl.read_parquet(run / f"step{step}" / f"{name}.parquet")
            if table.height:
                assert table["step"].unique().to_list() == [step], name


def test_the_training_is_the_same_without_the_callback(trained):
    _, _, with_callback, without = trained
    a, b = with_callback.state_dict(), without.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    torch.manual_seed(0)
    untrained = GPTNeoXForCausalLM(with_callback.config)
    assert not torch.equal(untrained.state_dict()["lm_head.weight"], a["lm_head.weight"])  # it did train


def test_the_tables_equal_extracting_the_model_the_trainer_saved(trained):
    base, callback, _, _ = trained
    step = CHOSEN[0]
    saved = base / "with" / f"checkpoint-{step}"
    loaded = load_model(saved, device="cpu")
    recorder = extract_run.run(loaded, callback.batch, SETTINGS, progress=False)
    expected = extract_tables.tables(recorder, loaded, live_ident("run", step, seed=0))
    live = base / "results" / "local" / "run" / f"step{step}"
    for name, df in expected.items():
        assert_tables_equal(pl.read_parquet(live / f"{name}.parquet"), df, name)
