"""AnisweepCallback's scalar summaries reach the Trainer's loggers: a tiny Trainer with report_to=["tensorboard"]
writes a real event file, read back with TensorBoard's own reader, whose geometry scalars are metrics.parquet's
per-layer values of the tables the callback wrote, at the steps it analysed, beside the loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import GPTNeoXForCausalLM, Trainer, TrainingArguments

from anisweep.corpus import load_texts, make_batch
from anisweep.extract.model import ExtractSettings
from anisweep.live.callback import AnisweepCallback
from anisweep.measures.logged import LOGGED, logged_scalars, scalar_name
from anisweep.measures.metrics import checkpoint_metrics
from anisweep.tangent.settings import GradientSettings
from anisweep.toy.tokenizers import build_neox_tokenizer

from conftest import neox_config

pytest.importorskip("accelerate")  # the Trainer needs it (the `test` extra)
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

pytestmark = pytest.mark.slow  # a Trainer run and the callback's analysis: seconds each

CHOSEN = [0, 2]
SETTINGS = ExtractSettings(n_sequences=4, seq_len=16, batch_size=2, sample_tokens=64, device="cpu")


def _train(tmp_path, report_to, callback):
    texts = load_texts({"source": "builtin"})[:300]
    torch.manual_seed(0)
    config = neox_config()
    config.vocab_size = len(callback.tokenizer)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=2,
        seed=0,
        use_cpu=True,
        report_to=report_to,
        disable_tqdm=True,
        save_strategy="no",
        logging_strategy="steps",
        logging_steps=1,
    )
    windows = make_batch(callback.tokenizer, texts, 4, 16, seed=7)["input_ids"]
    dataset = [{"input_ids": ids, "labels": ids} for ids in windows]
    trainer = Trainer(model=GPTNeoXForCausalLM(config), args=args, train_dataset=dataset, callbacks=[callback])
    trainer.train()
    return trainer


def _callback(tmp_path, **kw):
    texts = load_texts({"source": "builtin"})[:300]
    tokenizer = build_neox_tokenizer(texts, 200)
    gradients = GradientSettings(enabled=False)
    return AnisweepCallback(CHOSEN, texts, tokenizer, "run", tmp_path / "results", SETTINGS, gradients, **kw)


@pytest.fixture(scope="module")
def tensorboard_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("loggers")
    callback = _callback(tmp_path)
    trainer = _train(tmp_path, ["tensorboard"], callback)
    (events,) = (tmp_path / "out").rglob("events.out.tfevents.*")
    accumulator = event_accumulator.EventAccumulator(str(events.parent), size_guidance={"scalars": 0})
    accumulator.Reload()
    return tmp_path, trainer, accumulator


def _expected(tmp_path, step: int) -> dict[str, float]:
    return logged_scalars(checkpoint_metrics(tmp_path / "results" / "local" / "run" / f"step{step}"))


def test_the_event_file_holds_the_parquet_values_at_the_analysed_steps(tensorboard_run):
    tmp_path, _, accumulator = tensorboard_run
    tags = [t for t in accumulator.Tags()["scalars"] if t.startswith("train/geometry/")]
    for step in CHOSEN:
        expected = _expected(tmp_path, step)
        assert {f"train/{name}" for name in expected} == set(tags)
        for name, value in expected.items():
            (event,) = [e for e in accumulator.Scalars(f"train/{name}") if e.step == step]
            if math.isnan(value):
                assert math.isnan(event.value), name
            else:
                assert event.value == np.float32(value), name  # TensorBoard keeps float32


def test_every_logged_metric_has_a_scalar_per_layer_beside_the_loss(tensorboard_run):
    tmp_path, trainer, accumulator = tensorboard_run
    n_layers = trainer.model.config.num_hidden_layers
    tags = set(accumulator.Tags()["scalars"])
    for metric, sites in LOGGED:
        for site in sites:
            layers = range(n_layers) if site == "attention" else [n_layers] if site == "final_ln_out" else range(0)
            layers = range(n_layers + 1) if site == "resid" else layers
            assert {f"train/{scalar_name(metric, site, layer)}" for layer in layers} <= tags, (metric, site)
    assert [e.step for e in accumulator.Scalars("train/loss")][:1] == [1]  # the same axis: global_step
    assert sorted(e.step for e in accumulator.Scalars("train/geometry/avg_cos/resid/layer_0")) == CHOSEN
    history = [entry for entry in trainer.state.log_history if "geometry/avg_cos/resid/layer_0" in entry]
    assert [entry["step"] for entry in history] == CHOSEN


def test_a_callback_outside_a_trainer_warns_once_that_nothing_is_reported(tmp_path):
    callback = _callback(tmp_path)
    torch.manual_seed(0)
    config = neox_config()
    config.vocab_size = len(callback.tokenizer)
    model = GPTNeoXForCausalLM(config)

    class State:
        global_step, log_history = 0, []

    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", seed=0)
    with pytest.warns(UserWarning, match=r"summaries go to no logger .* report=False"):
        callback.on_train_begin(args, State(), None, model=model)
    assert (tmp_path / "results" / "local" / "run" / "step0" / "extract.json").is_file()
    assert State.log_history == []
