"""Sink_1^epsilon against Gu et al. 2024's own definition on the same attention maps: their
`compute_attention_sink` (sail-sg/Attention-Sink, eval_sink_open_source.py) written out here in numpy on full
(samples, layers, heads, T, T) maps, and the pipeline's, from the column sums the attention pass hands SinkStats
through sinks.parquet to the metric rows."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import torch

from anisweep.extract.outlier_tables import sinks_table
from anisweep.extract.streaming import SinkStats
from anisweep.measures import sinks

EMPTY_KEYS = pl.DataFrame(schema={"layer": pl.Int64, "head": pl.Int64, "rank": pl.Int64})
EMPTY_ATTENTION = pl.DataFrame(schema={"layer": pl.Int64, "head": pl.Int64, "p_max_mean": pl.Float64})


def gu_sink1(maps: np.ndarray, epsilon: float) -> float:
    """Gu et al.'s metric1[0] / 100: importance of key k = sum over queries of p[q, k] / (T - k), thresholded per
    sample, layer and head, averaged over all three; k = 0 the first token."""
    t = maps.shape[-1]
    ratios = np.arange(t, 0, -1)[None, None, None, None, :]
    importance = (maps / ratios).sum(axis=-2)
    return float((importance > epsilon).mean(axis=(0, 1, 2))[0])


def causal_maps(samples, layers, heads, t, seed=0) -> np.ndarray:
    """Causal softmax maps whose first-key logit varies by head, so that some heads sink and some do not."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((samples, layers, heads, t, t))
    logits[..., 0] += rng.uniform(-1, 4, size=(1, layers, heads, 1)) + rng.normal(0, 0.5, (samples, 1, 1, 1))
    logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def pipeline_rows(maps: list[np.ndarray], lengths: list[int], epsilon: float) -> dict:
    """Each layer's SinkStats fed two mini-batches of right-padded sequences (maps[b]: layers, heads, T_b, T_b),
    the column sums over the valid rows as the attention pass computes them."""
    layers, heads = maps[0].shape[:2]
    width = max(lengths)
    stats = {layer: SinkStats(heads) for layer in range(layers)}
    for batch in (range(0, 2), range(2, len(maps))):
        valid = torch.zeros(len(batch), width, dtype=torch.bool)
        colsum = torch.zeros(len(batch), layers, heads, width)
        for i, b in enumerate(batch):
            valid[i, : lengths[b]] = True
            colsum[i, :, :, : lengths[b]] = torch.from_numpy(maps[b].sum(axis=-2))
        for layer in range(layers):
            stats[layer].update(colsum[:, layer].float(), valid, int(valid.sum()))
    table = sinks_table(SimpleNamespace(sinks=stats))
    rows = sinks.sink_rows(table, EMPTY_KEYS, EMPTY_ATTENTION, epsilon)
    return {(r.get("layer"), r.get("head"), r["metric"]): r["value"] for r in rows}


@pytest.mark.parametrize("epsilon", [0.3, 0.5])
def test_sink1_equals_gu_et_als_on_the_same_maps(epsilon):
    maps = causal_maps(samples=5, layers=3, heads=4, t=9)
    rows = pipeline_rows(list(maps), [9] * 5, epsilon)
    assert rows[(None, None, "sink1_eps")] == pytest.approx(gu_sink1(maps, epsilon), abs=1e-12)
    assert rows[(None, None, "sink1_epsilon")] == epsilon
    for layer in range(3):
        assert rows[(layer, None, "sink1_eps")] == pytest.approx(gu_sink1(maps[:, layer : layer + 1], epsilon))
        for head in range(4):
            one = maps[:, layer : layer + 1, head : head + 1]
            assert rows[(layer, head, "sink1_eps")] == pytest.approx(gu_sink1(one, epsilon))
    assert 0 < rows[(None, None, "sink1_eps")] < 1  # the maps have sinking heads and others


def test_padded_sequences_count_their_own_rows():
    """A padded sequence's importance is Gu et al.'s on its own valid part (their prompts are all T tokens)."""
    lengths = [9, 5, 7, 3, 9]
    maps = [causal_maps(1, 2, 3, t, seed=t)[0] for t in lengths]
    rows = pipeline_rows(maps, lengths, 0.3)
    expected = np.mean([gu_sink1(m[None], 0.3) for m in maps])  # each sample has every layer and head
    assert rows[(None, None, "sink1_eps")] == pytest.approx(expected)
    importance = sinks_table(
        SimpleNamespace(sinks={0: _fed(maps, lengths)}),
    )["first_importance"].to_list()
    for head in range(3):
        np.testing.assert_allclose(importance[head], [m[0, head, :, 0].sum() / len(m[0, 0]) for m in maps], rtol=1e-6)


def _fed(maps, lengths) -> SinkStats:
    stats = SinkStats(3)
    width = max(lengths)
    valid = torch.zeros(len(maps), width, dtype=torch.bool)
    colsum = torch.zeros(len(maps), 3, width)
    for b, (m, t) in enumerate(zip(maps, lengths)):
        valid[b, :t] = True
        colsum[b, :, :t] = torch.from_numpy(m[0].sum(axis=-2))
    stats.update(colsum, valid, int(valid.sum()))
    return stats
