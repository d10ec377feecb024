"""W_Q and W_K of a GPT-NeoX fused `query_key_value` matrix are read as each head's rows (per head, its q, k and v
rows are blocks one after the other), never the whole matrix nor `dense`: over a local Hub (tests/fakehub.py) the
bytes served are the header and those rows, and the values are the full matrix's slices; on a checkpoint with
Pythia-12b's shapes the reads planned from its safetensors header move under a fifth of the file."""

from __future__ import annotations

import json
import math
import struct

import pytest
import torch
from fakehub import FakeHub, online_hub, read_folder
from test_range_reads import REPO, hub_checkpoint, pythia_shaped, served
from transformers import GPTNeoXForCausalLM

from anisweep.checkpoints.base import Checkpoint
from anisweep.measures.registry import measure_of, weight_measure
from anisweep.weights.checkpoint import CheckpointWeights
from anisweep.weights.remote import DTYPES, HubSource
from anisweep.weights.run import open_weights, run_weight_measure

from conftest import saved


@weight_measure(tensors=["attention"])
def qk_norms(weights):
    """The Frobenius norm of each layer's W_Q and W_K."""
    rows = []
    for layer in range(weights.shapes.n_layers):
        heads = weights.attention(layer)
        rows += [
            {"metric": f"{n}_norm", "layer": layer, "value": float(t.norm())}
            for n, t in (("q", heads.q), ("k", heads.k))
        ]
    return rows


@pytest.fixture
def pythia_like(tmp_path):
    """A tiny GPT-NeoX LM with Pythia's proportions, as a Hub branch."""
    path = saved(tmp_path, GPTNeoXForCausalLM, pythia_shaped(), "lm")
    return path, read_folder(path)


def header_of(data: bytes) -> tuple[int, dict]:
    (length,) = struct.unpack("<Q", data[:8])
    return 8 + length, json.loads(data[8 : 8 + length])


def test_wq_and_wk_move_each_heads_rows_alone_and_equal_the_full_matrix(tmp_path, monkeypatch, pythia_like):
    path, files = pythia_like
    data = files["model.safetensors"]
    start, header = header_of(data)
    fused = sorted(n for n in header if n.endswith("query_key_value.weight"))
    hub = FakeHub({REPO: {"step1000": files}})
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "hf", hub.url)
        weights = open_weights(hub_checkpoint(), ["attention"])
        s = weights.shapes
        heads = [weights.attention(layer) for layer in range(s.n_layers)]
        parts = [(h.q, h.k) for h in heads]
        moved = served(hub)
    full = open_weights(Checkpoint("local", "m", 1000, 1, None, path=str(path)))
    for layer, (q, k) in enumerate(parts):
        w = full.source.get(fused[layer]).to(torch.float64).reshape(s.n_heads, 3 * s.d_head, s.d_model)
        assert torch.equal(q, w[:, : s.d_head]) and torch.equal(k, w[:, s.d_head : 2 * s.d_head])
    qk_bytes = sum(2 * (header[n]["data_offsets"][1] - header[n]["data_offsets"][0]) // 3 for n in fused)
    assert moved == weights.source.bytes_read == start + qk_bytes
    assert not any("dense" in name for name in weights.read)


def test_a_measure_of_wq_and_wk_writes_the_same_rows_from_the_hub_as_from_the_folder(
    tmp_path, monkeypatch, pythia_like
):
    path, files = pythia_like
    measure = measure_of(qk_norms, "x:qk_norms")
    local = run_weight_measure(measure, Checkpoint("pythia", "pythia-70m", 1000, 1, None, path=str(path)))
    hub = FakeHub({REPO: {"step1000": files}})
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "hf", hub.url)
        remote = run_weight_measure(measure, hub_checkpoint())
    assert remote["value"].to_list() == local["value"].to_list()


# Pythia-12b (EleutherAI/pythia-12b's config.json): fp16, untied unembedding
PYTHIA_12B = {
    "model_type": "gpt_neox",
    "architectures": ["GPTNeoXForCausalLM"],
    "hidden_size": 5120,
    "intermediate_size": 20480,
    "num_attention_heads": 40,
    "num_hidden_layers": 36,
    "vocab_size": 50688,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
}


def pythia_12b_header() -> tuple[dict, int]:
    """(the safetensors header of one file holding Pythia-12b's tensors, the file's size)."""
    d, f, v = PYTHIA_12B["hidden_size"], PYTHIA_12B["intermediate_size"], PYTHIA_12B["vocab_size"]
    shapes = {"gpt_neox.embed_in.weight": [v, d]}
    for layer in range(PYTHIA_12B["num_hidden_layers"]):
        p = f"gpt_neox.layers.{layer}."
        shapes |= {
            f"{p}input_layernorm.weight": [d],
            f"{p}input_layernorm.bias": [d],
            f"{p}post_attention_layernorm.weight": [d],
            f"{p}post_attention_layernorm.bias": [d],
            f"{p}attention.query_key_value.weight": [3 * d, d],
            f"{p}attention.query_key_value.bias": [3 * d],
            f"{p}attention.dense.weight": [d, d],
            f"{p}attention.dense.bias": [d],
            f"{p}mlp.dense_h_to_4h.weight": [f, d],
            f"{p}mlp.dense_h_to_4h.bias": [f],
            f"{p}mlp.dense_4h_to_h.weight": [d, f],
            f"{p}mlp.dense_4h_to_h.bias": [d],
        }
    shapes |= {"gpt_neox.final_layer_norm.weight": [d], "gpt_neox.final_layer_norm.bias": [d]}
    shapes |= {"embed_out.weight": [v, d]}
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = math.prod(shape) * 2
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    start = 8 + len(json.dumps(header).encode())
    return header, start + offset


class PlannedSource(HubSource):
    """A HubSource over a header alone: the byte ranges its reads would request are recorded, and the tensors are
    shapes without values (the meta device), so that a 24 GB checkpoint is planned without moving it."""

    def __init__(self, folder, header: dict):
        super().__init__("EleutherAI/pythia-12b", "0" * 40, ["model.safetensors"], folder)
        self._planned_header = header
        self.planned: list[tuple[int, int]] = []

    def header(self, name):
        return 8 + len(json.dumps(self._planned_header).encode()), self._planned_header

    def get(self, name):
        file, offset, info = self._tensor(name)
        start, stop = info["data_offsets"]
        self.planned.append((offset + start, offset + stop))
        return torch.empty(info["shape"], dtype=DTYPES[info["dtype"]], device="meta")

    def get_rows(self, name, spans):
        _, ranges = self.row_ranges(name, spans)
        self.planned += ranges
        shape = self._tensor(name)[2]["shape"]
        return torch.empty([sum(b - a for a, b in spans), *shape[1:]], dtype=torch.float16, device="meta")


def test_wq_and_wk_of_a_pythia_12b_shaped_checkpoint_move_under_a_fifth_of_it(tmp_path):
    header, size = pythia_12b_header()
    (tmp_path / "config.json").write_text(json.dumps(PYTHIA_12B))
    source = PlannedSource(tmp_path, header)
    weights = CheckpointWeights(source, ["attention"])
    s = weights.shapes
    for layer in range(s.n_layers):
        heads = weights.attention(layer)
        assert heads.q.shape == heads.k.shape == (s.n_heads, s.d_head, s.d_model)
    header_bytes = source.header("model.safetensors")[0]
    ranges = source.planned
    assert len(ranges) == 2 * s.n_layers * s.n_heads  # each head's q rows, then its k rows
    assert all(b > a for a, b in ranges) and len(set(ranges)) == len(ranges)
    moved = header_bytes + sum(b - a for a, b in ranges)
    wq_wk = s.n_layers * 2 * s.d_model * s.d_model * 2
    assert moved == header_bytes + wq_wk
    fused = s.n_layers * (3 + 1) * s.d_model * s.d_model * 2  # the fused matrix and dense, read whole before
    print(
        f"pythia-12b-shaped W_Q and W_K: {moved / size:.3f} of the file by per-head ranges "
        f"(the whole fused matrix and dense: {(header_bytes + fused) / size:.3f})"
    )
    assert moved <= size / 5
