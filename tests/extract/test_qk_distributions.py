"""qk_sample.parquet and score_hist.parquet against q, k and scores recomputed from the weights (test_extract's
eager reference)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
import transformers
from test_extract import reference

from anisweep import config
from anisweep.extract import score_hist
from anisweep.extract.model import ExtractSettings

from conftest import bert_config, neox_config, padded_batch, run_extract, saved

MODELS = {
    "bert": (transformers.BertModel, bert_config),
    "gpt_neox": (transformers.GPTNeoXModel, neox_config),
}


@pytest.mark.parametrize("kind", MODELS)
def test_qk_sample_matches_eager_reference(tmp_path, kind):
    cls, config = MODELS[kind]
    path = saved(tmp_path, cls, config(), kind)
    batch = padded_batch()
    tables, _ = run_extract(path, batch, qk_sample_tokens=11, sample_tokens=20, seed=3)
    ref = reference(path, batch, kind)
    sample = tables["qk_sample"]
    hidden = tables["hidden"].filter((pl.col("layer") == 0) & (pl.col("site") == "resid"))
    assert set(sample["rope"]) == ({"pre", "post"} if kind == "gpt_neox" else {"pre"})
    for (layer, rope), q in ref["q"].items():
        k = ref["k"][(layer, rope)]
        for head in range(q.shape[1]):
            rows = sample.filter((pl.col("layer") == layer) & (pl.col("head") == head) & (pl.col("rope") == rope))
            assert rows.height == 11
            seqs, positions = (torch.from_numpy(rows[c].to_numpy(writable=True)) for c in ("seq", "position"))
            assert batch["attention_mask"][seqs, positions].all()
            assert (rows["token_id"].to_numpy() == batch["input_ids"][seqs, positions].numpy()).all()
            np.testing.assert_allclose(np.stack(rows["q"].to_list()), q[seqs, head, positions].numpy(), atol=1e-5)
            np.testing.assert_allclose(np.stack(rows["k"].to_list()), k[seqs, head, positions].numpy(), atol=1e-5)
    kept = set(sample.select("seq", "position").iter_rows())
    assert len(kept) == 11 and kept <= set(hidden.select("seq", "position").iter_rows())


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
def test_qk_sample_keeps_the_same_tokens_at_every_checkpoint(tmp_path):
    batch = padded_batch()
    first = saved(tmp_path, transformers.BertModel, bert_config(), "a")
    torch.manual_seed(7)
    transformers.BertModel(bert_config()).save_pretrained(tmp_path / "b")  # other weights, same batch and seed
    a, _ = run_extract(first, batch, qk_sample_tokens=6, seed=2)
    b, _ = run_extract(tmp_path / "b", batch, qk_sample_tokens=6, seed=2)
    c, _ = run_extract(first, batch, qk_sample_tokens=6, seed=5)
    tokens = lambda t: t["qk_sample"].select("layer", "head", "seq", "position")  # noqa: E731
    assert tokens(a).equals(tokens(b))
    assert not tokens(a).equals(tokens(c))
    assert not a["qk_sample"]["q"].equals(b["qk_sample"]["q"])


@pytest.mark.parametrize("kind", MODELS)
def test_score_histogram_counts_every_visible_pair(tmp_path, kind):
    cls, config = MODELS[kind]
    path = saved(tmp_path, cls, config(), kind)
    batch = padded_batch()
    ref = reference(path, batch, kind)
    valid = batch["attention_mask"].bool()
    b, t = valid.shape
    visible = valid[:, None, :, None] & valid[:, None, None, :]
    if kind == "gpt_neox":
        visible = visible & torch.ones(t, t, dtype=torch.bool).tril()
    visible = visible.expand(b, 4, t, t)
    rope = "post" if kind == "gpt_neox" else "pre"
    scores = {}
    for layer in range(2):
        q, k = ref["q"][(layer, rope)].double(), ref["k"][(layer, rope)].double()
        scores[layer] = ((q @ k.transpose(-1, -2)) / ref["d"] ** 0.5)[visible].numpy()
    low, high = np.quantile(scores[0], [0.05, 0.9])  # bins inside layer 0's range: every bin and both tails fill
    bins = {"low": float(low), "high": float(high), "n": 7}
    tables, _ = run_extract(path, batch, score_bins=bins)
    edges = np.linspace(low, high, 8)
    hist = tables["score_hist"]
    for layer in range(2):
        expected, _ = np.histogram(scores[layer], bins=[-np.inf, *edges, np.inf])
        rows = hist.filter(pl.col("layer") == layer).sort("bin")
        got = rows["count"].to_numpy()
        assert got.sum() == int(visible.sum()) == len(scores[layer])
        assert layer == 1 or (expected > 0).all()
        near_edge = int((np.abs(scores[layer][:, None] - edges[None, :]) < 1e-6).sum())
        assert np.abs(got - expected).sum() <= 2 * near_edge
        np.testing.assert_allclose(rows["bin_lo"].to_numpy()[1:], edges, atol=1e-6)
        assert rows["bin_lo"][0] == -np.inf and rows["bin_hi"][-1] == np.inf


def test_score_bins_must_be_increasing():
    with pytest.raises(ValueError, match="high = -1.0 must be greater than low = 2.0"):
        score_hist.bin_edges(2.0, -1.0, 4)


def test_settings_carry_the_schema_defaults():
    settings = ExtractSettings()
    assert settings.qk_sample_tokens == 256
    assert settings.score_bins is None  # off unless asked for: it scores every layer a second time
    run = config.complete({"models": [{"family": "toy", "name": "t", "steps": [0]}], "extract": {"score_bins": {}}})
    assert run["extract"]["score_bins"] == {"low": -20.0, "high": 20.0, "n": 80}


def test_no_score_bins_no_histogram(tmp_path):
    path = saved(tmp_path, transformers.GPTNeoXModel, neox_config(), "neox")
    tables, _ = run_extract(path, padded_batch())
    assert tables["score_hist"].height == 0 and "count" in tables["score_hist"].columns


@pytest.mark.parametrize("max_scores", [100, 4 * 12 * 12 * 2, 2**22])
@pytest.mark.parametrize("causal", [False, True])
def test_score_histogram_chunks_match_numpy(monkeypatch, max_scores, causal):
    """One head of one sequence, two whole sequences, or the whole batch per chunk: numpy's histogram of the
    visible pairs' scores."""
    monkeypatch.setattr(score_hist, "MAX_SCORES", max_scores)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(5, 4, 12, 8, generator=g), torch.randn(5, 4, 12, 8, generator=g)
    valid = padded_batch()["attention_mask"].bool()
    hist = score_hist.ScoreHistogram(1, -1.5, 2.0, 7, torch.device("cpu"))
    hist.update(0, q[:3], k[:3], 0.3, valid[:3], causal)  # two mini-batches add up
    hist.update(0, q[3:], k[3:], 0.3, valid[3:], causal)
    visible = valid[:, None, :, None] & valid[:, None, None, :]
    if causal:
        visible = visible & torch.ones(12, 12, dtype=torch.bool).tril()
    scores = (q.double() @ k.double().transpose(-1, -2) * 0.3)[visible.expand(5, 4, 12, 12)].numpy()
    expected, _ = np.histogram(scores, bins=[-np.inf, *np.linspace(-1.5, 2.0, 8), np.inf])
    assert (expected > 0).all()
    np.testing.assert_array_equal(hist.counts[0].numpy(), expected)
