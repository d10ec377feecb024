"""The built-in weight measure `weight_matrices` against the models' own parameters: each matrix cut out of the
model's modules by hand (GPT-NeoX's fused, per-head interleaved query_key_value; Llama's grouped key and value
heads), its condition number from numpy.linalg.cond and its Gini and Hoyer sparsity from pico-analyze's formulas;
and the job's weights.parquet holding both built-in weight measures."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import GPTNeoXForCausalLM, LlamaForCausalLM

from anisweep.checkpoints.base import Checkpoint
from anisweep.measures.matrices import matrix_rows
from anisweep.weights.builtin import builtin_weight_tables
from anisweep.weights.run import open_weights

from conftest import llama_config, neox_config, saved


def expected(w: torch.Tensor) -> dict[str, float]:
    w = w.detach().double()
    x, _ = torch.sort(w.flatten().abs())
    n = x.numel()
    idx = torch.arange(1, n + 1, dtype=x.dtype)
    hoyer = (math.sqrt(n) - float(w.norm(p=1)) / float(w.norm(p=2))) / (math.sqrt(n) - 1)
    return {
        "condition_number": float(np.linalg.cond(w.numpy())),
        "gini": float(((2 * idx - n - 1) * x).sum() / (n * x.sum())),
        "hoyer": hoyer,
    }


def measured(path) -> dict:
    weights = open_weights(Checkpoint("local", "m", 1, 1, None, path=str(path)))
    return {(r["layer"], r["site"], r["metric"]): r["value"] for r in matrix_rows(weights)}


def check(rows: dict, layer, site: str, w: torch.Tensor) -> None:
    for metric, value in expected(w).items():
        assert rows[(layer, site, metric)] == pytest.approx(value, rel=1e-6), (layer, site, metric)


def test_gpt_neox_matrices_from_the_fused_projection(tmp_path):
    path = saved(tmp_path, GPTNeoXForCausalLM, neox_config(), "lm")
    model = GPTNeoXForCausalLM.from_pretrained(path)
    c = model.config
    heads, d_head, d = c.num_attention_heads, c.hidden_size // c.num_attention_heads, c.hidden_size
    rows = measured(path)
    check(rows, None, "embed_in", model.gpt_neox.embed_in.weight)
    check(rows, None, "embed_out", model.get_output_embeddings().weight)
    for layer, block in enumerate(model.gpt_neox.layers):
        qkv = block.attention.query_key_value.weight.reshape(heads, 3, d_head, d)
        for i, site in enumerate(("w_q", "w_k", "w_v")):
            check(rows, layer, site, qkv[:, i].reshape(heads * d_head, d))
        check(rows, layer, "w_o", block.attention.dense.weight)
    assert len(rows) == 3 * (2 + 4 * c.num_hidden_layers)


def test_grouped_query_heads_once_and_a_tied_unembedding_left_out(tmp_path):
    path = saved(tmp_path, LlamaForCausalLM, llama_config(tie_word_embeddings=True), "llama")
    model = LlamaForCausalLM.from_pretrained(path)
    rows = measured(path)
    assert not any(site == "embed_out" for _, site, _ in rows)
    for layer, block in enumerate(model.model.layers):
        attention = block.self_attn
        check(rows, layer, "w_q", attention.q_proj.weight)
        check(rows, layer, "w_k", attention.k_proj.weight)  # 2 key heads, not repeated for the 4 query heads
        check(rows, layer, "w_v", attention.v_proj.weight)
        check(rows, layer, "w_o", attention.o_proj.weight)


def test_the_weights_job_writes_both_built_in_measures(tmp_path):
    path = saved(tmp_path, GPTNeoXForCausalLM, neox_config(), "lm")
    metrics, pairs = builtin_weight_tables(Checkpoint("local", "m", 1, 1, None, path=str(path)), probe_tokens=16)
    assert set(metrics["measure"]) == {"circuits", "weight_matrices"} and pairs
    assert metrics.filter(metrics["measure"] == "weight_matrices").height == len(measured(path))
