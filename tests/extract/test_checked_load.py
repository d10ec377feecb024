"""A checkpoint is analysed with its own weights or not at all: a tensor the weight files lack, hold in another
shape or hold beyond the model's stops extract before the forward pass, naming the tensors and the folder. Only an
LM head a checkpoint of the base model lacks may be initialised, and then nothing read from it is reported."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import polars as pl
import pytest
import torch
from safetensors.torch import load_file, save_file

from anisweep.extract import run as extract_run
from anisweep.extract.checked_load import WeightsError
from anisweep.extract.model import ExtractSettings, load_model
from anisweep.extract.run import extract_checkpoint
from anisweep.extract.tables import embeddings_table

from hubcache import save_tiny_bert, save_tiny_pythia

SETTINGS = ExtractSettings(n_sequences=2, seq_len=16, batch_size=2, sample_tokens=32, device="cpu")
TEXTS = ["the cat sat on the mat and the dog sat on the log " * 20] * 4
QKV = "gpt_neox.layers.1.attention.query_key_value.weight"
BERT_QUERY = "bert.encoder.layer.1.attention.self.query.weight"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("checked_load")
    return {"pythia": save_tiny_pythia(root / "pythia"), "bert": save_tiny_bert(root / "bert", safetensors=True)}


def edited_copy(source: Path, folder: Path, edit) -> Path:
    """A copy of a saved checkpoint whose model.safetensors `edit` changed (a dict of tensors, in place)."""
    folder.mkdir(parents=True)
    for f in source.iterdir():
        if f.name != "model.safetensors":
            (folder / f.name).write_bytes(f.read_bytes())
    tensors = load_file(source / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def manifest(folder: Path) -> dict:
    ident = {"family": "local", "model": "run", "step": 1, "seed": None, "tokens_seen": None}
    return {**ident, "path": str(folder), "tokenizer_path": str(folder)}


def no_forward_pass(monkeypatch):
    monkeypatch.setattr(extract_run, "timed_run", lambda *a, **k: pytest.fail("the model ran"))


@pytest.mark.parametrize(
    ("kind", "name"), [("pythia", QKV), ("bert", BERT_QUERY), ("bert", "cls.predictions.transform.dense.weight")]
)
def test_a_missing_tensor_stops_extract_before_the_forward_pass_naming_it(tiny, tmp_path, monkeypatch, kind, name):
    folder = edited_copy(tiny[kind], tmp_path / "step1", lambda t: t.pop(name))
    no_forward_pass(monkeypatch)
    with pytest.raises(WeightsError, match="missing") as error:
        extract_checkpoint(manifest(folder), TEXTS, SETTINGS, tmp_path / "out")
    assert name in str(error.value) and str(folder) in str(error.value)
    assert not (tmp_path / "out" / "extract.json").exists()


@pytest.mark.parametrize("kind", ["pythia", "bert"])
def test_an_unexpected_tensor_stops_extract_naming_it(tiny, tmp_path, monkeypatch, kind):
    folder = edited_copy(tiny[kind], tmp_path / "step1", lambda t: t.update({"extra.stray": torch.zeros(3)}))
    no_forward_pass(monkeypatch)
    with pytest.raises(WeightsError, match="unexpected") as error:
        extract_checkpoint(manifest(folder), TEXTS, SETTINGS, tmp_path / "out")
    assert "extra.stray" in str(error.value) and str(folder) in str(error.value)


def test_a_tensor_of_another_shape_names_both_shapes(tiny, tmp_path):
    folder = edited_copy(tiny["pythia"], tmp_path / "step1", lambda t: t.update({QKV: torch.zeros(5, 5)}))
    with pytest.raises(WeightsError, match=r"of another shape: .*query_key_value.weight \(5, 5\) where the model has"):
        load_model(folder)


def test_a_whole_checkpoint_loads_without_a_word(tiny):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kind in ("pythia", "bert"):
            loaded = load_model(tiny[kind])
            assert loaded.initialised == () and loaded.ignored == ()


def without_head(tensors: dict) -> None:
    for name in [name for name in tensors if name.startswith(("embed_out.", "cls."))]:
        del tensors[name]


def test_an_untied_head_the_checkpoint_lacks_is_initialised_said_and_never_reported(tiny, tmp_path):
    """A GPT-NeoX checkpoint whose files hold the base model alone: the base runs whole; the LM head (untied) is
    random, so its I(W) is left out, as for a checkpoint without a head, and extract.json names the tensor."""
    folder = edited_copy(tiny["pythia"], tmp_path / "step1", without_head)
    with pytest.warns(UserWarning, match=r"holds no lm_head.weight: GPTNeoXForCausalLM initialised them at random"):
        extract_checkpoint(manifest(folder), TEXTS, SETTINGS, tmp_path / "out", progress=False)
    info = json.loads((tmp_path / "out" / "extract.json").read_text())
    assert info["initialised_tensors"] == ["lm_head.weight"] and info["ignored_tensors"] == []
    assert pl.read_parquet(tmp_path / "out" / "embeddings.parquet")["matrix"].unique().to_list() == ["embed_in"]
    with pytest.raises(WeightsError, match="missing .*lm_head.weight"):
        load_model(folder, head_needed=True)  # the gradient analysis's loss runs through the head


def test_a_tied_head_the_checkpoint_lacks_is_the_input_embedding(tiny, tmp_path):
    """BERT ties its decoder to the word embeddings: a checkpoint of BertModel alone still gives the real embed_out;
    the head's transform is initialised, named, and read by nothing extract reports."""
    folder = edited_copy(tiny["bert"], tmp_path / "step1", without_head)
    with pytest.warns(UserWarning, match="initialised them at random"):
        loaded = load_model(folder)
    assert "cls.predictions.transform.dense.weight" in loaded.initialised
    assert not any(name.startswith("bert.") for name in loaded.initialised)
    table = embeddings_table(loaded.adapter, loaded.model, loaded.initialised)
    assert set(table["matrix"]) == {"embed_in", "embed_out"} and table["tied"].all()


def test_a_base_model_loaded_from_another_architectures_checkpoint_ignores_that_head(tiny, tmp_path):
    """An architecture extract has no LM class for is loaded as its base model: the checkpoint's head is not loaded,
    said and recorded; a stray tensor under the base model's own modules is still an error."""
    folder = edited_copy(tiny["pythia"], tmp_path / "step1", lambda t: None)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["GPTNeoXForTokenClassification"]}))
    with pytest.warns(UserWarning, match="embed_out.weight, the head of another architecture"):
        loaded = load_model(folder)
    assert loaded.ignored == ("embed_out.weight",) and loaded.initialised == ()
    stray = edited_copy(folder, tmp_path / "stray", lambda t: t.update({"gpt_neox.layers.7.x": torch.zeros(2)}))
    with pytest.raises(WeightsError, match=r"unexpected .*layers\.7\.x"):
        load_model(stray)


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        # Pythia's published files hold each layer's causal-mask buffers and rotary frequencies
        ("pythia", ["gpt_neox.layers.0.attention.bias", "gpt_neox.layers.0.attention.masked_bias"]),
        ("pythia", ["gpt_neox.layers.1.attention.rotary_emb.inv_freq"]),
        ("bert", ["bert.embeddings.position_ids"]),  # a persistent buffer in older BERT checkpoints
    ],
)
def test_tensors_transformers_ignores_by_design_load_without_a_word(tiny, tmp_path, kind, extra):
    folder = edited_copy(tiny[kind], tmp_path / "step1", lambda t: t.update({name: torch.zeros(4) for name in extra}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_model(folder)
    assert loaded.initialised == () and loaded.ignored == ()


def test_the_gradient_analysis_needs_the_checkpoints_own_head(tiny, tmp_path, monkeypatch):
    """Its loss runs through the LM head: a checkpoint without one stops before the forward pass where the analysis
    covers the step, and runs (head left out) where it does not."""
    from anisweep.tangent.checkpoint import pass_tables_for
    from anisweep.tangent.settings import GradientSettings

    folder = edited_copy(tiny["pythia"], tmp_path / "step1", without_head)
    covered = pass_tables_for(manifest(folder), GradientSettings(enabled=True), batch_size=2, progress=False)
    run = extract_run.timed_run
    no_forward_pass(monkeypatch)
    with pytest.raises(WeightsError, match="lm_head.weight, the LM head, which the gradient analysis's loss runs"):
        extract_checkpoint(manifest(folder), TEXTS, SETTINGS, tmp_path / "out", more_tables=covered)
    monkeypatch.setattr(extract_run, "timed_run", run)
    uncovered = pass_tables_for(manifest(folder), GradientSettings(enabled=True, steps=[]), batch_size=2)
    with pytest.warns(UserWarning, match="lm_head.weight"):
        extract_checkpoint(manifest(folder), TEXTS, SETTINGS, tmp_path / "out", progress=False, more_tables=uncovered)
    assert (tmp_path / "out" / "extract.json").is_file()
