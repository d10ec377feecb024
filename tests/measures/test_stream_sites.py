"""What a stream measure sees: the attention maps per head, several sites of one layer together, the model's facts
(causal, score scaling), each against Hugging Face's own eager forward on the same inputs."""

from __future__ import annotations

import sys

import numpy as np
import polars as pl
import pytest
import torch
import transformers
from docs_measures import docs_package
from test_registry import IDENT, write_package

from anisweep.extract.model import ExtractSettings, load_model
from anisweep.extract.run import run
from anisweep.extract.stream_measures import StreamMeasures
from anisweep.measures.registry import load

from conftest import bert_config, gpt2_config, llama_config, neox_config, padded_batch, saved

MODELS = {
    "bert": (transformers.BertModel, bert_config),
    "neox": (transformers.GPTNeoXForCausalLM, neox_config),
    "llama": (transformers.LlamaForCausalLM, llama_config),
    "gpt2": (transformers.GPT2LMHeadModel, gpt2_config),
}


@pytest.fixture
def mymeasures(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(docs_package(tmp_path / "pkg")))
    yield
    for module in [m for m in sys.modules if m == "mymeasures" or m.startswith("mymeasures.")]:
        del sys.modules[module]


def streamed(path, measures, batch, batch_size=2):
    loaded = load_model(path, device="cpu")
    stream = StreamMeasures(measures, loaded.geometry, "test/m/step3")
    settings = ExtractSettings(batch_size=batch_size, sample_tokens=10_000, device="cpu")
    run(loaded, batch, settings, progress=False, stream=stream)
    return stream, loaded


def eager_attentions(path, batch):
    """Hugging Face's eager attention probabilities, one (B, H, T, T) tensor per layer."""
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
    return [a.double() for a in out.attentions]


@pytest.mark.parametrize("kind", ["bert", "neox", "llama"])
def test_the_attention_sink_example_matches_eager_attention(tmp_path, mymeasures, kind):
    """docs/measures.md's together example: sink_mass, the mean probability on the first key over the valid
    queries, from Hugging Face's eager probabilities (grouped-query attention in llama); mini-batches of 2 with
    padding, so merge spans them."""
    cls, config = MODELS[kind]
    path = saved(tmp_path, cls, config(), kind)
    batch = padded_batch()
    measure = load("mymeasures.sinks:AttentionSink")
    assert (measure.kind, measure.together, measure.sites) == ("stream", True, ("q", "k", "attention_probs"))
    stream, _ = streamed(path, [measure], batch)
    rows = stream.tables(IDENT)["measures/attention_sink"]
    assert set(rows["site"]) == {"q+k+attention_probs"}
    valid = batch["attention_mask"].bool()
    for layer, probs in enumerate(eager_attentions(path, batch)):
        expected = (probs[..., 0] * valid[:, None, :]).sum(dim=(0, 2)) / valid.sum()
        got = rows.filter((pl.col("layer") == layer) & (pl.col("metric") == "sink_mass")).sort("head")
        np.testing.assert_allclose(got["value"].to_numpy(), expected.numpy(), rtol=1e-5)


def test_the_sink_examples_query_key_cosine_matches_the_projections(tmp_path, mymeasures):
    """BERT's queries and keys are its query and key projections' outputs (no rotary): the mean cosine of each
    valid query with the first token's key, per head, from hooks outside anisweep's recording."""
    path = saved(tmp_path, transformers.BertModel, bert_config(), "bert")
    batch = padded_batch()
    stream, loaded = streamed(path, [load("mymeasures.sinks:AttentionSink")], batch)
    rows = stream.tables(IDENT)["measures/attention_sink"]
    reference = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    seen = {}
    hooks = [
        module.register_forward_hook(lambda m, a, o, key=(i, name): seen.__setitem__(key, o.detach().double()))
        for i, layer in enumerate(reference.encoder.layer)
        for name, module in (("q", layer.attention.self.query), ("k", layer.attention.self.key))
    ]
    with torch.no_grad():
        reference(**batch)
    for hook in hooks:
        hook.remove()
    g, valid = loaded.geometry, batch["attention_mask"].bool()
    for layer in range(g.n_layers):
        q, k = (seen[(layer, name)].reshape(*batch["input_ids"].shape, g.n_heads, g.d_head) for name in ("q", "k"))
        cos = torch.nn.functional.cosine_similarity(q, k[:, :1], dim=-1)  # (B, T, H)
        expected = cos[valid].mean(0)
        got = rows.filter((pl.col("layer") == layer) & (pl.col("metric") == "sink_qk_cos")).sort("head")
        np.testing.assert_allclose(got["value"].to_numpy(), expected.numpy(), rtol=1e-5, atol=1e-7)


RECORDING = """
import torch

from anisweep.measures.registry import stream_measure

SEEN = []


@stream_measure(sites=["attention_scores", "attention_probs", "resid"])
class Maps:
    '''Keeps what it is fed (a test's probe).'''

    def __init__(self, site):
        self.site = site

    def update(self, x, valid):
        SEEN.append((self.site, x.clone(), valid.clone()))

    def merge(self, other):
        pass

    def finalize(self):
        return [{"metric": "seen", "value": 1.0}]


@stream_measure(sites=["resid", "q", "k"], together=True)
class Together:
    '''Keeps which sites each update got together (a test's probe).'''

    def __init__(self, site):
        self.site = site

    def update(self, x, valid):
        SEEN.append((self.site, sorted(x), None))

    def merge(self, other):
        pass

    def finalize(self):
        return [{"metric": "seen", "value": 1.0}]
"""


@pytest.fixture
def probe(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    module = write_package(tmp_path, RECORDING, name="probe")
    yield module
    for name in ("probe", module):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("kind", ["bert", "neox", "gpt2"])
def test_attention_maps_and_the_models_facts_are_those_of_eager_attention(tmp_path, probe, kind):
    """attention_probs equals eager's probabilities at every valid query (0 in padding rows and at hidden keys);
    attention_scores are -inf exactly where a key is hidden; each Site names the layer's causality and scaling
    (GPT-2's Mistral runs also divide by layer + 1); resid has no scaling."""
    cls, config = MODELS[kind]
    path = saved(tmp_path, cls, config(), kind)
    batch = padded_batch(n=3)
    stream, loaded = streamed(path, [load(f"{probe}:Maps")], batch, batch_size=3)
    seen = sys.modules[probe].SEEN
    g, valid = loaded.geometry, batch["attention_mask"].bool()
    eager = eager_attentions(path, batch)
    d_head = g.d_head
    for layer, expected in enumerate(eager):
        site, probs, _ = next(s for s in seen if s[0].name == "attention_probs" and s[0].layer == layer)
        scale = d_head**-0.5 / (layer + 1 if kind == "gpt2" else 1)
        assert (site.causal, site.n_layers, site.n_heads, site.d_head) == (kind != "bert", g.n_layers, 4, d_head)
        assert site.scaling == pytest.approx(scale)
        expected = expected * valid[:, None, :, None]
        np.testing.assert_allclose(probs.double().numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
        _, scores, _ = next(s for s in seen if s[0].name == "attention_scores" and s[0].layer == layer)
        hidden = ~valid[:, None, None, :].expand_as(scores)
        if kind != "bert":
            hidden = hidden | torch.ones_like(hidden).triu(1)
        assert torch.equal(torch.isinf(scores), hidden)
    resid = [s for s, _, _ in seen if s.name == "resid"]
    assert sorted({s.layer for s in resid}) == list(range(g.n_layers + 1))
    assert all(s.scaling is None for s in resid)


def test_together_gets_every_site_of_a_layer_in_one_update(tmp_path, probe):
    """Blocks from 0 at q and k, the embeddings at resid's 0: layers 0..n-1 get resid, q and k at once, layer n
    (after the last block) resid alone; once per mini-batch and layer."""
    path = saved(tmp_path, transformers.GPTNeoXForCausalLM, neox_config(), "neox")
    batch = padded_batch(n=5)
    stream, loaded = streamed(path, [load(f"{probe}:Together")], batch, batch_size=2)
    seen = sys.modules[probe].SEEN
    n = loaded.geometry.n_layers
    per_layer = {}
    for site, names, _ in seen:
        per_layer.setdefault(site.layer, []).append((site.name, tuple(names)))
    assert per_layer == {
        **{layer: [("resid+q+k", ("k", "q", "resid"))] * 3 for layer in range(n)},
        n: [("resid", ("resid",))] * 3,
    }
    rows = stream.tables(IDENT)["measures/together"]
    assert set(rows["site"]) == {"resid+q+k", "resid"}
