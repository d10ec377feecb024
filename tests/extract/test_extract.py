"""extract's statistics against an independent computation from an eager model and the raw weights."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
import transformers

from anisweep.adapters import UnsupportedArchitecture
from anisweep.extract import attention_torch
from anisweep.extract import tables as extract_tables
from anisweep.extract.model import DTYPES, ExtractSettings, load_model
from anisweep.extract.recorder import SAMPLED_SITES
from anisweep.extract.run import run
from anisweep.extract.streaming import VisibleKeys
from anisweep.tables import ATTENTION_STATISTICS, EXTRACT_SCHEMAS, IDENTITY, IDENTITY_SCHEMA

from conftest import (
    albert_config,
    bert_config,
    gpt2_config,
    llama_config,
    neox_config,
    olmo2_config,
    olmo_config,
    padded_batch,
    roberta_config,
    run_extract,
    saved,
)

TOL = 1e-5


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x, rot_dims, base):
    """Pythia's rotary on the first rot_dims dims of each head, written from the definition."""
    t = x.shape[-2]
    inv_freq = 1.0 / (base ** (torch.arange(0, rot_dims, 2, dtype=torch.float64) / rot_dims))
    freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().float(), emb.sin().float()
    x_rot, x_pass = x[..., :rot_dims], x[..., rot_dims:]
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)


def heads(x, n):
    b, t, _ = x.shape
    return x.view(b, t, n, -1).transpose(1, 2)


def final_norm(model, kind):
    return {
        "bert": lambda: model.encoder.layer[-1].output.LayerNorm,
        "roberta": lambda: model.encoder.layer[-1].output.LayerNorm,
        # ALBERT's shared block: the hook fires once per application, the last one is kept
        "albert": lambda: model.encoder.albert_layer_groups[0].albert_layers[0].full_layer_layer_norm,
        "gpt_neox": lambda: model.final_layer_norm,
        "gpt2": lambda: model.ln_f,
    }.get(kind, lambda: model.norm)()


def decoder_qk(model, kind, layer, h, config):
    """{rope: (q, k)} of one block recomputed from its input h and the weights, as (B, heads, T, d_head)."""
    n_q = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_q
    d = config.hidden_size // n_q
    if kind == "gpt_neox":
        block = model.layers[layer]
        b, t, _ = h.shape
        qkv = block.attention.query_key_value(block.input_layernorm(h)).view(b, t, n_q, 3 * d).transpose(1, 2)
        out = {"pre": (qkv[..., :d], qkv[..., d : 2 * d])}
    elif kind == "gpt2":
        block = model.h[layer]
        q, k, _ = block.attn.c_attn(block.ln_1(h)).split(config.hidden_size, dim=2)  # [Q | K | V] thirds
        return {"pre": (heads(q, n_q), heads(k, n_q))}
    else:
        attn = model.layers[layer].self_attn
        x = h if kind == "olmo2" else model.layers[layer].input_layernorm(h)
        q, k = attn.q_proj(x), attn.k_proj(x)
        if kind == "olmo" and config.clip_qkv is not None:
            q, k = q.clamp(-config.clip_qkv, config.clip_qkv), k.clamp(-config.clip_qkv, config.clip_qkv)
        out = {}
        if kind == "olmo2":
            out["pre_norm"] = (heads(q, n_q), heads(k, n_kv))
            q, k = attn.q_norm(q), attn.k_norm(k)
        out["pre"] = (heads(q, n_q), heads(k, n_kv))
    rot = int(d * config.rope_parameters.get("partial_rotary_factor", 1.0))
    theta = config.rope_parameters["rope_theta"]
    out["post"] = tuple(apply_rotary(x, rot, theta) for x in out["pre"])
    return out


def n_layers(config):
    return config.num_hidden_layers * getattr(config, "inner_group_num", 1)


@torch.no_grad()
def reference(path, batch, kind):
    """Eager model with output_attentions / output_hidden_states, and q, k recomputed from the weights."""
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    config = model.config
    n_heads, d = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    captured = {}
    handle = final_norm(model, kind).register_forward_hook(lambda m, a, o: captured.update(ln_in=a[0], ln_out=o))
    out = model(**batch, output_attentions=True, output_hidden_states=True)
    handle.remove()
    assert len(out.attentions) == len(out.hidden_states) - 1 == n_layers(config)  # eager gave every map
    b, t = batch["input_ids"].shape
    qs, ks = {}, {}
    scaling = [d**-0.5] * config.num_hidden_layers
    for layer in range(config.num_hidden_layers):
        h = out.hidden_states[layer]
        if kind in ENCODERS:
            att = (
                model.encoder.albert_layer_groups[0].albert_layers[0].attention
                if kind == "albert"
                else model.encoder.layer[layer].attention.self
            )
            q = att.query(h).view(b, t, n_heads, d).transpose(1, 2)
            k = att.key(h).view(b, t, n_heads, d).transpose(1, 2)
            qs[(layer, "pre")], ks[(layer, "pre")] = q, k
            continue
        for rope, (q, k) in decoder_qk(model, kind, layer, h, config).items():
            qs[(layer, rope)], ks[(layer, rope)] = q, k
        if kind == "gpt2" and config.scale_attn_by_inverse_layer_idx:
            scaling[layer] /= layer + 1
    resid = list(out.hidden_states)
    if kind not in ENCODERS:
        resid[-1] = captured["ln_in"]  # transformers' last entry is after the final norm
    return dict(
        attentions=out.attentions,
        q=qs,
        k=ks,
        resid=resid,
        ln_in=captured["ln_in"],
        ln_out=captured["ln_out"],
        d=d,
        scaling=scaling,
    )


def check_all(tables, ref, batch, causal, qk_name="qk", attention_name="attention"):
    """Every table against the reference `ref`. `causal`: a bool, or the causal layers (T5's decoder); `ref` may
    hold `attentions` as a dict by layer, `bias` (layer: the score bias the softmax adds, T5's relative
    positions) and `extra` ((layer, site, x): hidden_stats sites beyond resid and final_ln)."""
    valid = batch["attention_mask"].bool()
    b, t = valid.shape
    padding = valid[:, None, :].expand(b, t, t)
    causal_mask = padding & torch.ones(t, t, dtype=torch.bool).tril()
    is_causal = (lambda layer: layer in causal) if not isinstance(causal, bool) else (lambda layer: causal)
    qk = tables[qk_name]
    for (layer, rope), q in ref["q"].items():
        k = ref["k"][(layer, rope)]
        group = q.shape[1] // k.shape[1]  # grouped-query attention: query head h attends with key head h // group
        for head in range(q.shape[1]):
            row = qk.filter((pl.col("layer") == layer) & (pl.col("head") == head) & (pl.col("rope") == rope)).row(
                0, named=True
            )
            assert row["kv_head"] == head // group
            qv, kv = q[:, head][valid].double(), k[:, head // group][valid].double()
            np.testing.assert_allclose(row["q_mean"], qv.mean(0).numpy(), atol=TOL)
            np.testing.assert_allclose(row["k_mean"], kv.mean(0).numpy(), atol=TOL)
            np.testing.assert_allclose(row["q_norm_mean"], qv.norm(dim=-1).mean().item(), rtol=TOL)
            cos = torch.nn.functional.cosine_similarity(qv.mean(0), kv.mean(0), dim=0).item()
            assert row["qk_cos"] == pytest.approx(cos, abs=TOL)
            assert row["qk_mean_score"] == pytest.approx((qv.mean(0) @ kv.mean(0)).item() / ref["d"] ** 0.5, abs=TOL)
            assert row["n_tokens"] == int(valid.sum())
    assert set(qk["rope"].unique()) == {rope for _, rope in ref["q"]}
    assert qk.height == len(ref["q"]) * next(iter(ref["q"].values())).shape[1]

    scores_rope = "post" if (0, "post") in ref["q"] else "pre"
    attention = tables[attention_name]
    attentions = ref["attentions"]
    for layer, probs in attentions.items() if isinstance(attentions, dict) else enumerate(attentions):
        allowed = causal_mask if is_causal(layer) else padding
        q, k = ref["q"][(layer, scores_rope)], ref["k"][(layer, scores_rope)]
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        scores = (q @ k.transpose(-1, -2)) * ref["scaling"][layer]
        if layer in ref.get("bias", {}):
            scores = scores + ref["bias"][layer]
        for head in range(probs.shape[1]):
            rows = {n: [] for n in ("entropy", "entropy_norm", "p_max", "p_median", "p_min")}
            pair_scores = []
            for s in range(b):
                for i in range(t):
                    if not valid[s, i]:
                        continue
                    vis = allowed[s, i]
                    p = probs[s, head, i][vis].double().numpy()
                    assert p.sum() == pytest.approx(1.0, abs=1e-5)
                    h = -(p * np.log(p)).sum()
                    rows["entropy"].append(h)
                    if len(p) > 1:
                        rows["entropy_norm"].append(h / np.log(len(p)))
                    rows["p_max"].append(p.max())
                    rows["p_median"].append(np.median(p))
                    rows["p_min"].append(p.min())
                    pair_scores += scores[s, head, i][vis].tolist()
            row = attention.filter((pl.col("layer") == layer) & (pl.col("head") == head)).row(0, named=True)
            for name, values in rows.items():
                assert row[f"{name}_mean"] == pytest.approx(np.mean(values), abs=TOL), name
            assert row["score_mean"] == pytest.approx(np.mean(pair_scores), abs=TOL)
            assert row["score_std"] == pytest.approx(np.std(pair_scores), abs=TOL)

    if "ln_in" not in ref:  # attention only (T5's cross-attention)
        return
    stats, hidden = tables["hidden_stats"], tables["hidden"]
    sites = [(layer, "resid", x) for layer, x in enumerate(ref["resid"])]
    n_blocks = len(ref["resid"]) - 1
    sites += [(n_blocks, "final_ln_in", ref["ln_in"]), (n_blocks, "final_ln_out", ref["ln_out"])]
    sites += ref.get("extra", [])
    for layer, site, x in sites:
        xv = x[valid].double()
        row = stats.filter((pl.col("layer") == layer) & (pl.col("site") == site)).row(0, named=True)
        assert row["n"] == xv.shape[0]
        np.testing.assert_allclose(row["sum_x"], xv.sum(0).numpy(), rtol=TOL, atol=TOL * xv.shape[0])
        unit = xv / xv.norm(dim=-1, keepdim=True)
        np.testing.assert_allclose(row["sum_unit"], unit.sum(0).numpy(), atol=TOL * xv.shape[0])
        assert row["sum_norm"] == pytest.approx(xv.norm(dim=-1).sum().item(), rel=TOL)
        brute_avg_cos = ((unit @ unit.T).sum() - xv.shape[0]) / (xv.shape[0] * (xv.shape[0] - 1))
        s = np.asarray(row["sum_unit"])
        assert (s @ s - row["n"]) / (row["n"] * (row["n"] - 1)) == pytest.approx(brute_avg_cos.item(), abs=TOL)
        if site not in SAMPLED_SITES:
            continue
        sample = hidden.filter((pl.col("layer") == layer) & (pl.col("site") == site)).sort("seq", "position")
        assert sample.height == xv.shape[0]  # sample_tokens exceeds the batch: every valid token is kept
        kept = np.stack(sample["vector"].to_list())
        expected = x[
            torch.from_numpy(sample["seq"].to_numpy(writable=True)),
            torch.from_numpy(sample["position"].to_numpy(writable=True)),
        ].numpy()
        np.testing.assert_allclose(kept, expected, atol=TOL)


ENCODERS = ("bert", "roberta", "albert")  # post-LayerNorm, bidirectional: the last hidden state is final_ln's output

ARCHS = {  # kind: the model with its head, the base model, its config
    "bert": (transformers.BertForMaskedLM, transformers.BertModel, bert_config),
    "roberta": (transformers.RobertaForMaskedLM, transformers.RobertaModel, roberta_config),
    "albert": (transformers.AlbertForMaskedLM, transformers.AlbertModel, albert_config),
    "gpt_neox": (transformers.GPTNeoXForCausalLM, transformers.GPTNeoXModel, neox_config),
    "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Model, gpt2_config),
    "llama": (transformers.LlamaForCausalLM, transformers.LlamaModel, llama_config),
    "olmo": (transformers.OlmoForCausalLM, transformers.OlmoModel, olmo_config),
    "olmo2": (transformers.Olmo2ForCausalLM, transformers.Olmo2Model, olmo2_config),
}


@pytest.mark.parametrize("head", ["lm", "base"])
@pytest.mark.parametrize("kind", sorted(ARCHS))
def test_every_architecture_matches_eager_reference(tmp_path, kind, head):
    """BERT, GPT-NeoX (partial rotary), GPT-2 (Conv1D [Q|K|V], 1/(layer+1) scaling), Llama (RMSNorm,
    grouped-query attention), OLMo (weightless LayerNorm, clip_qkv) and OLMo 2 (q/k norms, post-sublayer norms),
    with their heads and without, against eager attention and the weights."""
    lm, base, config = ARCHS[kind]
    path = saved(tmp_path, lm if head == "lm" else base, config(), kind)
    batch = padded_batch()
    tables, _ = run_extract(path, batch)
    check_all(tables, reference(path, batch, kind), batch, causal=kind not in ENCODERS)


def test_grouped_query_attention_rows_share_their_key_head(tmp_path):
    path = saved(tmp_path, transformers.LlamaModel, llama_config(), "llama")
    tables, loaded = run_extract(path, padded_batch())
    assert loaded.geometry.kv_heads == 2 and loaded.geometry.group == 2
    qk = tables["qk"].filter(pl.col("rope") == "post").sort("layer", "head")
    assert qk["kv_head"].to_list() == [0, 0, 1, 1] * 2
    k = np.stack(qk["k_mean"].to_list()).reshape(2, 2, 2, -1)  # layer, key head, query head in group, d_head
    np.testing.assert_array_equal(k[:, :, 0], k[:, :, 1])
    assert np.abs(k[:, 0, 0] - k[:, 1, 0]).max() > 1e-4  # the two key heads differ


def test_olmo_clip_is_applied_before_the_pre_rotary_means(tmp_path):
    """clip_qkv clamps q_proj's output in place after a forward hook has read it: the pre-rotary means must be
    the clamped ones (the reference clamps too), and differ from the unclamped ones."""
    path = saved(tmp_path, transformers.OlmoModel, olmo_config(clip_qkv=0.05), "olmo")
    clipped, _ = run_extract(path, padded_batch())
    unclipped_path = saved(tmp_path, transformers.OlmoModel, olmo_config(clip_qkv=None), "olmo_noclip")
    unclipped, _ = run_extract(unclipped_path, padded_batch())
    pre = lambda t: np.stack(t["qk"].filter(pl.col("rope") == "pre").sort("layer", "head")["q_mean"].to_list())  # noqa: E731
    assert np.abs(pre(clipped)).max() <= 0.05 + 1e-6
    assert np.abs(pre(unclipped)).max() > 0.05


@pytest.mark.parametrize("kind", ["olmo", "olmo2", "llama"])
def test_norm_parameters_are_recorded_as_they_exist(tmp_path, kind):
    """LayerNorm without parameters (OLMo): gain, bias and eps null; RMSNorm: gain and eps, no bias."""
    lm, _, config = ARCHS[kind]
    path = saved(tmp_path, lm, config(), kind)
    tables, loaded = run_extract(path, padded_batch())
    ln = tables["layernorm"].sort("layer", "site")
    sites = {"olmo": {"ln_attn", "ln_mlp"}, "llama": {"ln_attn", "ln_mlp"}, "olmo2": {"ln_attn_post", "ln_mlp_post"}}
    assert set(ln["site"]) == sites[kind] | {"final_ln"}
    assert ln["bias"].is_null().all()
    if kind == "olmo":
        assert ln["gain"].is_null().all() and ln["eps"].is_null().all()
    else:
        final = ln.filter(pl.col("site") == "final_ln").row(0, named=True)
        np.testing.assert_allclose(final["gain"], loaded.base.norm.weight.detach().numpy())
        assert final["eps"] == loaded.model.config.rms_norm_eps


def test_pre_and_post_rotary_means_differ_only_on_rotary_dims(tmp_path):
    path = saved(tmp_path, transformers.GPTNeoXModel, neox_config(), "neox")
    tables, parts = run_extract(path, padded_batch())
    rot = parts.geometry.rotary_dims
    qk = tables["qk"].sort("layer", "head")
    pre = np.stack(qk.filter(pl.col("rope") == "pre")["q_mean"].to_list())
    post = np.stack(qk.filter(pl.col("rope") == "post")["q_mean"].to_list())
    np.testing.assert_allclose(pre[:, rot:], post[:, rot:], atol=1e-6)
    assert np.abs(pre[:, :rot] - post[:, :rot]).max() > 1e-4


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
def test_sample_is_seeded_and_sized(tmp_path):
    path = saved(tmp_path, transformers.BertModel, bert_config(), "bert")
    batch = padded_batch()
    first, _ = run_extract(path, batch, sample_tokens=9, seed=4)
    again, _ = run_extract(path, batch, sample_tokens=9, seed=4)
    other, _ = run_extract(path, batch, sample_tokens=9, seed=5)
    resid0 = lambda t: t["hidden"].filter((pl.col("layer") == 0) & (pl.col("site") == "resid"))  # noqa: E731
    assert resid0(first).height == 9
    assert resid0(first).select("seq", "position").equals(resid0(again).select("seq", "position"))
    assert not resid0(first).select("seq", "position").equals(resid0(other).select("seq", "position"))
    valid = batch["attention_mask"].bool()
    assert all(valid[s, p] for s, p in resid0(first).select("seq", "position").iter_rows())


@pytest.mark.parametrize("score_bins", [None, {"low": -4.0, "high": 4.0, "n": 6}])
def test_every_table_has_the_schema_of_tables_py(tmp_path, score_bins):
    """anisweep.tables is the one schema: every table extract builds has exactly its columns, in order, and types."""
    path = saved(tmp_path, transformers.GPTNeoXForCausalLM, neox_config(), "neox")
    tables, _ = run_extract(path, padded_batch(), score_bins=score_bins)
    assert list(tables) == list(EXTRACT_SCHEMAS)
    for name, df in tables.items():
        assert dict(df.schema) == {**IDENTITY_SCHEMA, **EXTRACT_SCHEMAS[name]}, name


def test_identity_columns_and_embeddings(tmp_path):
    path = saved(tmp_path, transformers.GPTNeoXForCausalLM, neox_config(), "neox")
    tables, _ = run_extract(path, padded_batch())
    for name, df in tables.items():
        assert df.columns[:5] == list(IDENTITY), name
        assert df["step"].unique().to_list() == ([] if df.is_empty() else [3]), name  # score_hist: off by default
    emb = tables["embeddings"]
    assert set(emb["matrix"]) == {"embed_in", "embed_out"}
    assert not emb["tied"].any()
    assert emb["value"].is_between(0, 1).all()
    ln = tables["layernorm"].filter(pl.col("site") == "final_ln").row(0, named=True)
    assert len(ln["gain"]) == 32 and len(ln["bias"]) == 32


def test_unknown_architecture_names_supported_ones(tmp_path):
    config = transformers.OPTConfig(
        hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=32, vocab_size=20
    )
    transformers.OPTModel(config).save_pretrained(tmp_path / "opt")
    with pytest.raises(UnsupportedArchitecture, match="BertForMaskedLM.*GPT2LMHeadModel.*LlamaForCausalLM.*Olmo2"):
        load_model(tmp_path / "opt")


def full_batch(n=5, t=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(5, 60, (n, t), generator=g),
        "attention_mask": torch.ones(n, t, dtype=torch.long),
    }


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize("kind", ["bert", "gpt_neox", "llama", "olmo2", "albert"])
@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_chunks_row_blocks_and_workers_match_eager_reference(tmp_path, monkeypatch, kind, padded, threads):
    """Tiny chunks (one head, or several sequences), causal row blocks of 5 rows and the worker pool
    (forced on) give the statistics of the eager reference."""
    monkeypatch.setattr(attention_torch, "CHUNK_ELEMENTS", 150)  # < one head's 12 x 12 scores for the first rows
    monkeypatch.setattr(attention_torch, "ROW_BLOCKS", 3)
    monkeypatch.setattr(attention_torch, "MIN_ROW_BLOCK", 5)
    monkeypatch.setattr(attention_torch.Workers, "MIN_TASKS_PER_THREAD", 1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _, cls, config = ARCHS[kind]
        path = saved(tmp_path, cls, config(), kind)
        batch = padded_batch() if padded else full_batch()
        tables, _ = run_extract(path, batch, batch_size=3)
        assert torch.get_num_threads() == threads  # the pool leaves the job's thread count as it was
    finally:
        torch.set_num_threads(before)
    check_all(tables, reference(path, batch, kind), batch, causal=kind not in ENCODERS)


def test_many_sequences_per_chunk_match_eager_reference(tmp_path, monkeypatch):
    monkeypatch.setattr(attention_torch, "CHUNK_ELEMENTS", 4 * 12 * 12 * 3)  # three whole sequences per chunk
    path = saved(tmp_path, transformers.BertModel, bert_config(), "bert")
    batch = full_batch(n=7)
    tables, _ = run_extract(path, batch, batch_size=7)
    check_all(tables, reference(path, batch, "bert"), batch, causal=False)


@pytest.mark.parametrize("chunk_elements", [12 * 12, 4 * 12 * 12 * 3])  # one head; three whole sequences
def test_torch_attention_output_is_stored_as_the_model_reads_it(monkeypatch, chunk_elements):
    """attend's output (B, H, T, d_v) is stored as (B, T, H, d_v), so that the model's `.contiguous()` copies
    nothing, and is float64 softmax attention's, in one-sequence chunks (written in place by bmm's out=) and in
    chunks of several sequences (copied there)."""
    monkeypatch.setattr(attention_torch, "CHUNK_ELEMENTS", chunk_elements)
    g = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(7, 4, 12, 8, generator=g) for _ in range(3))
    blocks = [(slice(0, 12), [VisibleKeys.build(torch.zeros(12, 12, dtype=torch.bool))])]
    output, _, _ = attention_torch.attend(
        query, key, value, 8**-0.5, blocks, True, attention_torch.Workers(1), attention_torch.Scratch()
    )
    assert output.transpose(1, 2).is_contiguous()
    expected = torch.softmax(query.double() @ key.double().transpose(-1, -2) * 8**-0.5, dim=-1) @ value.double()
    np.testing.assert_allclose(output.double().numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "cls, config", [(transformers.BertModel, bert_config), (transformers.GPTNeoXModel, neox_config)]
)
def test_bfloat16_statistics_close_to_float32(tmp_path, cls, config):
    """bf16 weights and activations (accumulators stay float64) on CPU, for both architectures."""
    path = saved(tmp_path, cls, config(), "model")
    batch = padded_batch()
    ident = {"family": "test", "model": "m", "seed": 0, "step": 3, "tokens_seen": 30}
    out = {}
    for dtype in ("float32", "bfloat16"):
        settings = ExtractSettings(batch_size=2, sample_tokens=10_000, device="cpu", dtype=dtype)
        parts = load_model(path, dtype, "cpu")
        assert next(parts.model.parameters()).dtype == DTYPES[dtype]
        out[dtype] = extract_tables.tables(run(parts, batch, settings, progress=False), parts, ident)
    f32, bf16 = out["float32"], out["bfloat16"]
    for name in ATTENTION_STATISTICS:
        np.testing.assert_allclose(bf16["attention"][name], f32["attention"][name], atol=1e-2, rtol=2e-2, err_msg=name)
    np.testing.assert_allclose(bf16["qk"]["qk_cos"], f32["qk"]["qk_cos"], atol=2e-2)
    np.testing.assert_allclose(bf16["qk"]["q_norm_mean"], f32["qk"]["q_norm_mean"], rtol=2e-2)
    np.testing.assert_allclose(bf16["hidden_stats"]["sum_norm"], f32["hidden_stats"]["sum_norm"], rtol=2e-2)
    assert bf16["hidden_stats"]["n"].to_list() == f32["hidden_stats"]["n"].to_list()
    assert bf16["hidden"]["vector"].dtype == pl.List(pl.Float32)


def test_albert_numbers_its_shared_block_by_application_and_keeps_the_embedding_width(tmp_path):
    """One AlbertLayer applied 3 times gives layers 1..3 (3 distinct rows, not one), q/k rows for blocks 0..2, and the
    embedding LayerNorm is recorded at the embedding size (16), the stream after the projection at 32."""
    path = saved(tmp_path, transformers.AlbertModel, albert_config(), "albert")
    tables, loaded = run_extract(path, padded_batch())
    stats = tables["hidden_stats"]
    width = dict(zip(stats["site"] + stats["layer"].cast(str), stats["d"], strict=True))
    assert width["ln_embed_in0"] == width["ln_embed_out0"] == 16 and width["resid0"] == 32
    assert sorted(stats.filter(pl.col("site") == "resid")["layer"]) == [0, 1, 2, 3]
    assert sorted(tables["qk"]["layer"].unique()) == [0, 1, 2]
    assert set(tables["layernorm"].filter(pl.col("site") == "final_ln")["layer"]) == {3}
    sums = [tuple(r) for r in stats.filter(pl.col("site") == "resid")["sum_x"].to_list()]
    assert len(set(sums)) == 4
