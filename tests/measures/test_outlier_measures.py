"""The numbers behind rogue dimensions, massive activations, attention sinks and LayerNorm outliers
(anisweep.measures.rogue, massive, sinks, ln_outliers) against brute force on made-up data."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from anisweep.measures import geometry, ln_outliers, massive, rogue, sinks


def cloud(n=60, d=12, seed=0, rogue_dim=None):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    if rogue_dim is not None:
        x[:, rogue_dim] += 9.0  # a shared offset in one coordinate: most of avg_cos
    return x


def sums(x):
    norms = np.linalg.norm(x, axis=1)
    unit = x[norms > 0] / norms[norms > 0, None]
    return {
        "n": len(x),
        "n_zero": int((norms == 0).sum()),
        "sum_x": x.sum(0),
        "m2_x": ((x - x.mean(0)) ** 2).sum(0),
        "sum_unit": unit.sum(0),
        "m2_unit": ((unit - unit.mean(0)) ** 2).sum(0),
    }


@pytest.mark.parametrize("rogue_dim", [None, 4])
def test_contributions_are_the_pairwise_cosine_per_coordinate(rogue_dim):
    """c_j from the sums equals the mean over distinct pairs of u_ij u_kj, and they add up to avg_cos; a zero vector
    is left out as avg_cos leaves it out."""
    x = cloud(rogue_dim=rogue_dim)
    x[7] = 0.0
    s = sums(x)
    n = s["n"] - s["n_zero"]
    c = rogue.contributions(s["sum_unit"], s["m2_unit"], n)
    kept = x[np.linalg.norm(x, axis=1) > 0]
    unit = kept / np.linalg.norm(kept, axis=1, keepdims=True)
    pairs = unit[:, None, :] * unit[None, :, :]
    pairs[np.arange(n), np.arange(n)] = 0.0
    np.testing.assert_allclose(c, pairs.sum(axis=(0, 1)) / (n * (n - 1)), atol=1e-12)
    assert c.sum() == pytest.approx(geometry.avg_cos(x), abs=1e-12)
    values = rogue.summary(c)
    if rogue_dim is not None:
        assert values["rogue_dim_1"] == rogue_dim and values["rogue_top1_share"] > 0.9
        assert values["rogue_dims_90"] == 1
    else:
        assert values["rogue_top1_share"] < 0.9 and values["rogue_dims_90"] > 1


def test_summary_shares_and_undefined_cases():
    c = np.array([0.05, 0.5, -0.05, 0.3, 0.2])  # avg_cos 1.0
    values = rogue.summary(c)
    assert [values[f"rogue_dim_{i}"] for i in (1, 2, 3)] == [1, 3, 4]
    assert values["rogue_top1_share"] == pytest.approx(0.5)
    assert values["rogue_top3_share"] == pytest.approx(1.0)
    assert values["rogue_top10_share"] == pytest.approx(1.0)  # fewer than 10 dimensions: all of them
    assert values["rogue_dims_90"] == 3
    assert np.isnan(rogue.summary(-c)["rogue_top1_share"])  # avg_cos < 0: no share
    assert rogue.summary(-c)["rogue_dim_1"] == 2
    undefined = rogue.summary(rogue.contributions(np.ones(3), np.ones(3), 1))
    assert all(np.isnan(v) for v in undefined.values())


def test_standardised_avg_cos_uses_the_streamed_mean_and_std():
    """The sample standardised with the mean and std of every token (not the sample's own), as the rows say."""
    x = cloud(n=200, rogue_dim=2)
    stats = pl.DataFrame(
        [{"layer": 1, "site": "resid", **{k: v.tolist() if hasattr(v, "tolist") else v for k, v in sums(x).items()}}]
    )
    sample = x[::5]
    rows = {r["metric"]: r["value"] for r in rogue.rogue_rows(stats, {(1, "resid"): sample})}
    z = (sample - x.mean(0)) / x.std(0)
    assert rows["avg_cos_standardised"] == pytest.approx(geometry.avg_cos(z), abs=1e-12)
    assert rows["avg_cos_sample"] == pytest.approx(geometry.avg_cos(sample), abs=1e-12)
    assert rows["avg_cos_sample"] > 0.5 > abs(rows["avg_cos_standardised"])


def test_massive_ratio_and_dimensions():
    x = cloud(n=50, d=8)
    x[3, 6] = 500.0
    stats = pl.DataFrame([{"layer": 0, "site": "resid", "n": 50, "abs_max": np.abs(x).max(0).tolist()}])
    top = pl.DataFrame(
        {"layer": [0, 0], "site": ["resid"] * 2, "rank": [0, 1], "kind": ["delimiter", "first"], "position": [3, 0]}
        | {"dim": [6, 1]}
    )
    rows = {r["metric"]: r["value"] for r in massive.massive_rows(stats, {(0, "resid"): x}, top)}
    assert rows["massive_ratio"] == pytest.approx(500.0 / np.median(np.abs(x)))
    assert rows["massive_dim_1"] == 6
    assert rows["massive_top_delimiter_share"] == 0.5 and rows["massive_top_other_share"] == 0.0
    assert rows["massive_top1_position"] == 3


def test_layernorm_outliers_and_the_rogue_dimensions_of_the_output():
    gain = np.ones(40) + np.random.default_rng(1).normal(0, 0.01, 40)
    gain[[5, 17]] = [3.0, -2.0]
    assert ln_outliers.outliers(gain).tolist() == [17, 5]  # largest |z| first
    assert ln_outliers.outliers(np.ones(5)).tolist() == []
    out = cloud(n=80, d=40, rogue_dim=17)
    layernorm = pl.DataFrame(
        [{"layer": 2, "site": "final_ln", "eps": 1e-5, "gain": gain.tolist(), "bias": None}],
        schema={
            "layer": pl.Int64,
            "site": pl.String,
            "eps": pl.Float64,
            "gain": pl.List(pl.Float64),
            "bias": pl.List(pl.Float64),
        },
    )
    stats = pl.DataFrame(
        [
            {
                "layer": 2,
                "site": "final_ln_out",
                **{k: v.tolist() if hasattr(v, "tolist") else v for k, v in sums(out).items()},
            }
        ]
    )
    rows = {r["metric"]: r["value"] for r in ln_outliers.ln_outlier_rows(layernorm, stats)}
    assert rows["ln_gain_outliers"] == 2 and rows["ln_gain_outlier_dim_1"] == 17
    assert "ln_bias_outliers" not in rows  # a norm without a bias: no count, rather than a NaN
    assert rows["ln_rogue_1_is_outlier"] == 1.0 and rows["ln_outliers_in_rogue"] >= 1


def test_sink_rows_per_head_and_per_layer():
    sink_table = pl.DataFrame(
        {"layer": [0, 0], "head": [0, 1], "n_rows": [10, 10], "n_seqs": [2, 2], "first_received": [9.0, 1.0]}
        | {"received": [[9.0, 1.0], [1.0, 9.0]], "key_count": [[2, 2], [2, 2]]}
        | {"first_importance": [[0.9, 0.2], [0.1, float("nan")]]}
    )
    keys = pl.DataFrame(
        {"layer": [0, 0], "head": [0, 1], "rank": [0, 0], "position": [0, 1]}
        | {"share": [0.9, 0.8], "kind": ["first", "other"]}
    )
    attention = pl.DataFrame({"layer": [0, 0], "head": [0, 1], "p_max_mean": [0.9, 0.85]})
    rows = {(r["layer"], r.get("head"), r["metric"]): r["value"] for r in sinks.sink_rows(sink_table, keys, attention)}
    assert rows[(0, 0, "sink_first_mass")] == 0.9 and rows[(0, 1, "sink_first_mass")] == 0.1
    assert rows[(0, None, "sink_first_mass")] == pytest.approx(0.5)
    assert rows[(0, 1, "sink_row_max_mass")] == 0.85 and rows[(0, 1, "sink_top_key_position")] == 1
    assert rows[(0, None, "sink_top_first_share")] == 0.5
    assert rows[(0, 0, "sink1_eps")] == 0.5 and rows[(0, 1, "sink1_eps")] == 0.0  # a NaN sequence (no rows) left out
    assert rows[(0, None, "sink1_eps")] == 0.25 and rows[(None, None, "sink1_eps")] == pytest.approx(1 / 3)
    by_position = sinks.received_by_position(sink_table)
    assert by_position.filter(pl.col("head") == 1)["received"].to_list() == [0.5, 4.5]
