"""AnisweepCallback inside a real transformers Trainer.train(): it writes the chosen steps (step 0 before any
optimizer step), leaves the training as it would have been without it, and its tables equal extracting the model
the Trainer saved at that step. Steps never reached, or passed before a resumed training, are warned about; a
model the settings do not fit stops the training before its first step."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import polars as pl
import pytest
import torch
from transformers import BertForMaskedLM, GPTNeoXForCausalLM, Trainer, TrainingArguments

from anisweep.checkpoints.preflight import PreflightError
from anisweep.corpus import load_texts, make_batch
from anisweep.extract import run as extract_run
from anisweep.extract import tables as extract_tables
from anisweep.extract.model import ExtractSettings, load_model
from anisweep.live.callback import AnisweepCallback, live_ident
from anisweep.tables import EXTRACT_TABLES
from anisweep.tangent.settings import GradientSettings
from anisweep.toy.tokenizers import build_neox_tokenizer

from conftest import assert_tables_equal, bert_config, neox_config

pytest.importorskip("accelerate")  # the Trainer needs it (the `test` extra)

MAX_STEPS, CHOSEN, SAVED = 4, [0, 2, 3, 9], 2  # step 9: never reached
WRITTEN = [0, 2, 3]
SETTINGS = ExtractSettings(
    n_sequences=4, seq_len=16, batch_size=2, sample_tokens=64, device="cpu", sample_precision="float32"
)
GRADIENTS = GradientSettings(enabled=True, rank=4, n_random=5, sample_tokens=64, max_iter=30)


def _untrained(tokenizer) -> GPTNeoXForCausalLM:
    torch.manual_seed(0)
    config = neox_config(hidden_dropout=0.1, attention_dropout=0.1)  # dropout: the training draws from the RNG
    config.vocab_size = len(tokenizer)
    return GPTNeoXForCausalLM(config)


def _train(out: Path, tokenizer, windows, callbacks, model=None, resume: Path | None = None):
    model = model if model is not None else _untrained(tokenizer)
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
        save_steps=SAVED,
        logging_strategy="no",
        dataloader_num_workers=0,
    )
    dataset = [{"input_ids": ids, "labels": ids} for ids in windows]
    trainer = Trainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=None if resume is None else str(resume))
    return model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    base = tmp_path_factory.mktemp("trainer")
    texts = load_texts({"source": "builtin"})[:300]
    tokenizer = build_neox_tokenizer(texts, 200)
    windows = list(make_batch(tokenizer, texts, 16, 16, seed=7)["input_ids"])
    callback = AnisweepCallback(CHOSEN, texts, tokenizer, "run", base / "results", SETTINGS, GRADIENTS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with_callback = _train(base / "with", tokenizer, windows, [callback])
    callback.caught = [str(w.message) for w in caught if "AnisweepCallback" in str(w.message)]
    without = _train(base / "without", tokenizer, windows, [])
    return base, callback, with_callback, without


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_the_callback_writes_the_chosen_steps(trained):
    base, callback, _, _ = trained
    run = base / "results" / "local" / "run"
    assert callback.written == [run / f"step{step}" for step in WRITTEN]
    assert sorted(p.name for p in run.iterdir()) == [f"step{step}" for step in WRITTEN]
    for step in WRITTEN:
        for name in [*EXTRACT_TABLES, "gradient_sums", "gradient_sample"]:
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
    step = SAVED
    saved = base / "with" / f"checkpoint-{step}"
    loaded = load_model(saved, device="cpu")
    recorder = extract_run.run(loaded, callback.batch, SETTINGS, progress=False)
    expected = extract_tables.tables(recorder, loaded, live_ident("run", step, seed=0))
    live = base / "results" / "local" / "run" / f"step{step}"
    for name, df in expected.items():
        assert_tables_equal(pl.read_parquet(live / f"{name}.parquet"), df, name)


def test_step_0_is_the_untrained_model_and_an_unreached_step_is_warned_about(trained, tmp_path):
    base, callback, _, _ = trained
    untrained = _untrained(callback.tokenizer)
    untrained.save_pretrained(tmp_path / "untrained")
    callback.tokenizer.save_pretrained(tmp_path / "untrained")
    loaded = load_model(tmp_path / "untrained", device="cpu")
    recorder = extract_run.run(loaded, callback.batch, SETTINGS, progress=False)
    expected = extract_tables.tables(recorder, loaded, live_ident("run", 0, seed=0))
    for name, df in expected.items():
        assert_tables_equal(pl.read_parquet(base / "results" / "local" / "run" / "step0" / f"{name}.parquet"), df, name)
    assert len(callback.caught) == 1
    assert "ended at step 4" in callback.caught[0] and "[9]" in callback.caught[0]


def test_a_resumed_training_skips_the_steps_it_has_passed_and_says_so(trained, tmp_path):
    base, callback, _, _ = trained
    shutil.copytree(base / "results", tmp_path / "results")
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "results").rglob("step*/*")}
    texts = load_texts({"source": "builtin"})[:300]
    windows = list(make_batch(callback.tokenizer, texts, 16, 16, seed=7)["input_ids"])
    again = AnisweepCallback([0, 2, 3], texts, callback.tokenizer, "run", tmp_path / "results", SETTINGS, GRADIENTS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(tmp_path / "out", callback.tokenizer, windows, [again], resume=base / "with" / f"checkpoint-{SAVED}")
    messages = [str(w.message) for w in caught if "AnisweepCallback" in str(w.message)]
    assert len(messages) == 1 and "resumes at step 2" in messages[0] and "[0]" in messages[0]
    run = tmp_path / "results" / "local" / "run"
    assert again.written == [run / "step3"]  # step 2: the run that saved the checkpoint analysed it
    changed = {p for p, t in before.items() if p.stat().st_mtime_ns != t}
    assert changed and all(p.parent.name == "step3" for p in changed)


@pytest.mark.parametrize("arch", ["bert", "gpt_neox"])  # BERT crashes past its positions, rotary would not
def test_a_model_the_settings_do_not_fit_stops_before_the_first_step(tmp_path, arch):
    texts = load_texts({"source": "builtin"})[:300]
    tokenizer = build_neox_tokenizer(texts, 200)
    windows = list(make_batch(tokenizer, texts, 4, 16, seed=7)["input_ids"])
    config = bert_config() if arch == "bert" else neox_config()  # 32 positions
    config.vocab_size = len(tokenizer)
    model = (BertForMaskedLM if arch == "bert" else GPTNeoXForCausalLM)(config)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    settings = ExtractSettings(n_sequences=2, seq_len=64, sample_tokens=64, device="cpu")
    callback = AnisweepCallback([0, 2], texts, tokenizer, "run", tmp_path / "results", settings, GRADIENTS)
    with pytest.raises(PreflightError, match=r"local/run.*seq_len = 64 is longer than the 32 positions.*at most 32"):
        _train(tmp_path / "out", tokenizer, windows, [callback], model=model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())  # no optimizer step
    assert not (tmp_path / "results").exists()
