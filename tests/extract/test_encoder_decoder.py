"""T5 / ByT5 (encoder-decoder) against Hugging Face's eager forward on the same inputs: the encoder and the decoder
(teacher-forced on the shifted text), self-attention with T5's unscaled scores and relative position bias,
cross-attention in tables of its own, the residual stream and the norms, layers counted through the decoder."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
import transformers
from test_extract import check_all

from anisweep.extract import attention_torch
from anisweep.extract.model import ExtractSettings, load_model
from anisweep.extract.run import run
from anisweep.extract.stream_measures import StreamMeasures
from anisweep.measures.registry import measure_of, stream_measure

from conftest import albert_config, padded_batch, run_extract, saved, t5_config

N_ENC, N_DEC = 2, 3  # t5_config's blocks


@torch.no_grad()
def t5_reference(path, batch):
    """Eager T5 with every attention map and hidden state; q and k as HF's own q / k projections emit them (forward
    hooks), the relative position bias from HF's `compute_bias` of each stack's first block."""
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(path, attn_implementation="eager").eval()
    config = model.config
    b, t = batch["input_ids"].shape
    qk, handles = {}, []

    def grab(name):
        return lambda module, args, output: qk.__setitem__(
            name, output.view(b, t, config.num_heads, -1).transpose(1, 2)
        )

    stacks = [(0, model.encoder), (N_ENC, model.decoder)]
    for first, stack in stacks:
        for j, block in enumerate(stack.block):
            for proj in ("q", "k"):
                handles.append(
                    getattr(block.layer[0].SelfAttention, proj).register_forward_hook(grab((first + j, proj)))
                )
                if first:
                    cross = getattr(block.layer[1].EncDecAttention, proj)
                    handles.append(cross.register_forward_hook(grab((first + j, f"cross_{proj}"))))
    norms = {}
    for name, norm in (("enc", model.encoder.final_layer_norm), ("dec", model.decoder.final_layer_norm)):
        handles.append(norm.register_forward_hook(lambda m, a, o, name=name: norms.update({name: (a[0], o)})))
    out = model(
        **batch,
        decoder_input_ids=model._shift_right(batch["input_ids"]),
        decoder_attention_mask=batch["attention_mask"],
        output_attentions=True,
        output_hidden_states=True,
    )
    for handle in handles:
        handle.remove()
    assert len(out.encoder_attentions) == N_ENC and len(out.decoder_attentions) == len(out.cross_attentions) == N_DEC
    enc_bias = model.encoder.block[0].layer[0].SelfAttention.compute_bias(t, t)
    dec_bias = model.decoder.block[0].layer[0].SelfAttention.compute_bias(t, t)
    layers = range(N_ENC + N_DEC)
    self_ref = dict(
        attentions={
            **dict(enumerate(out.encoder_attentions)),
            **{N_ENC + j: a for j, a in enumerate(out.decoder_attentions)},
        },
        q={(layer, "pre"): qk[(layer, "q")] for layer in layers},
        k={(layer, "pre"): qk[(layer, "k")] for layer in layers},
        bias={layer: enc_bias if layer < N_ENC else dec_bias for layer in layers},
        # resid: the encoder's stream, then each decoder block's output; the stacks' last entries are after their norm
        resid=[
            *out.encoder_hidden_states[:N_ENC],
            norms["enc"][0],
            *out.decoder_hidden_states[1:N_DEC],
            norms["dec"][0],
        ],
        ln_in=norms["dec"][0],
        ln_out=norms["dec"][1],
        extra=[
            (N_ENC, "decoder_embed", out.decoder_hidden_states[0]),
            (N_ENC, "encoder_final_ln_in", norms["enc"][0]),
            (N_ENC, "encoder_final_ln_out", norms["enc"][1]),
        ],
        d=config.d_kv,
        scaling={layer: 1.0 for layer in layers},
    )
    decoder_layers = range(N_ENC, N_ENC + N_DEC)
    cross_ref = dict(
        attentions={N_ENC + j: a for j, a in enumerate(out.cross_attentions)},
        q={(layer, "pre"): qk[(layer, "cross_q")] for layer in decoder_layers},
        k={(layer, "pre"): qk[(layer, "cross_k")] for layer in decoder_layers},
        d=config.d_kv,
        scaling={layer: 1.0 for layer in decoder_layers},
        resid=[],
    )
    assert torch.equal(out.encoder_last_hidden_state, norms["enc"][1])
    return self_ref, cross_ref


#: ByT5 is T5 v1.1 on bytes: a gated-GELU feed-forward and an untied LM head (its tokenizer gives byte ids + 3)
BYT5 = {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize(("head", "variant"), [("lm", {}), ("base", {}), ("lm", BYT5)])
def test_t5_matches_eager_reference(tmp_path, head, variant):
    """Encoder, decoder and cross-attention statistics, residual stream and norms, with padding and mini-batches of
    2, against eager T5 and a ByT5-shaped model (unscaled scores plus the relative position bias)."""
    cls = transformers.T5ForConditionalGeneration if head == "lm" else transformers.T5Model
    path = saved(tmp_path, cls, t5_config(**variant), "t5")
    batch = padded_batch()
    tables, loaded = run_extract(path, batch)
    self_ref, cross_ref = t5_reference(path, batch)
    decoder = set(range(N_ENC, N_ENC + N_DEC))
    check_all(tables, self_ref, batch, causal=decoder)
    check_all(tables, cross_ref, batch, causal=False, qk_name="cross_qk", attention_name="cross_attention")
    assert sorted(tables["attention"]["layer"].unique()) == list(range(N_ENC + N_DEC))
    assert sorted(tables["cross_attention"]["layer"].unique()) == sorted(decoder)
    assert sorted(tables["hidden_stats"].filter(pl.col("site") == "resid")["layer"]) == list(range(N_ENC + N_DEC + 1))


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
def test_t5_relative_bias_and_unscaled_scores_matter(tmp_path):
    """The score statistics are those of q.k + bias: leaving the bias out, or scaling by 1/sqrt(d_head), would
    give other numbers (so the reference check above is not vacuous)."""
    path = saved(tmp_path, transformers.T5Model, t5_config(), "t5")
    batch = padded_batch()
    tables, _ = run_extract(path, batch)
    self_ref, _ = t5_reference(path, batch)
    valid = batch["attention_mask"].bool()
    q, k = self_ref["q"][(0, "pre")], self_ref["k"][(0, "pre")]
    plain = (q @ k.transpose(-1, -2))[:, 0][valid[:, :, None] & valid[:, None, :]]
    row = tables["attention"].filter((pl.col("layer") == 0) & (pl.col("head") == 0)).row(0, named=True)
    assert abs(row["score_mean"] - plain.mean().item()) > 1e-3
    assert abs(row["score_std"] - (plain / np.sqrt(q.shape[-1])).std(unbiased=False).item()) > 1e-3


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
def test_t5_chunked_attention_matches_eager_reference(tmp_path, monkeypatch):
    """Tiny chunks and causal row blocks (the bias sliced with them), mini-batches of 3."""
    monkeypatch.setattr(attention_torch, "CHUNK_ELEMENTS", 150)
    monkeypatch.setattr(attention_torch, "ROW_BLOCKS", 3)
    monkeypatch.setattr(attention_torch, "MIN_ROW_BLOCK", 5)
    path = saved(tmp_path, transformers.T5Model, t5_config(), "t5")
    batch = padded_batch()
    tables, _ = run_extract(path, batch, batch_size=3)
    self_ref, cross_ref = t5_reference(path, batch)
    check_all(tables, self_ref, batch, causal=set(range(N_ENC, N_ENC + N_DEC)))
    check_all(tables, cross_ref, batch, causal=False, qk_name="cross_qk", attention_name="cross_attention")


def test_t5_refuses_left_padding(tmp_path):
    path = saved(tmp_path, transformers.T5Model, t5_config(), "t5")
    batch = padded_batch()
    batch = {key: value.flip(1) for key, value in batch.items()}
    with pytest.raises(ValueError, match="right padding"):
        run_extract(path, batch)


SEEN = []


@stream_measure(sites=["attention_probs", "ln_embed_in"])
class Probe:
    """Keeps what it is fed, with its Site (a test's probe)."""

    def __init__(self, site):
        self.site = site

    def update(self, x, valid):
        SEEN.append((self.site, x.clone(), valid.clone()))

    def merge(self, other):
        pass

    def finalize(self):
        return [{"metric": "seen", "value": 1.0}]


def streamed(path, batch):
    SEEN.clear()
    loaded = load_model(path, device="cpu")
    stream = StreamMeasures([measure_of(Probe, "test_encoder_decoder:Probe")], loaded.geometry, "test/m/step3")
    run(loaded, batch, ExtractSettings(batch_size=5, sample_tokens=10_000, device="cpu"), progress=False, stream=stream)
    return list(SEEN)


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
def test_stream_measures_see_t5_self_attention_as_eager_does(tmp_path):
    """A stream measure's attention_probs in T5 are eager's (bias added, decoder causal), and it sees no
    cross-attention; its Site says which layers are causal."""
    path = saved(tmp_path, transformers.T5Model, t5_config(), "t5")
    batch = padded_batch()
    seen = streamed(path, batch)
    self_ref, _ = t5_reference(path, batch)
    probs = [(site, x) for site, x, _ in seen if site.name == "attention_probs"]
    assert [site.layer for site, _ in probs] == list(range(N_ENC + N_DEC))
    valid = batch["attention_mask"].bool()
    for site, x in probs:
        assert site.causal == (site.layer >= N_ENC) and site.scaling == 1.0
        eager = self_ref["attentions"][site.layer]
        torch.testing.assert_close(x.transpose(1, 2)[valid], eager.transpose(1, 2)[valid], atol=1e-5, rtol=1e-5)


def test_stream_measures_see_albert_embedding_at_its_own_width(tmp_path):
    path = saved(tmp_path, transformers.AlbertModel, albert_config(), "albert")
    seen = streamed(path, padded_batch())
    embed = [(site, x) for site, x, _ in seen if site.name == "ln_embed_in"]
    assert embed and all(site.d_model == 16 == x.shape[-1] for site, x in embed)
