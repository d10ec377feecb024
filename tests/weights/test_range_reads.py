"""A weights-only sweep of a Hub checkpoint moves only the tensors its measures name: range reads of the
safetensors (the header, then each tensor's bytes) from a local Hub (tests/fakehub.py), counted against a full
download; pickled .bin files fall back to the whole file, said once."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from fakehub import FakeHub, online_hub, read_folder
from transformers import GPTNeoXForCausalLM

from anisweep.checkpoints.base import Checkpoint
from anisweep.measures.circuits import circuit_tables, circuits
from anisweep.measures.registry import measure_of, weight_measure
from anisweep.weights.run import open_weights, run_weight_measure

from conftest import neox_config, saved

REPO = "EleutherAI/pythia-70m"


def hub_checkpoint(revision="step1000") -> Checkpoint:
    return Checkpoint(
        family="pythia", model="pythia-70m", step=1000, tokens_seen=1, seed=None, repo_id=REPO, revision=revision
    )


def tensor_bytes(data: bytes, names) -> int:
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    return 8 + length, sum(header[n]["data_offsets"][1] - header[n]["data_offsets"][0] for n in names)


def pythia_shaped():
    config = neox_config()
    config.intermediate_size = 4 * config.hidden_size
    return config


@pytest.fixture
def pythia_like(tmp_path):
    """A tiny GPT-NeoX LM with Pythia's MLP width (4 d_model) and untied unembedding, as a Hub branch."""
    path = saved(tmp_path, GPTNeoXForCausalLM, pythia_shaped(), "lm")
    return path, read_folder(path)


def served(hub, name="model.safetensors") -> int:
    return sum(n for path, n in hub.served if path.endswith(name))


def test_circuits_of_a_hub_checkpoint_read_only_their_tensors(tmp_path, monkeypatch, pythia_like):
    path, files = pythia_like
    local_rows, local_pairs = circuit_tables(open_weights(Checkpoint("local", "m", 1000, 1, None, path=str(path))))
    hub = FakeHub({REPO: {"step1000": files}})
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "hf", hub.url)
        weights = open_weights(hub_checkpoint(), measure_of(circuits, "x:circuits").tensors)
        rows, pairs = circuit_tables(weights)
        moved = served(hub)
        from huggingface_hub import hf_hub_download

        hf_hub_download(REPO, "model.safetensors", revision="step1000", cache_dir=tmp_path / "full")
        full = served(hub) - moved
    assert rows == local_rows and pairs == local_pairs
    size = len(files["model.safetensors"])
    header, wanted = tensor_bytes(files["model.safetensors"], weights.read)
    assert full == size
    assert moved == weights.source.bytes_read == header + wanted  # the header and the named tensors, nothing else
    assert not any("mlp" in name for name in weights.read)
    print(f"circuits: {moved} of {size} bytes moved by range reads ({moved / size:.0%}), {size - moved} saved")
    assert moved < 0.6 * size


def test_an_embedding_measure_moves_the_embedding_alone(tmp_path, monkeypatch, pythia_like):
    _, files = pythia_like

    @weight_measure(tensors=["embedding"])
    def embedding_norm(weights):
        """Mean norm of the token embeddings."""
        return [{"metric": "embedding_norm", "value": float(weights.embedding().norm(dim=1).mean())}]

    hub = FakeHub({REPO: {"step1000": files}})
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "hf", hub.url)
        df = run_weight_measure(measure_of(embedding_norm, "x:embedding_norm"), hub_checkpoint())
        moved = served(hub)
    header, wanted = tensor_bytes(files["model.safetensors"], ["gpt_neox.embed_in.weight"])
    assert moved == header + wanted == header + 60 * 32 * 4
    assert df["value"].item() == pytest.approx(
        float(GPTNeoXForCausalLM.from_pretrained(pythia_like[0]).gpt_neox.embed_in.weight.norm(dim=1).mean()), rel=1e-6
    )
    print(f"embedding only: {moved} of {len(files['model.safetensors'])} bytes moved")


def test_pickled_bin_falls_back_to_the_whole_file_said_once(tmp_path, monkeypatch, capsys):
    torch.manual_seed(0)
    model = GPTNeoXForCausalLM(neox_config())
    (tmp_path / "bin").mkdir()
    model.config.save_pretrained(tmp_path / "bin")
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")  # the format of Pythia-12B's steps
    files = read_folder(tmp_path / "bin")
    assert "pytorch_model.bin" in files and not any(f.endswith(".safetensors") for f in files)
    hub = FakeHub({REPO: {"step1000": files}})
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "hf", hub.url)
        weights = open_weights(hub_checkpoint())
        rows, _ = circuit_tables(weights)
        moved = served(hub, "pytorch_model.bin")
    assert moved == len(files["pytorch_model.bin"]) == weights.source.bytes_read
    err = capsys.readouterr().err
    assert err.count("cannot be read in part") == 1, err
    local = circuit_tables(open_weights(Checkpoint("local", "m", 1000, 1, None, path=str(tmp_path / "bin"))))[0]
    assert rows == local


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize("shards", [None, "60KB"], ids=["one-file", "sharded"])
def test_offline_the_cache_is_read_in_place_and_online_shards_by_ranges(tmp_path, monkeypatch, shards):
    """Offline (the workflow's tests, a cluster node): the Hugging Face cache's snapshot is read where it lies, with
    its tokenizer; online, a sharded checkpoint's tensors are read by ranges of each shard. Both give the local
    folder's numbers."""
    from hubcache import build_hub_cache, offline_hub, save_tiny_pythia

    folder = save_tiny_pythia(tmp_path / "pythia", max_shard_size=shards)
    assert len([f for f in folder.iterdir() if f.suffix == ".safetensors"]) == (3 if shards else 1)
    local = circuit_tables(open_weights(Checkpoint("local", "m", 1000, 1, None, path=str(folder))))
    with monkeypatch.context() as m:
        build_hub_cache(tmp_path / "hf", REPO, {"step1000": folder})
        offline_hub(m, tmp_path / "hf")
        weights = open_weights(hub_checkpoint())
        assert type(weights.source).__name__ == "LocalSource" and weights.tokenizer_path is not None
        assert circuit_tables(weights) == local
        assert not weights.tokens([5])[0].startswith("#")  # the tokenizer's own string
    hub = FakeHub({REPO: {"step1000": read_folder(folder)}})
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "online", hub.url)
        weights = open_weights(hub_checkpoint())
        assert type(weights.source).__name__ == "HubSource"
        assert circuit_tables(weights) == local
    total = sum(len(d) for n, d in read_folder(folder).items() if n.endswith(".safetensors"))
    assert served(hub, ".safetensors") == weights.source.bytes_read < total
