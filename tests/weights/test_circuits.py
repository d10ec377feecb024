"""The built-in weight measure `circuits` against brute force on tiny models of every family: each head's scores
and logits over the whole vocabulary computed through the model's own modules (its norms, its projections run on
the embeddings, its output projection on one head's values at a time, its output embeddings), then every metric
from those full matrices with numpy; and a planted copying, self-attending head that the measure must find."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from transformers import (
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXForCausalLM,
    LlamaForCausalLM,
    Olmo2ForCausalLM,
    OlmoForCausalLM,
    T5ForConditionalGeneration,
)

from anisweep.checkpoints.base import Checkpoint
from anisweep.measures.circuits import circuit_tables
from anisweep.measures.registry import MeasureError, measure_of, weight_measure
from anisweep.weights.run import open_weights, run_weight_measure

from conftest import (
    bert_config,
    gpt2_config,
    llama_config,
    neox_config,
    olmo2_config,
    olmo_config,
    saved,
    t5_config,
)

FAMILIES = {
    "bert": (BertForMaskedLM, bert_config, True),
    "gpt_neox": (GPTNeoXForCausalLM, neox_config, False),
    "llama": (LlamaForCausalLM, llama_config, False),
    "olmo": (OlmoForCausalLM, olmo_config, False),
    "olmo2": (Olmo2ForCausalLM, olmo2_config, False),
    "gpt2": (GPT2LMHeadModel, gpt2_config, True),
}


def checkpoint(path) -> Checkpoint:
    return Checkpoint(family="local", model="m", step=3, tokens_seen=30, seed=0, path=str(path))


def zero_biases(model):
    model = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") and ("attn" in name or "attention" in name):
                p.zero_()
    return model


def parts(model, family: str, layer: int):
    """(norm before the attention, q/k/v of a batch as (V, heads, d_head) each, the output projection, the
    final norm's gain) through the model's own modules."""
    c = model.config
    if family == "bert":
        block = model.bert.encoder.layer[layer].attention
        norm = model.bert.embeddings.LayerNorm if layer == 0 else model.bert.encoder.layer[layer - 1].output.LayerNorm
        proj = (block.self.query, block.self.key, block.self.value)
        return (
            norm,
            lambda x: [m(x) for m in proj],
            block.output.dense,
            model.cls.predictions.transform.LayerNorm.weight,
        )
    if family == "gpt_neox":
        block = model.gpt_neox.layers[layer]
        h, dh = c.num_attention_heads, c.hidden_size // c.num_attention_heads

        def qkv(x):
            return [
                t.reshape(len(x), -1) for t in block.attention.query_key_value(x).view(len(x), h, 3 * dh).split(dh, -1)
            ]

        return block.input_layernorm, qkv, block.attention.dense, model.gpt_neox.final_layer_norm.weight
    if family == "gpt2":
        block = model.transformer.h[layer]
        return (
            block.ln_1,
            lambda x: list(block.attn.c_attn(x).split(c.n_embd, -1)),
            block.attn.c_proj,
            model.transformer.ln_f.weight,
        )
    block = model.model.layers[layer]
    attn = block.self_attn
    rep = c.num_attention_heads // (c.num_key_value_heads or c.num_attention_heads)
    dh = c.hidden_size // c.num_attention_heads

    def expand(t):  # key/value heads repeated for the query heads that share them, as transformers' repeat_kv
        return t.view(len(t), -1, dh).repeat_interleave(rep, 1).reshape(len(t), -1)

    if family == "olmo2":
        eps = c.rms_norm_eps

        def norm(x):
            return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)

        def qkv(x):
            return [
                attn.q_proj(x) * attn.q_norm.weight,
                expand(attn.k_proj(x) * attn.k_norm.weight),
                expand(attn.v_proj(x)),
            ]

        return norm, qkv, attn.o_proj, model.model.norm.weight
    final = getattr(model.model.norm, "weight", None)
    qkv = lambda x: [attn.q_proj(x), expand(attn.k_proj(x)), expand(attn.v_proj(x))]  # noqa: E731
    return block.input_layernorm, qkv, attn.o_proj, final


def mid_rank(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of scores, the keys scoring above its own (the diagonal) and those tied with it, itself left out."""
    own = np.diag(s)[:, None]
    return (s > own).sum(1), (s == own).sum(1) - 1


def brute(model, family: str, headless: bool = False) -> dict:
    """{(layer, head): metrics} from the full vocabulary x vocabulary matrices; `headless`: read through the input
    embeddings without the final norm's gain, as a BERT saved without its MLM head is."""
    model = zero_biases(model).double().eval()
    c = model.config
    n_layers, n_heads = c.num_hidden_layers, c.num_attention_heads
    d = c.hidden_size
    dh = d // n_heads
    out = {}
    with torch.no_grad():
        e = model.get_input_embeddings().weight
        u = model.get_output_embeddings().weight
        for layer in range(n_layers):
            norm, qkv, o_proj, gain = parts(model, family, layer)
            ug = e if headless else u * gain if gain is not None else u
            x = norm(e)
            q, k, v = (t.view(len(x), n_heads, dh) for t in qkv(x))
            eye_q, eye_k, eye_v = (t.view(d, n_heads, dh) for t in qkv(torch.eye(d, dtype=torch.float64)))
            bias = o_proj(torch.zeros(1, d, dtype=torch.float64))
            for h in range(n_heads):
                s = (q[:, h] @ k[:, h].T / np.sqrt(dh)).numpy()
                z = torch.zeros(len(x), n_heads, dh, dtype=torch.float64)
                z[:, h] = v[:, h]
                writes = o_proj(z.reshape(len(x), d)) - bias
                logits = (writes @ ug.T).numpy()  # (input, output)
                w_qk = (eye_q[:, h] @ eye_k[:, h].T).numpy()  # x^T W_QK y
                ze = torch.zeros(d, n_heads, dh, dtype=torch.float64)
                ze[:, h] = eye_v[:, h]
                w_ov_t = (o_proj(ze.reshape(d, d)) - bias).numpy()  # row i: the write of e_i
                above, tied = mid_rank(s)
                eig = np.linalg.eigvals(logits.T)  # the OV circuit: output x input
                out[(layer, h)] = {
                    "qk_self_rank": (above + tied / 2).mean() / (len(s) - 1),
                    "qk_self_top": np.where(above == 0, 1 / (tied + 1), 0.0).mean(),
                    "qk_symmetric_share": (((w_qk + w_qk.T) / 2) ** 2).sum() / (w_qk**2).sum(),
                    "ov_copying": (logits.argmax(1) == np.arange(len(logits))).mean(),
                    "ov_positive_eigen": eig.real.sum() / np.abs(eig).sum(),
                    "qk_sv": np.linalg.svd(w_qk, compute_uv=False)[:dh],
                    "ov_sv": np.linalg.svd(w_ov_t, compute_uv=False)[:dh],
                    "qk_top": top_rows(s),
                    "ov_top": top_rows(logits),
                }
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_circuits_match_brute_force(tmp_path, family):
    cls, config, tied = FAMILIES[family]
    path = saved(tmp_path, cls, config(), family)
    model = cls.from_pretrained(path)
    weights = open_weights(checkpoint(path))
    rows, pairs = circuit_tables(weights)
    expected = brute(model, family)
    got = {(r.get("layer"), r.get("head"), r["metric"], r.get("rank")): r["value"] for r in rows}
    assert got[(None, None, "tied_embeddings", None)] == float(tied)
    assert got[(None, None, "probe_tokens", None)] == model.config.vocab_size
    for (layer, head), want in expected.items():
        for metric in ("qk_self_rank", "qk_self_top", "qk_symmetric_share", "ov_copying", "ov_positive_eigen"):
            # the brute eigenvalues of the rank-d_head vocabulary x vocabulary circuit include ~1e-9 noise for its zeros
            tolerance = 1e-6 if metric == "ov_positive_eigen" else 1e-9
            assert got[(layer, head, metric, None)] == pytest.approx(want[metric], abs=tolerance), (layer, head, metric)
        for name in ("qk", "ov"):
            sv = [got[(layer, head, f"{name}_singular_value", r + 1)] for r in range(len(want[f"{name}_sv"]))]
            np.testing.assert_allclose(sv, want[f"{name}_sv"], rtol=1e-9, atol=1e-12)
        for kind in ("qk", "ov"):
            mine = sorted(
                (p["rank"], p["score"], p["src_id"], p["dst_id"])
                for p in pairs
                if (p["layer"], p["head"], p["kind"]) == (layer, head, kind)
            )
            assert [(src, dst) for _, _, src, dst in mine] == [(src, dst) for _, src, dst in want[f"{kind}_top"]]
            np.testing.assert_allclose([m[1] for m in mine], [w[0] for w in want[f"{kind}_top"]], rtol=1e-6)


def test_tied_rows_take_the_mid_rank_and_share_the_top():
    """Issue 43 item 11: a zero normalised embedding scores 0 against every key, a fully tied row; it counted as
    attending most to itself (rank 0). Now ties are broken at random in expectation: the mid-rank, and 1 / (t + 1)
    of a top shared with t others."""
    from anisweep.measures.circuits import qk_head

    g = torch.Generator().manual_seed(0)
    d_model, d_head, n = 16, 4, 12
    q, k = torch.randn(d_head, d_model, generator=g), torch.randn(d_head, d_model, generator=g)
    x = torch.randn(n, d_model, generator=g, dtype=torch.float64)
    x[[3, 7]] = 0.0
    got = qk_head(q.double(), k.double(), x)
    s = ((x @ q.double().T) @ (x @ k.double().T).T).numpy()
    above, tied = mid_rank(s)
    assert (above[3], tied[3]) == (0, n - 1)  # the zero rows: every key ties
    assert got["self_rank"] == pytest.approx((above + tied / 2).mean() / (n - 1), abs=1e-12)
    assert got["self_top"] == pytest.approx(np.where(above == 0, 1 / (tied + 1), 0.0).mean(), abs=1e-12)
    zero = qk_head(q.double(), k.double(), torch.zeros(n, d_model, dtype=torch.float64))
    assert (zero["self_rank"], zero["self_top"]) == (pytest.approx(0.5), pytest.approx(1 / n))


def test_a_bert_saved_without_its_head_reads_w_ov_through_its_tied_embeddings(tmp_path):
    """A BertModel saved alone (no cls.predictions.*, as a sentence-embedding BERT is): every circuit metric, W_OV
    read through the word embeddings (BERT's MLM decoder is tied to them) without the head's transform gain; its
    QK circuits are the whole model's."""
    path = saved(tmp_path, BertForMaskedLM, bert_config(), "bert")
    model = BertForMaskedLM.from_pretrained(path)
    model.bert.save_pretrained(tmp_path / "headless")
    weights = open_weights(checkpoint(tmp_path / "headless"))
    assert not any(name.startswith("cls.") for name in weights.source.names()) and not weights.head_saved
    rows, _ = circuit_tables(weights)
    got = {(r.get("layer"), r.get("head"), r["metric"], r.get("rank")): r["value"] for r in rows}
    assert got[(None, None, "head_saved", None)] == 0.0 and got[(None, None, "tied_embeddings", None)] == 1.0
    expected = brute(model, "bert", headless=True)
    whole = {
        (r.get("layer"), r.get("head"), r["metric"]): r["value"]
        for r in circuit_tables(open_weights(checkpoint(path)))[0]
    }
    assert whole[(None, None, "head_saved")] == 1.0
    for (layer, head), want in expected.items():
        for metric in ("qk_self_rank", "qk_self_top", "qk_symmetric_share", "ov_copying", "ov_positive_eigen"):
            tolerance = 1e-6 if metric == "ov_positive_eigen" else 1e-9
            assert got[(layer, head, metric, None)] == pytest.approx(want[metric], abs=tolerance), (layer, head, metric)
            if metric.startswith("qk"):
                assert got[(layer, head, metric, None)] == whole[(layer, head, metric)]
    gains = model.cls.predictions.transform.LayerNorm.weight
    assert not torch.allclose(gains, torch.ones_like(gains))  # so that the whole model's OV differs: not a no-op


def top_rows(m: np.ndarray, k: int = 5) -> list[tuple[float, int, int]]:
    """The k rows of largest maximum, each with its best column: (value, row, column)."""
    rows = np.argsort(-m.max(1), kind="stable")[:k]
    return [(m[r].max(), int(r), int(m[r].argmax())) for r in rows]


def test_planted_copying_head_is_found(tmp_path):
    """Layer 0 of a one-head GPT-2 made to copy (W_V = W_O = I) and to attend to itself (W_Q = W_K = I), over
    centred unit embeddings and plain LayerNorms: every token attends most to itself and promotes itself, and the
    OV circuit (E E^T) has only non-negative eigenvalues; layer 1, left random, does neither."""
    config = GPT2Config(vocab_size=60, n_embd=32, n_layer=2, n_head=1, n_positions=32)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        e = torch.randn(60, 32)
        e = e - e.mean(1, keepdim=True)
        model.transformer.wte.weight.copy_(e / e.norm(dim=1, keepdim=True))
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
        attn = model.transformer.h[0].attn
        attn.c_attn.weight.copy_(torch.eye(32).repeat(1, 3))
        attn.c_proj.weight.copy_(torch.eye(32))
    model.save_pretrained(tmp_path / "planted")
    rows, _ = circuit_tables(open_weights(checkpoint(tmp_path / "planted")))
    got = {(r.get("layer"), r["metric"]): r["value"] for r in rows if r.get("rank") is None}
    assert got[(0, "qk_self_top")] == 1.0 and got[(0, "qk_self_rank")] == 0.0
    assert got[(0, "ov_copying")] == 1.0
    assert got[(0, "ov_positive_eigen")] == pytest.approx(1.0, abs=1e-9)
    assert got[(0, "qk_symmetric_share")] == pytest.approx(1.0)
    assert got[(1, "ov_copying")] < 0.5 and got[(1, "qk_self_top")] < 0.5


def test_weight_measure_reads_only_the_roles_it_names(tmp_path):
    path = saved(tmp_path, GPTNeoXForCausalLM, neox_config(), "n")

    @weight_measure(tensors=["embedding"])
    def embedding_norm(weights):
        """Mean norm of the token embeddings."""
        return [{"metric": "embedding_norm", "value": float(weights.embedding().norm(dim=1).mean())}]

    @weight_measure(tensors=["embedding"])
    def greedy(weights):
        """Reads the unembedding without declaring it."""
        return [{"metric": "x", "value": float(weights.unembedding().sum())}]

    measure = measure_of(embedding_norm, "test:embedding_norm")
    weights = open_weights(checkpoint(path), measure.tensors)
    df = run_weight_measure(measure, checkpoint(path), weights)
    assert df["measure"].to_list() == ["embedding_norm"] and df["step"].to_list() == [3]
    assert weights.read == ["gpt_neox.embed_in.weight"]
    with pytest.raises(MeasureError, match=r"greedy.*reads 'unembedding' but declares tensors=\['embedding'\]"):
        run_weight_measure(measure_of(greedy, "test:greedy"), checkpoint(path))


def test_a_weight_measure_of_what_a_checkpoint_lacks_writes_the_row_that_says_why(tmp_path, capsys):
    """A BertModel saved alone has no final norm (its MLM head's): a measure reading it gets one NaN row with the
    reason, never a failed job; a measure reading what is there is unaffected; a T5 has no layout at all."""
    BertForMaskedLM.from_pretrained(saved(tmp_path, BertForMaskedLM, bert_config(), "bert")).bert.save_pretrained(
        tmp_path / "headless"
    )

    @weight_measure(tensors=["final_norm"])
    def final_gain(weights):
        """Mean gain of the final norm."""
        return [{"metric": "final_gain", "value": float(weights.final_norm().weight.mean())}]

    @weight_measure(tensors=["embedding"])
    def embedding_norm(weights):
        """Mean norm of the token embeddings."""
        return [{"metric": "embedding_norm", "value": float(weights.embedding().norm(dim=1).mean())}]

    headless = checkpoint(tmp_path / "headless")
    df = run_weight_measure(measure_of(final_gain, "test:final_gain"), headless)
    assert df.select("measure", "metric", "site").rows() == [("final_gain", "final_gain", "weights")]
    assert math.isnan(df["value"][0]) and "saved without its MLM head" in df["reason"][0]
    assert (
        "measure 'final_gain' (test:final_gain) at local/m/step3: bert: the checkpoint was saved"
        in capsys.readouterr().err
    )
    df = run_weight_measure(measure_of(embedding_norm, "test:embedding_norm"), headless)
    assert df["metric"].to_list() == ["embedding_norm"] and df["reason"].to_list() == [None]
    t5 = checkpoint(saved(tmp_path, T5ForConditionalGeneration, t5_config(), "t5"))
    df = run_weight_measure(measure_of(embedding_norm, "test:embedding_norm"), t5)
    assert df["metric"].to_list() == ["embedding_norm"] and "model_type is 't5'" in df["reason"][0]


def test_weight_measure_declaration_errors():
    def bad(weights):
        return []

    with pytest.raises(MeasureError, match=r"tensors=\['W_Q'\]: name the roles"):
        measure_of(weight_measure(tensors=["W_Q"])(bad), "test:bad")
    with pytest.raises(MeasureError, match=r"tensors=\[\]: name the roles"):
        measure_of(weight_measure(bad), "test:bad")


def test_the_docs_weight_measure_example(tmp_path, monkeypatch):
    """docs/measures.md's qk_norm on a grouped-query Llama: each head's ||W_Q^T W_K||_F from its own projections."""
    import sys

    from docs_measures import docs_package

    from anisweep.measures.registry import load

    monkeypatch.syspath_prepend(str(docs_package(tmp_path / "pkg")))
    try:
        measure = load("mymeasures.weights:qk_norm")
        path = saved(tmp_path, LlamaForCausalLM, llama_config(), "llama")
        df = run_weight_measure(measure, checkpoint(path))
    finally:
        for module in [m for m in sys.modules if m == "mymeasures" or m.startswith("mymeasures.")]:
            del sys.modules[module]
    assert (measure.kind, measure.tensors) == ("weight", ("attention",))
    model = LlamaForCausalLM.from_pretrained(path)
    c = model.config
    dh, rep = c.hidden_size // c.num_attention_heads, c.num_attention_heads // c.num_key_value_heads
    got = {(r["layer"], r["head"]): r["value"] for r in df.iter_rows(named=True)}
    for layer, block in enumerate(model.model.layers):
        wq, wk = block.self_attn.q_proj.weight.double(), block.self_attn.k_proj.weight.double()
        for h in range(c.num_attention_heads):
            q, k = wq[h * dh : (h + 1) * dh], wk[(h // rep) * dh : (h // rep + 1) * dh]
            assert got[(layer, h)] == pytest.approx(float(torch.linalg.matrix_norm(q.T @ k)), rel=1e-12)
