"""VectorStats: both ways of summing a site (the CPU's branches, the GPU's masks that never read a value back)
against float64 numpy on the valid, finite tokens."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from anisweep.extract.streaming import (
    LN_2,
    LOG2_E,
    ROW_FIELDS,
    AttentionStats,
    Units,
    VectorStats,
    VisibleKeys,
    masked_exp_,
    row_statistics,
)


def batches(seed: int = 0):
    """Three mini-batches of (x, valid): padding, a zero vector, a NaN token, an inf token, a finite token whose
    float32 norm overflows, and a batch whose every valid token is non-finite."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for b in range(3):
        x = torch.randn(2, 7, 5, generator=g) + 0.5
        valid = torch.rand(2, 7, generator=g) > 0.25
        valid[0, 0] = True
        if b == 0:
            x[1, 5] = 0.0  # no direction: in n, out of avg_cos
            valid[1, 5] = True
        if b == 1:
            x[0, 0, 2] = float("nan")
            x[1, 3, 0] = float("inf")
            valid[1, 3] = True
            x[1, 4] = 3e19  # finite, but sum of squares > float32's max
            valid[1, 4] = True
        if b == 2:
            x[valid] = float("nan")
        out.append((x, valid))
    return out


def expected(parts) -> dict:
    rows = [x.reshape(-1, x.shape[-1]).double().numpy()[v.reshape(-1).numpy()] for x, v in parts]
    rows = np.concatenate(rows)
    finite = np.isfinite(rows).all(axis=1)
    kept = rows[finite]
    norms = np.linalg.norm(kept, axis=1)
    nonzero = norms > 0
    return {
        "n": len(kept),
        "n_nonfinite": int((~finite).sum()),
        "n_zero": int((~nonzero).sum()),
        "sum_x": kept.sum(axis=0),
        "sum_unit": (kept[nonzero] / norms[nonzero, None]).sum(axis=0),
        "sum_norm": norms.sum(),
        "sum_norm_sq": (norms**2).sum(),
        "norm_min": norms.min(),
        "norm_max": norms.max(),
    }


@contextlib.contextmanager
def no_host_reads():
    """Fail on any read of a tensor's value into Python (what makes a GPU caller wait)."""
    names = ("__bool__", "__int__", "__float__", "__index__", "item", "tolist", "numpy", "cpu")
    saved = {name: getattr(torch.Tensor, name) for name in names}

    def refuse(name):
        def method(self, *args, **kwargs):
            raise AssertionError(f"Tensor.{name} read a value back to the host")

        return method

    try:
        for name in names:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


@pytest.mark.parametrize("wait_free", [False, True])
def test_sums_match_numpy_on_valid_finite_tokens(wait_free):
    parts = batches()
    stats = VectorStats(5)
    for x, valid in parts:
        stats.add(VectorStats.partial(x, valid, wait_free=wait_free))
    want = expected(parts)
    assert stats.n == want["n"] and stats.n_nonfinite == want["n_nonfinite"] == 2 + int(parts[2][1].sum())
    assert stats.n_zero == want["n_zero"] == 1
    for name in ("sum_x", "sum_unit"):
        np.testing.assert_allclose(getattr(stats, name).numpy(), want[name], rtol=1e-5, atol=1e-5)
    for name in ("sum_norm", "sum_norm_sq", "norm_min", "norm_max"):
        assert getattr(stats, name) == pytest.approx(want[name], rel=1e-6)


@pytest.mark.parametrize("outliers", [False, True])
def test_the_wait_free_sums_never_read_a_value_back(outliers):
    stats = VectorStats(5)
    parts = [VectorStats.partial(x, valid, wait_free=True) for x, valid in batches()]
    with no_host_reads():
        for x, valid in batches():
            stats.add(VectorStats.partial(x, valid, wait_free=True, outliers=outliers))
        with pytest.raises(AssertionError, match="read a value back"):
            VectorStats.partial(*batches()[1], wait_free=False)  # the CPU's branches do read, so the check bites
    assert stats.n == sum(int(p["counts"][0]) for p in parts)


def test_no_valid_token_leaves_empty_sums():
    stats = VectorStats(3)
    x, valid = torch.randn(1, 4, 3), torch.zeros(1, 4, dtype=torch.bool)
    for wait_free in (False, True):
        stats.add(VectorStats.partial(x, valid, wait_free=wait_free))
    assert (stats.n, stats.n_nonfinite, stats.sum_norm) == (0, 0, 0.0)
    assert (stats.norm_min, stats.norm_max) == (float("inf"), float("-inf"))
    assert not stats.sum_x.any()


@pytest.mark.parametrize("causal", [False, True])
def test_begin_batch_never_reads_the_device_mask(causal):
    """The batch's masks and counts come from the mask's CPU copy: with the device copy on `meta`, whose values
    cannot be read at all, begin_batch gives the same counts as a CPU run, and the torch path's blocks equal
    those built on the CPU."""
    from anisweep.adapters.base import Geometry
    from anisweep.extract.recorder import Recorder, Sample

    geometry = Geometry(n_layers=1, n_heads=2, d_model=8, d_head=4, rotary_dims=0, causal=causal)
    valid = torch.tensor([[True] * 6 + [False] * 2, [True] * 8])
    ids = torch.arange(16).reshape(2, 8)
    sample = Sample.draw(ids, valid, 5, seed=0)
    on_cpu = Recorder(geometry, sample, torch.device("cpu"))
    on_cpu.begin_batch(valid, 0)
    on_meta = Recorder(geometry, sample, torch.device("meta"))
    on_meta.begin_batch(valid.to("meta"), 0, host_valid=valid)
    assert on_meta.n_valid == on_cpu.n_valid == 14
    assert on_meta.row_counts == on_cpu.row_counts
    assert on_meta.n_visible.device.type == "meta"
    assert on_meta.blocks()[0][1][0].odd.device.type == "meta"
    expected_pairs = sum(range(1, 7)) + sum(range(1, 9)) if causal else 6 * 6 + 8 * 8
    assert on_cpu.row_counts[2] == expected_pairs


def test_avg_cos_from_the_sums_leaves_zero_vectors_out_as_the_point_cloud_does():
    from anisweep.measures import geometry

    x = torch.randn(1, 9, 6, generator=torch.Generator().manual_seed(3)) + 1.0
    x[0, 4] = 0.0
    stats = VectorStats(6)
    stats.add(VectorStats.partial(x, torch.ones(1, 9, dtype=torch.bool)))
    streamed = geometry.avg_cos_from_sums(stats.sum_unit.numpy(), stats.n - stats.n_zero)
    assert streamed == pytest.approx(geometry.avg_cos(x[0].double().numpy()), rel=1e-6)
    assert stats.n == 9 and stats.n_zero == 1


def biased_scores(b=3, n_heads=2, t=48, d_head=16):
    """Queries and keys sharing a large common direction: every score sits ~1000x its spread from 0."""
    g = torch.Generator().manual_seed(1)
    common = 3 * torch.randn(n_heads, 1, d_head, generator=g)
    query = common + 0.005 * torch.randn(b, n_heads, t, d_head, generator=g)
    key = common + 0.005 * torch.randn(b, n_heads, t, d_head, generator=g)
    return query, key, d_head**-0.5


def attention_rows(query, key, scaling, valid, causal):
    """ROW_FIELDS of every row through the torch path's masked_exp_ and row_statistics, per sequence."""
    t = query.shape[-2]
    out = []
    for seq in range(query.shape[0]):
        hidden = ~valid[seq][None, :].expand(t, t)
        if causal:
            hidden = hidden | torch.ones(t, t, dtype=torch.bool).triu(1)
        keys = VisibleKeys.build(hidden)
        scores = torch.baddbmm(
            torch.zeros(()), query[seq], key[seq].transpose(-1, -2), beta=0.0, alpha=scaling * LOG2_E
        )  # in bits, as attention_torch.attend computes them
        rows = torch.empty(*scores.shape[:2], len(ROW_FIELDS))
        e = masked_exp_(scores, keys, rows, out=torch.empty_like(scores))
        row_statistics(scores, e, keys, rows)
        out.append(rows)
    return torch.stack(out)


def visible_scores(query, key, scaling, valid, causal, head):
    """The float32 scores of one head's visible (valid query, visible key) pairs, as float64 numpy: in bits, as
    attention_torch.attend computes them, then in nats in float64, as AttentionStats.update turns them."""
    t = query.shape[-2]
    s = (
        torch.baddbmm(
            torch.zeros(()), query[:, head], key[:, head].transpose(-1, -2), beta=0.0, alpha=scaling * LOG2_E
        ).double()
        * LN_2
    )
    visible = valid[:, :, None] & valid[:, None, :]
    if causal:
        visible = visible & torch.ones(t, t, dtype=torch.bool).tril()
    return s[visible].double().numpy()


@pytest.mark.parametrize("causal", [False, True])
def test_score_std_is_exact_where_raw_moments_cancel(causal):
    """attention.parquet's score_mean and score_std against numpy float64 of the same float32 scores, with
    padding, where sqrt(E[s^2] - E[s]^2) of float32 row sums is off by ~1e-3: the rows hold sums of the
    scores shifted by their row max, merged across rows in float64."""
    query, key, scaling = biased_scores()
    t = query.shape[-2]
    valid = torch.arange(t)[None, :] < torch.tensor([t, 30, 5])[:, None]
    stats = AttentionStats(query.shape[1])
    for part in (slice(0, 2), slice(2, 3)):  # two mini-batches
        rows = attention_rows(query[part], key[part], scaling, valid[part], causal)
        lengths = valid[part].sum(-1, keepdim=True)  # padding at the end
        n_visible = torch.minimum(torch.arange(1, t + 1), lengths) if causal else lengths.expand(-1, t)
        stats.update(rows, valid[part], n_visible)
    means = stats.means()
    for head in range(query.shape[1]):
        expected = visible_scores(query, key, scaling, valid, causal, head)
        assert abs(expected.mean()) / expected.std() > 300
        assert float(means["score_mean"][head]) == pytest.approx(expected.mean(), rel=1e-7)
        assert float(means["score_std"][head]) == pytest.approx(expected.std(), rel=1e-5)


def masks(t: int):
    """(name, hidden (R, L) bool) of the masks extract's attention rows take: bidirectional and causal, without and
    with padding (at the end, at the start), a causal row block against the keys it sees, a row of one key."""
    causal = torch.ones(t, t, dtype=torch.bool).triu(1)
    pad_end = (torch.arange(t) >= t - t // 3)[None, :].expand(t, t)
    pad_start = (torch.arange(t) < t // 4)[None, :].expand(t, t)
    r0, r1 = t // 3, t - t // 4
    return [
        ("bidirectional", torch.zeros(t, t, dtype=torch.bool)),
        ("bidirectional padded", pad_end),
        ("causal", causal),
        ("causal padded", causal | pad_end),
        ("causal left-padded", causal | pad_start),
        ("causal row block", (causal | pad_end)[r0:r1, :r1]),
        ("one key", torch.zeros(3, 1, dtype=torch.bool)),
    ]


@pytest.mark.parametrize("t", [2, 7, 33, 64])
def test_row_order_statistics_are_a_sort_of_the_visible_keys(t):
    """p's visible min, lower and upper middle and max from row_statistics (one partition per row) against a full
    sort of each row's visible exponentials, bit for bit: scores with ties (a few values only), exponentials that
    underflow to 0 or to subnormals, odd and even counts of visible keys, every mask extract builds."""
    g = torch.Generator().manual_seed(t)
    for name, hidden in masks(t):
        n, (r, length) = 5, hidden.shape
        scores = torch.randint(-4, 4, (n, r, length), generator=g).float() * 0.75
        scores[0] = torch.randn(r, length, generator=g)  # no ties
        scores[1, :, ::3] -= 95.0  # subnormal exponentials
        scores[2, :, ::2] -= 200.0  # exponentials of 0
        scores[3, :, ::2] = float("-inf")  # as a -inf bias leaves them
        keys = VisibleKeys.build(hidden)
        rows = torch.empty(n, r, len(ROW_FIELDS))
        e = masked_exp_(scores.clone(), keys, rows, out=torch.empty_like(scores))
        row_statistics(scores.clone().sub_(rows[..., ROW_FIELDS.index("score_max"), None]), e, keys, rows)
        visible = ~hidden
        m = torch.where(visible, scores, torch.finfo(torch.float32).min).amax(dim=-1, keepdim=True)
        exps = torch.exp2(scores - m)  # scores in bits; the same layout as extract's: the same float32 rounding
        for i in range(n):
            for row in range(r):
                values = exps[i, row][visible[row]].sort().values
                count = len(values)
                if count == 0 or not float(values[-1]) > 0:  # no visible key, or every visible score -inf: NaN
                    continue
                z = rows[i, row, ROW_FIELDS.index("z")]
                assert float(z) == pytest.approx(float(values.double().sum()), rel=1e-6), name
                got = rows[i, row, [ROW_FIELDS.index(f) for f in ("p_min", "p_lower", "p_upper", "p_max")]]
                want = values[[0, (count - 1) // 2, count // 2, count - 1]] / z
                assert torch.equal(got, want), (name, i, row, got, want)


@pytest.mark.parametrize("outliers", [False, True])
@pytest.mark.parametrize("wait_free", [False, True])
@pytest.mark.parametrize("max_units", [32, 2])
def test_with_units_the_sums_over_every_token_are_the_sequences(wait_free, outliers, max_units):
    """With units the sums over every token are read from each sequence's and each unit's (the norms' M2 merged):
    those of the accumulator without units, to float64 rounding (the vector sums: to float32's, where they are taken
    in float32 within a sequence rather than within a mini-batch), and numpy's counts."""
    parts = batches()
    plain, by_units = VectorStats(5), VectorStats(5, units=Units.of(6, max_units))
    for x, valid in parts:
        plain.add(VectorStats.partial(x, valid, wait_free=wait_free, outliers=outliers))
        by_units.add(VectorStats.partial(x, valid, wait_free=wait_free, outliers=outliers, per_sequence=True))
    for name in ("n", "n_nonfinite", "n_zero"):
        assert getattr(by_units, name) == getattr(plain, name) == expected(parts)[name]
    for name in ("sum_norm", "sum_norm_sq", "norm_min", "norm_max"):
        assert getattr(by_units, name) == pytest.approx(getattr(plain, name), rel=1e-12)
    assert float(by_units.norm_m2) == pytest.approx(float(plain.norm_m2), rel=1e-12)
    names = ("sum_x", "sum_unit") + (("m2_x", "m2_unit", "abs_max") if outliers else ())
    rtol = 1e-12 if outliers else 1e-6  # without the outlier statistics, float32 sums within a sequence or a batch
    for name in names:
        np.testing.assert_allclose(getattr(by_units, name), getattr(plain, name), rtol=rtol, err_msg=name)
    assert by_units.seq_scalars[:, 0].sum() == plain.n  # every sequence's own count, in the mini-batch's order
    assert by_units.seq_scalars[4, 0] == 0  # the last mini-batch's every valid token is non-finite


@pytest.mark.parametrize("wait_free", [False, True])
@pytest.mark.parametrize("units", [None, Units.of(5, 32)])
def test_top_tokens_name_their_sequence_in_the_evaluation_batch(wait_free, units):
    """A top token of a later mini-batch is named by its sequence's index in the whole batch, not the mini-batch's."""
    x = torch.randn(5, 6, 4, generator=torch.Generator().manual_seed(0))
    x[3, 2, 1] = 100.0  # the largest component: sequence 3 (the second mini-batch's second), position 2
    valid = torch.ones(5, 6, dtype=torch.bool)
    stats = VectorStats(4, units=units)
    for rows in (slice(0, 2), slice(2, 4), slice(4, 5)):
        part = VectorStats.partial(x[rows], valid[rows], wait_free, outliers=True, per_sequence=units is not None)
        stats.add(part)
    top = stats.top_tokens()
    assert (top["seq"][0], top["position"][0], top["dim"][0], top["value"][0]) == (3, 2, 1, 100.0)
    assert set(top["seq"]) <= set(range(5))


@pytest.mark.parametrize("padded", [False, True], ids=["whole-sequences", "cut-rows"])
@pytest.mark.parametrize("chunk_rows", [3, 7, 64])
def test_each_units_sums_are_its_own_rows_in_any_chunking(padded, chunk_rows, monkeypatch):
    """At the sampled sites each unit's sums of x, of u = x / ||x|| and of u^2 (the rogue dimensions' `unit_sum_sq`)
    are those of its own valid rows, in float64, whatever the chunks' rows: chunks of whole sequences (a batch with
    no row cut, each sequence's rows one block) and chunks across sequences (rows cut: padding), several a batch."""
    import anisweep.extract.streaming as streaming

    d, width = 6, 8
    monkeypatch.setattr(streaming, "CPU_CHUNK_ELEMENTS", chunk_rows * d)
    x = torch.randn(5, width, d, generator=torch.Generator().manual_seed(1)) * 3 + 2
    valid = torch.ones(5, width, dtype=torch.bool)
    if padded:
        valid[1, 5:] = False
        valid[3, :2] = False
    units = Units.of(5, 3)  # units of 2, 2 and 1 sequences
    stats = VectorStats(d, units=units)
    for rows in (slice(0, 3), slice(3, 5)):
        stats.add(VectorStats.partial(x[rows], valid[rows], wait_free=False, outliers=True, per_sequence=True))
    xs = x.double()
    for u in range(units.n_units):
        seqs = range(u * units.size, min(5, (u + 1) * units.size))
        rows = torch.cat([xs[s][valid[s]] for s in seqs])
        unit_vectors = rows / rows.norm(dim=1, keepdim=True)
        np.testing.assert_allclose(stats.unit_sums[u, 0], rows.sum(0), rtol=1e-12)
        np.testing.assert_allclose(stats.unit_sums[u, 1], unit_vectors.sum(0), rtol=1e-12)
        np.testing.assert_allclose(stats.unit_sum_sq[u], unit_vectors.square().sum(0), rtol=1e-12)
