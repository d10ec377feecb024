"""The Trainer's own logs are the same with AnisweepCallback as without it: with logging_steps=1 and geometry at
steps 0, 3 and 6 of 6, every installed `report_to` logger (TensorBoard, MLflow, W&B) holds the loss, grad_norm
and learning_rate of every step, each the value the same run without the callback logs, and the geometry beside
them at the analysed steps. Each logger's record is read back from what it wrote, with its own reader."""

from __future__ import annotations

import importlib.util
import json
import struct
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from transformers import GPTNeoXForCausalLM, Trainer, TrainerCallback, TrainerControl, TrainingArguments

from anisweep.corpus import load_texts, make_batch
from anisweep.extract.model import ExtractSettings
from anisweep.live.callback import AnisweepCallback
from anisweep.tangent.settings import GradientSettings
from anisweep.toy.tokenizers import build_neox_tokenizer

from conftest import neox_config

pytest.importorskip("accelerate")  # the Trainer needs it (the `test` extra)

pytestmark = pytest.mark.slow  # two Trainer runs and three analyses per logger: seconds each

MAX_STEPS, CHOSEN = 6, [0, 3, 6]
TRAINER_LOGS = ("loss", "grad_norm", "learning_rate")
GEOMETRY = "geometry/avg_cos/resid/layer_0"
SETTINGS = ExtractSettings(n_sequences=4, seq_len=16, batch_size=2, sample_tokens=64, device="cpu")

Record = dict[str, list[tuple[int, float]]]  # {name as the Trainer logs it: [(global_step, value), ...]}


def _tensorboard(out: Path) -> Record:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = out.rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events.parent), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {
        tag.removeprefix("train/"): [(e.step, e.value) for e in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def _mlflow(out: Path) -> Record:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=_mlflow_uri(out))
    (experiment,) = [e for e in client.search_experiments() if e.name == "anisweep-logs"]
    (run,) = client.search_runs([experiment.experiment_id])
    history = {name: client.get_metric_history(run.info.run_id, name) for name in run.data.metrics}
    return {name: sorted((m.step, m.value) for m in metrics) for name, metrics in history.items()}


def _mlflow_uri(out: Path) -> str:
    return f"sqlite:///{out / 'mlflow.db'}"  # MLflow's own store (its file store is in maintenance mode)


def _wandb(out: Path) -> Record:
    import wandb
    from wandb.proto import wandb_internal_pb2

    run = wandb.run  # the Trainer leaves it open
    file = Path(run.dir).parent / f"run-{run.id}.wandb"
    wandb.finish()
    wandb.teardown()  # the service writes the run file out as it stops; the next run starts one of its own
    record: Record = defaultdict(list)
    for data in _leveldb_log(file.read_bytes()):
        entry = wandb_internal_pb2.Record()
        entry.ParseFromString(data)
        if entry.WhichOneof("record_type") != "history":
            continue
        items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in entry.history.item}
        step = items.pop("train/global_step")
        for name, value in items.items():
            if name.startswith("train/") and isinstance(value, int | float):
                record[name.removeprefix("train/")].append((step, value))
    return dict(record)


def _leveldb_log(data: bytes):
    """The records of a W&B run file: a 7-byte header (":W&B", 0xBEE1, version 0), then LevelDB's log format,
    32 KiB blocks of chunks each with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    block, header = 32768, struct.Struct("<IHB")
    assert data[:4] == b":W&B", "not a W&B run file"
    position, record = 7, b""
    while position + header.size <= len(data):
        if block - position % block < header.size:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _, length, kind = header.unpack_from(data, position)
        chunk = data[position + header.size : position + header.size + length]
        position += header.size + length
        record = chunk if kind in (1, 2) else record + chunk
        if kind in (1, 4):
            yield record


# logger: (the module it needs, its environment, the reader of what it wrote into the output_dir)
LOGGERS = {
    "tensorboard": ("tensorboard", lambda out: {}, _tensorboard),
    "mlflow": (
        "mlflow",
        lambda out: {"MLFLOW_TRACKING_URI": _mlflow_uri(out), "MLFLOW_EXPERIMENT_NAME": "anisweep-logs"},
        _mlflow,
    ),
    "wandb": (
        "wandb",
        lambda out: {"WANDB_MODE": "offline", "WANDB_DIR": str(out), "WANDB_SILENT": "true"},
        _wandb,
    ),
}


def _train(out: Path, logger: str, callbacks: list) -> list[dict]:
    texts = load_texts({"source": "builtin"})[:300]
    tokenizer = build_neox_tokenizer(texts, 200)
    torch.manual_seed(0)
    config = neox_config(hidden_dropout=0.1)  # dropout: the training draws from the RNG
    config.vocab_size = len(tokenizer)
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=MAX_STEPS,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        lr_scheduler_type="linear",
        seed=0,
        data_seed=0,
        use_cpu=True,
        report_to=[logger],
        run_name="anisweep-logs",
        disable_tqdm=True,
        save_strategy="no",
        logging_strategy="steps",
        logging_steps=1,
        dataloader_num_workers=0,
    )
    windows = make_batch(tokenizer, texts, 16, 16, seed=7)["input_ids"]
    dataset = [{"input_ids": ids, "labels": ids} for ids in windows]
    trainer = Trainer(model=GPTNeoXForCausalLM(config), args=args, train_dataset=dataset, callbacks=callbacks)
    trainer.train()
    return trainer.state.log_history


def _callback(results: Path) -> AnisweepCallback:
    texts = load_texts({"source": "builtin"})[:300]
    tokenizer = build_neox_tokenizer(texts, 200)
    gradients = GradientSettings(enabled=False)
    return AnisweepCallback(CHOSEN, texts, tokenizer, "run", results, SETTINGS, gradients)


def _trainer_logs(history: list[dict]) -> list[dict]:
    return [{k: entry[k] for k in ("step", *TRAINER_LOGS)} for entry in history if "loss" in entry]


@pytest.mark.parametrize("logger", list(LOGGERS))
def test_the_trainers_own_logs_are_those_of_the_run_without_the_callback(tmp_path, logger):
    module, environment, read = LOGGERS[logger]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: no {logger} record to compare")
    records, histories = {}, {}
    for name, callbacks in [("without", []), ("with", [_callback(tmp_path / "results")])]:
        out = tmp_path / name
        with pytest.MonkeyPatch.context() as patch:
            for key, value in environment(out).items():
                patch.setenv(key, value)
            histories[name] = _train(out, logger, callbacks)
            records[name] = read(out)
    every_step = list(range(1, MAX_STEPS + 1))
    for name in TRAINER_LOGS:
        assert [step for step, _ in records["without"][name]] == every_step, name
        assert records["with"][name] == records["without"][name], name
    assert [step for step, _ in records["with"][GEOMETRY]] == CHOSEN
    assert GEOMETRY not in records["without"]
    assert _trainer_logs(histories["with"]) == _trainer_logs(histories["without"])
    assert [entry["step"] for entry in _trainer_logs(histories["with"])] == every_step


class _StopAtTheSecondGeometry(TrainerCallback):
    """Stops the training by a new TrainerControl, as a callback may return one from on_log."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if GEOMETRY in logs and state.global_step == CHOSEN[1]:
            return TrainerControl(should_training_stop=True)
        return control


def test_the_control_a_logger_returns_for_the_geometry_is_the_one_the_training_goes_on_with(tmp_path):
    callbacks = [_callback(tmp_path / "results"), _StopAtTheSecondGeometry()]
    with pytest.warns(UserWarning, match=r"ended at step 3 without reaching the chosen steps \[6\]"):
        history = _train(tmp_path / "out", "none", callbacks)
    assert [entry["step"] for entry in _trainer_logs(history)] == list(range(1, CHOSEN[1] + 1))
