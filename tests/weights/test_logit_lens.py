"""The logit lens from extract's samples against Hugging Face's own hidden states and heads: every layer's
states of a tiny decoder (GPT-NeoX: its final norm then embed_out, the last layer its own logits) and a tiny encoder
(BERT: its MLM head on every layer, over its masked pass: Hugging Face's forward of the batch with those tokens
masked), the ranks, probabilities, KL to the last layer and angles recomputed with numpy over the lens's tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import BertForMaskedLM, GPT2LMHeadModel, GPTNeoXForCausalLM, LlamaForCausalLM

from anisweep.weights.layout import layout_for
from anisweep.weights.lens import lens_from_hidden
from anisweep.weights.source import LocalSource

from conftest import bert_config, gpt2_config, llama_config, neox_config, padded_batch, run_extract, saved

MASK = 4  # padded_batch's tokens are 5..59, its padding 0


def hf_layer_logits(model, batch, encoder: bool) -> list[np.ndarray]:
    """Per hidden layer l (0 the embeddings), logits (B, T, V) through the model's own final norm and head."""
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
        states = out.hidden_states
        if encoder:
            return [model.cls(h).double().numpy() for h in states]
        norm = model.get_decoder().norm if hasattr(model.get_decoder(), "norm") else None
        norm = getattr(model.base_model, "final_layer_norm", None) or getattr(model.base_model, "ln_f", None) or norm
        head = model.get_output_embeddings()
        # the last entry is after the final norm (GPT-NeoX, GPT-2, Llama): the model's own logits stand for it
        return [head(norm(h)).double().numpy() for h in states[:-1]] + [out.logits.double().numpy()]


def hf_states(model, batch) -> list[np.ndarray]:
    with torch.no_grad():
        return [h.double().numpy() for h in model(**batch, output_hidden_states=True).hidden_states]


@pytest.mark.parametrize(
    ("cls", "config", "encoder"),
    [
        (GPTNeoXForCausalLM, neox_config, False),
        (BertForMaskedLM, bert_config, True),
        (LlamaForCausalLM, llama_config, False),
        (GPT2LMHeadModel, gpt2_config, False),
    ],
    ids=["gpt_neox", "bert", "llama", "gpt2"],
)
def test_logit_lens_matches_hugging_face(tmp_path, cls, config, encoder):
    path = saved(tmp_path, cls, config(), "m")
    model = cls.from_pretrained(path).eval()
    batch = padded_batch() | ({"mask_token_id": MASK, "special_ids": (0, 1, 2, 3, MASK)} if encoder else {})
    tables, _ = run_extract(path, batch)
    source = LocalSource(path)
    layout = layout_for(source.config, source.names(), source.get)
    rows = lens_from_hidden(
        tables["hidden"], batch["input_ids"], batch["attention_mask"], layout, tables["masked_resid"]
    )
    got = {(r.get("layer"), r["metric"]): r["value"] for r in rows}

    ids, mask = batch["input_ids"].numpy(), batch["attention_mask"].numpy()
    if encoder:
        sample = tables["masked_resid"].filter(tables["masked_resid"]["layer"] == 0).sort("seq", "position")
        seq, pos = sample["seq"].to_numpy().copy(), sample["position"].to_numpy().copy()
        first = np.zeros_like(ids, dtype=bool)
        first[seq, pos] = True
        assert seq.max() < 2 and first[:2].sum() == len(seq)  # the first mini-batch (batch_size 2) only
        assert mask[seq, pos].all() and (ids[seq, pos] >= 5).all()  # text tokens, never padding or special
        keep, target = np.ones(len(seq), bool), ids[seq, pos]
        masked = batch["input_ids"][:2].clone()
        masked[seq, pos] = MASK
        batch = {"input_ids": masked, "attention_mask": batch["attention_mask"][:2]}
    else:
        sample = tables["hidden"].filter((tables["hidden"]["site"] == "resid") & (tables["hidden"]["layer"] == 0))
        sample = sample.sort("seq", "position")
        seq, pos = sample["seq"].to_numpy(), sample["position"].to_numpy()
        nxt = np.minimum(pos + 1, ids.shape[1] - 1)
        keep = (pos + 1 < ids.shape[1]) & (mask[seq, nxt] == 1)
        target = ids[seq, nxt]
    all_seq, all_pos = seq, pos
    seq, pos, target = seq[keep], pos[keep], target[keep]
    logits = hf_layer_logits(model, batch, encoder)
    final = logits[-1][seq, pos]
    final_logp = (
        final - np.log(np.exp(final - final.max(1, keepdims=True)).sum(1, keepdims=True)) - final.max(1, keepdims=True)
    )
    states = hf_states(model, batch)
    n_layers = len(logits) - 1
    for layer, lg in enumerate(logits):
        z = lg[seq, pos]
        logp = z - z.max(1, keepdims=True)
        logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
        own = logp[np.arange(len(target)), target]
        rank = (logp > own[:, None]).sum(1)
        kl = (np.exp(final_logp) * (final_logp - logp)).sum(1)
        assert got[(layer, "lens_rank")] == pytest.approx(rank.mean(), abs=1e-9), layer
        assert got[(layer, "lens_top1")] == pytest.approx((rank == 0).mean(), abs=1e-9), layer
        assert got[(layer, "lens_prob")] == pytest.approx(np.exp(own).mean(), rel=1e-4), layer
        assert got[(layer, "lens_kl")] == pytest.approx(kl.mean(), rel=1e-3, abs=1e-6), layer
        if 0 < layer and (layer < n_layers or encoder):  # HF's last decoder state is after the final norm
            a, b = states[layer - 1][all_seq, all_pos], states[layer][all_seq, all_pos]
            a, b = a - a.mean(1, keepdims=True), b - b.mean(1, keepdims=True)
            cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
            assert got[(layer, "lens_angle")] == pytest.approx(np.arccos(np.clip(cos, -1, 1)).mean(), rel=1e-5)
    assert got[(n_layers, "lens_kl")] == pytest.approx(0.0, abs=1e-9)
    assert got[(None, "lens_tokens")] == len(target)
