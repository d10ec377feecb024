"""Every streamed variance against a two-pass float64 computation on the same float32 values, where the raw
moments cancel: dimensions with a large mean and a small spread (1000 + 0.1 N(0, 1); a rogue dimension of mean
31.5 and variance 9.5e-3), norms of mean 1e5 and spread 0.1, scores of mean 4e4 and spread 0.014, streamed as
several mini-batches of 4 x 512 tokens. sum x^2 / n - mean^2 of float32 sums gets the standard deviations of such
dimensions wrong by a factor of 3 or more, and the rogue dimension's variance by 4%."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import torch
from test_streaming import attention_rows, visible_scores

from anisweep.extract import streaming
from anisweep.extract.streaming import AttentionStats, VectorStats
from anisweep.extract.tables import hidden_stats_table
from anisweep.measures import geometry, rogue
from anisweep.measures.metrics import stats_rows
from anisweep.moments import merge

RTOL = 1e-7
ROGUE_VARIANCE = 9.501e-3


def planted(n_batches: int = 3, d: int = 6, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Mini-batches (x: 4 x 512 x d float32, valid) with padding: dimensions 0 and 2 are 1000 + 0.1 N(0, 1),
    dimension 1 a rogue one (31.5 + N(0, 9.5e-3)), the others N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for b in range(n_batches):
        x = torch.randn(4, 512, d, generator=g)
        x[..., 0] = 1000 + 0.1 * torch.randn(4, 512, generator=g)
        x[..., 1] = 31.5 + math.sqrt(ROGUE_VARIANCE) * torch.randn(4, 512, generator=g)
        x[..., 2] = 1000 + 0.1 * torch.randn(4, 512, generator=g)
        valid = torch.arange(512)[None, :] < torch.tensor([512, 300 + b, 512, 17])[:, None]
        out.append((x, valid))
    return out


def kept(batches) -> np.ndarray:
    """The valid tokens' vectors, float64."""
    return np.concatenate([x[v].double().numpy() for x, v in batches])


def streamed(batches, wait_free: bool, outliers: bool = True) -> VectorStats:
    stats = VectorStats(batches[0][0].shape[-1])
    for x, valid in batches:
        stats.add(VectorStats.partial(x, valid, wait_free=wait_free, outliers=outliers))
    return stats


def hidden_stats(stats: VectorStats, site: str = "resid") -> dict:
    """hidden_stats.parquet's row of the site, as extract writes it."""
    return hidden_stats_table(SimpleNamespace(vectors={(1, site): stats})).row(0, named=True)


def relative(a, b) -> np.ndarray:
    return np.abs(np.asarray(a, np.float64) - b) / np.abs(b)


@pytest.mark.parametrize("chunk_rows", [None, 100])
@pytest.mark.parametrize("wait_free", [False, True])
def test_per_dimension_mean_and_variance_match_two_passes(wait_free, chunk_rows, monkeypatch):
    """Both ways of summing (the CPU's, the GPU's masks), a CPU's mini-batch in one chunk of rows and in several."""
    if chunk_rows:
        monkeypatch.setattr(streaming, "CPU_CHUNK_ELEMENTS", 6 * chunk_rows)
    batches = planted()
    x = kept(batches)
    row = hidden_stats(streamed(batches, wait_free))
    n = row["n"]
    assert n == len(x)
    assert relative(np.asarray(row["m2_x"]) / n, x.var(axis=0)).max() <= RTOL
    assert x.var(axis=0)[1] == pytest.approx(ROGUE_VARIANCE, rel=0.05)
    assert (np.abs(np.asarray(row["sum_x"]) / n - x.mean(axis=0)) / x.std(axis=0)).max() <= RTOL
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    assert relative(row["m2_unit"], ((unit - unit.mean(axis=0)) ** 2).sum(axis=0)).max() <= RTOL
    # the sums of squares are still there (the old columns), exact too
    assert relative(row["sum_x_sq"], (x**2).sum(axis=0)).max() <= RTOL


@pytest.mark.parametrize("wait_free", [False, True])
def test_moments_hold_where_each_mini_batch_has_a_mean_of_its_own(wait_free):
    """Each mini-batch's moments are summed about a shift near its own mean: mini-batches whose large means lie
    50 and 100 spreads apart (dimensions 0 and 2), and one whose rogue dimension is 10x larger, merge to the
    two-pass moments of every token."""
    batches = planted()
    for b, (x, _) in enumerate(batches):
        x[..., 0] += 5.0 * b
        x[..., 2] -= 10.0 * b
    batches[2][0][..., 1] *= 10.0
    x = kept(batches)
    row = hidden_stats(streamed(batches, wait_free))
    n = row["n"]
    assert relative(np.asarray(row["m2_x"]) / n, x.var(axis=0)).max() <= RTOL
    assert (np.abs(np.asarray(row["sum_x"]) / n - x.mean(axis=0)) / x.std(axis=0)).max() <= RTOL
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    assert relative(row["m2_unit"], ((unit - unit.mean(axis=0)) ** 2).sum(axis=0)).max() <= RTOL
    assert relative(row["sum_unit"], unit.sum(axis=0)).max() <= RTOL


def test_the_standardised_avg_cos_and_the_rogue_shares_match_two_passes():
    """What the sums feed: avg_cos after standardising each dimension with the streamed mean and std, and each
    dimension's term of avg_cos, against the same from numpy's two-pass mean and variance of every token."""
    batches = planted()
    x = kept(batches)
    row = hidden_stats(streamed(batches, wait_free=False))
    stats = pl.DataFrame([row])
    sample = x[::7]
    rows = {r["metric"]: r["value"] for r in rogue.rogue_rows(stats, {(1, "resid"): sample})}
    z = (sample - x.mean(axis=0)) / x.std(axis=0)
    assert rows["avg_cos_standardised"] == pytest.approx(geometry.avg_cos(z), rel=RTOL)
    np.testing.assert_allclose(rogue.standardise(sample, row["sum_x"], row["m2_x"], row["n"]), z, rtol=0, atol=1e-6)

    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    n = len(unit)
    mean = unit.mean(axis=0)
    terms = mean * mean - ((unit - mean) ** 2).sum(axis=0) / (n * (n - 1))  # two passes: mean_j^2 - M2_j / (n(n-1))
    assert relative(rogue.contributions(row["sum_unit"], row["m2_unit"], n), terms).max() <= RTOL
    order = np.argsort(-terms)
    assert rows["rogue_top1_share"] == pytest.approx(terms[order[0]] / terms.sum(), rel=RTOL)
    assert rows["rogue_top3_share"] == pytest.approx(terms[order[:3]].sum() / terms.sum(), rel=RTOL)


@pytest.mark.parametrize("outliers", [False, True])
@pytest.mark.parametrize("wait_free", [False, True])
def test_norm_std_matches_two_passes_where_the_raw_moments_cancel(wait_free, outliers):
    """Norms of mean 1e5 and spread 0.1 (one component, so that each float32 norm is exact): norm_std (stream
    geometry) against numpy's, at a site with the outlier statistics and at one without."""
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(3):
        x = torch.zeros(4, 512, 4)
        x[..., 0] = 1e5 + 0.1 * torch.randn(4, 512, generator=g)
        batches.append((x, torch.ones(4, 512, dtype=torch.bool)))
    norms = np.linalg.norm(kept(batches), axis=1)
    assert norms.mean() / norms.std() > 1e5
    row = hidden_stats(streamed(batches, wait_free, outliers))
    values = {r["metric"]: r["value"] for r in stats_rows(pl.DataFrame([row]))}
    assert values["norm_std"] == pytest.approx(norms.std(), rel=RTOL)
    assert values["norm_mean"] == pytest.approx(norms.mean(), rel=RTOL)


@pytest.mark.parametrize("causal", [False, True])
def test_score_std_where_the_rows_means_are_far_from_zero(causal):
    """Scores of mean 4e4 and spread ~0.014 (mean / std > 1e6): the between-row variance from raw moments,
    sum_r n_r m_r^2 - n mean^2, cancels even in float64 (off by 6e-5 to 2e-3); the rows merged about each batch's
    mean by Chan et al.'s update, each row's own M2 from its scores shifted by the row's max, are exact."""
    g = torch.Generator().manual_seed(2)
    n_heads, t, d_head = 2, 48, 16
    common = torch.zeros(n_heads, 1, d_head)
    common[..., 0] = 400.0  # q.k / 4 = 4e4
    query = common + 1e-4 * torch.randn(3, n_heads, t, d_head, generator=g)
    key = common + 1e-4 * torch.randn(3, n_heads, t, d_head, generator=g)
    scaling = d_head**-0.5
    valid = torch.arange(t)[None, :] < torch.tensor([t, 30, 5])[:, None]
    stats = AttentionStats(n_heads)
    for part in (slice(0, 2), slice(2, 3)):
        rows = attention_rows(query[part], key[part], scaling, valid[part], causal)
        lengths = valid[part].sum(-1, keepdim=True)
        n_visible = torch.minimum(torch.arange(1, t + 1), lengths) if causal else lengths.expand(-1, t)
        stats.update(rows, valid[part], n_visible)
    means = stats.means()
    for head in range(n_heads):
        expected = visible_scores(query, key, scaling, valid, causal, head)
        assert abs(expected.mean()) / expected.std() > 1e6
        assert float(means["score_mean"][head]) == pytest.approx(expected.mean(), rel=1e-12)
        assert float(means["score_std"][head]) == pytest.approx(expected.std(), rel=RTOL)


def test_chan_merge_of_parts_is_the_two_pass_moments():
    """anisweep.moments.merge of uneven parts (one empty), per dimension and as a scatter matrix."""
    rng = np.random.default_rng(3)
    x = 1e4 + rng.normal(size=(1000, 3)) * np.array([1e-2, 1.0, 5.0])
    n, mean, m2, scatter = 0, np.zeros(3), np.zeros(3), np.zeros((3, 3))
    for part in np.split(x, [0, 1, 400, 401, 1000]):
        k = len(part)
        part_mean = part.mean(axis=0) if k else np.zeros(3)
        dev = part - part_mean
        _, _, scatter = merge(n, mean, scatter, k, part_mean, dev.T @ dev, outer=True)
        n, mean, m2 = merge(n, mean, m2, k, part_mean, (dev**2).sum(axis=0))
    centred = x - x.mean(axis=0)
    assert n == len(x)
    np.testing.assert_allclose(mean, x.mean(axis=0), rtol=1e-15)
    np.testing.assert_allclose(m2, (centred**2).sum(axis=0), rtol=1e-9)
    np.testing.assert_allclose(scatter, centred.T @ centred, rtol=1e-10, atol=1e-8)
