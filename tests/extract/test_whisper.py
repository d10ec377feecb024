"""Whisper, encoder and decoder, against Hugging Face's eager forward on the same log-mel features and the decoder
tokens extract chose: every token is the argmax of the model's own logits at the position before it (greedy), the
encoder's and the decoder's q/k means and attention statistics (self-attention causal in the decoder;
cross-attention in its own tables, 1500 frames' worth of keys per query), the residual streams and the norms."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
import transformers
from test_speech import audio_batch, saved_model, waveforms

from anisweep.adapters.whisper import DECODER_TOKENS

from conftest import run_extract

TOL = 1e-5
N_ENC = 2


@torch.no_grad()
def whisper_reference(path, batch):
    model = transformers.WhisperForConditionalGeneration.from_pretrained(path, attn_implementation="eager").eval()
    stacks = model.model.encoder, model.model.decoder
    n_heads, got, handles = model.config.encoder_attention_heads, {}, []

    def split(name):
        return lambda m, a, o: got.__setitem__(name, o.view(*o.shape[:2], n_heads, -1).transpose(1, 2))

    def keep(name):
        return lambda m, a, o: got.update({name: o, f"{name}_in": a[0]})

    for first, stack in ((0, stacks[0]), (N_ENC, stacks[1])):
        handles.append(
            stack.layers[0].register_forward_pre_hook(lambda m, a, f=first: got.__setitem__(("in", f), a[0]))
        )
        for j, block in enumerate(stack.layers):
            handles.append(block.register_forward_hook(keep(("resid", first + j + 1))))
            attentions = [("", block.self_attn)] + ([("cross_", block.encoder_attn)] if first else [])
            for prefix, attention in attentions:
                handles.append(attention.q_proj.register_forward_hook(split((f"{prefix}q", first + j))))
                handles.append(attention.k_proj.register_forward_hook(split((f"{prefix}k", first + j))))
        handles.append(stack.layer_norm.register_forward_hook(keep(("norm", first))))
    out = model(**batch, output_attentions=True)
    for handle in handles:
        handle.remove()
    return model, out, got


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
def test_whisper_encoder_and_decoder_match_eager_reference(tmp_path):
    path = saved_model(tmp_path, "whisper")
    batch = audio_batch("whisper", waveforms())
    tables, loaded = run_extract(path, batch, batch_size=2)
    ids = batch["decoder_input_ids"]  # chosen by extract before its pass: the model's own greedy tokens
    n_tok = min(DECODER_TOKENS, loaded.model.config.max_target_positions)
    assert ids.shape == (5, n_tok) and (ids[:, 0] == loaded.model.config.decoder_start_token_id).all()
    model, out, got = whisper_reference(path, batch)
    assert torch.equal(out.logits[:, :-1].argmax(-1), ids[:, 1:])
    d = model.config.d_model // model.config.encoder_attention_heads
    qk, attention = tables["qk"], tables["attention"]
    cross_qk, cross_attention = tables["cross_qk"], tables["cross_attention"]
    maps = {(layer, False): a for layer, a in enumerate([*out.encoder_attentions, *out.decoder_attentions])} | {
        (N_ENC + j, True): a for j, a in enumerate(out.cross_attentions)
    }
    for (layer, cross), probs in maps.items():
        prefix = "cross_" if cross else ""
        q, k = got[(f"{prefix}q", layer)].double(), got[(f"{prefix}k", layer)].double()
        q_table, a_table = (cross_qk, cross_attention) if cross else (qk, attention)
        causal = layer >= N_ENC and not cross
        for head in range(probs.shape[1]):
            row = q_table.filter((pl.col("layer") == layer) & (pl.col("head") == head)).row(0, named=True)
            np.testing.assert_allclose(row["q_mean"], q[:, head].reshape(-1, d).mean(0).numpy(), atol=TOL)
            np.testing.assert_allclose(row["k_mean"], k[:, head].reshape(-1, d).mean(0).numpy(), atol=TOL)
            p = probs[:, head].double()
            if causal:  # eager's probabilities of the hidden keys are exactly 0
                assert torch.equal(p.triu(1), torch.zeros_like(p))
            entropy = -torch.where(p > 0, p * p.log(), 0.0).sum(-1)
            row = a_table.filter((pl.col("layer") == layer) & (pl.col("head") == head)).row(0, named=True)
            assert row["entropy_mean"] == pytest.approx(entropy.mean().item(), abs=TOL)
            assert row["p_max_mean"] == pytest.approx(p.max(-1).values.mean().item(), abs=TOL)
            assert row["n_rows"] == p.shape[0] * p.shape[1]
    stats = tables["hidden_stats"]
    sites = [(0, "resid", got[("in", 0)]), (N_ENC, "decoder_embed", got[("in", N_ENC)])]
    sites += [(layer, "resid", got[("resid", layer)]) for layer in range(1, N_ENC + 2)]
    sites += [(N_ENC, "encoder_final_ln_out", got[("norm", 0)]), (N_ENC + 1, "final_ln_out", got[("norm", N_ENC)])]
    for layer, site, x in sites:
        x = x.double().reshape(-1, x.shape[-1])
        row = stats.filter((pl.col("layer") == layer) & (pl.col("site") == site)).row(0, named=True)
        assert row["n"] == x.shape[0], (layer, site)
        np.testing.assert_allclose(row["sum_x"], x.sum(0).numpy(), rtol=TOL, atol=TOL * x.shape[0])
        unit = x / x.norm(dim=-1, keepdim=True)
        np.testing.assert_allclose(row["sum_unit"], unit.sum(0).numpy(), atol=TOL * x.shape[0])
    assert torch.equal(out.encoder_last_hidden_state, got[("norm", 0)])


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
def test_whisper_decoder_rows_name_the_tokens_the_decoder_reads(tmp_path):
    """Issue 43: the decoder's rows in hidden.parquet had token_id -1, as the encoder's frames have, though tokens
    stand there. Each decoder row names the token the decoder reads at its position (decoder_input_ids: the start
    token, then the model's greedy tokens), in hidden.parquet and in the outlier tables; the frames stay -1."""
    path = saved_model(tmp_path, "whisper")
    batch = audio_batch("whisper", waveforms())
    tables, _ = run_extract(path, batch, batch_size=2, sample_tokens=64)
    ids = batch["decoder_input_ids"].numpy()
    hidden = tables["hidden"]
    decoder = hidden.filter(pl.col("layer") > N_ENC)
    encoder = hidden.filter(pl.col("layer") <= N_ENC)
    assert decoder.height and encoder.height
    assert decoder["token_id"].to_list() == ids[decoder["seq"].to_numpy(), decoder["position"].to_numpy()].tolist()
    assert set(encoder["token_id"]) == {-1}
    assert (decoder.filter(pl.col("position") == 0)["token_id"] == int(ids[0, 0])).all()  # the start token
    for name in ("massive", "sink_keys"):
        rows = tables[name].filter(pl.col("layer") >= (N_ENC + 1 if name == "massive" else N_ENC))
        assert rows.height and rows["token_id"].null_count() == 0, name
        assert rows["token_id"].to_list() == ids[rows["seq"].to_numpy(), rows["position"].to_numpy()].tolist()
        frames = tables[name].filter(pl.col("layer") < N_ENC)
        assert frames["token_id"].null_count() == frames.height, name
