"""qk_svd against numpy's SVD on planted data, the Q/K anisotropy metrics against brute force, and the
distribution figures drawn from synthetic tables."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import transformers

from anisweep import config
from anisweep.measures import geometry
from anisweep.measures import spectra as spectra_module
from anisweep.measures.metrics import checkpoint_metrics, qk_sample_rows
from anisweep.mechanism import qk_svd
from anisweep.plots import distributions as plots_distributions
from anisweep.tables import IDENTITY, write_atomic

from conftest import neox_config, padded_batch, run_extract, saved

D = 8


def planted(rng, direction, q_scale, k_scale, n=60, noise=0.3):
    return q_scale * direction + noise * rng.standard_normal((n, D)), k_scale * direction + noise * rng.standard_normal(
        (n, D)
    )


def unit(i):
    u = np.zeros(D)
    u[i] = 1.0
    return u


def test_directions_match_numpy_svd_up_to_sign():
    x = np.random.default_rng(0).standard_normal((40, D)) + 2.0 * unit(3)
    v, singular, used = qk_svd.directions(x, fraction=1.0, seed=0)
    _, s, vt = np.linalg.svd(x, full_matrices=False)
    assert used == 40
    np.testing.assert_allclose(singular, s, rtol=1e-10)
    for i in range(2):
        assert abs(v[i] @ vt[i]) == pytest.approx(1.0, abs=1e-10)
        assert v[i][np.abs(v[i]).argmax()] > 0  # the sign convention


def test_vectors_by_head_split_one_layer_by_head_rope_and_step_in_row_order():
    samples = pl.DataFrame(
        {
            "step": [8, 0, 8, 0, 0, 8],
            "head": [1, 1, 0, 0, 1, 1],
            "rope": ["pre"] * 6,
            "q": [[float(i), 0.0] for i in range(6)],
            "k": [[0.0, float(i)] for i in range(6)],
        }
    )
    by_head = qk_svd._vectors_by_head(samples)
    assert list(by_head) == [(0, "pre"), (1, "pre")]
    q_by_step, k_by_step = by_head[(1, "pre")]
    assert list(q_by_step) == [0, 8]
    np.testing.assert_array_equal(q_by_step[0][:, 0], [1.0, 4.0])
    np.testing.assert_array_equal(k_by_step[8][:, 1], [0.0, 5.0])
    assert q_by_step[8].dtype == np.float64
    assert qk_svd._vectors_by_head(samples.clear()) == {}


def test_directions_use_a_seeded_share():
    x = np.random.default_rng(1).standard_normal((100, D))
    a, sa, used = qk_svd.directions(x, fraction=0.2, seed=3)
    b, sb, _ = qk_svd.directions(x, fraction=0.2, seed=3)
    _, sc, _ = qk_svd.directions(x, fraction=0.2, seed=4)
    assert used == 20
    np.testing.assert_array_equal(sa, sb)
    assert not np.allclose(sa, sc)
    with pytest.raises(ValueError, match="at least 2 finite vectors"):
        qk_svd.directions(np.full((5, D), np.nan), 1.0, 0)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_planted_common_drift_is_recovered_and_projected(sign):
    """Queries drift along u, keys along sign * u: direction 1 of every basis is u, and the projected means follow
    the planted drift (same or opposite direction)."""
    rng = np.random.default_rng(2)
    u = np.array([0.1, 0.2, 0.9, 0.1, 0.0, 0.3, 0.1, 0.2])
    u /= np.linalg.norm(u)
    q_by, k_by, q_means, k_means = {}, {}, {}, {}
    for step, scale in zip((0, 10, 100), (0.0, 2.0, 5.0)):
        q_by[step], k_by[step] = planted(rng, u, scale, sign * scale)
        q_means[step], k_means[step] = q_by[step].mean(0), k_by[step].mean(0)
    rows, bases = qk_svd.head_rows(q_by, k_by, q_means, k_means, fraction=0.5, seed=0)
    for basis, v in bases.items():
        assert abs(v[0] @ u) > 0.99, basis
    table = pl.DataFrame(rows)
    assert table.height == 3 * 3
    for r in table.iter_rows(named=True):
        v = bases[r["basis"]]
        assert r["q_1"] == pytest.approx(v[0] @ q_means[r["step"]], abs=1e-12)
        assert r["k_2"] == pytest.approx(v[1] @ k_means[r["step"]], abs=1e-12)
        assert r["sv_share_1"] > r["sv_share_2"] > 0
    common = table.filter(pl.col("basis") == "common").sort("step")
    q1, k1 = common["q_1"].to_numpy(), common["k_1"].to_numpy()
    assert abs(q1[0]) < 0.2 and q1[-1] == pytest.approx(5.0 * (u @ bases["common"][0]), abs=0.2)
    assert np.sign(k1[-1]) == np.sign(q1[-1]) * sign
    # the union's SVD with every row is numpy's
    union = np.concatenate([*q_by.values(), *k_by.values()])
    full_rows, full_bases = qk_svd.head_rows(q_by, k_by, q_means, k_means, fraction=1.0, seed=0)
    assert full_rows[0]["sv_1"] == pytest.approx(np.linalg.svd(union, compute_uv=False)[0], rel=1e-10)


def synthetic_model(tmp_path, steps=(0, 5, 50), n_heads=3, layers=2, n=40):
    """extract folders of a fake model: head h of every layer drifts with qk cos sign (+, -, none)."""
    rng = np.random.default_rng(0)
    dirs = []
    for i, step in enumerate(steps):
        out = tmp_path / f"step{step}"
        out.mkdir()
        ident = {"family": "toy", "model": "fake", "seed": 0, "step": step, "tokens_seen": step * 10}
        samples, means = [], []
        for layer in range(layers):
            for head in range(n_heads):
                signs = [1.0, -1.0, 0.0][head % 3]
                q, k = planted(rng, unit(head), float(i), signs * i, n=n)
                samples.append(
                    pl.DataFrame({"layer": [layer] * n, "head": [head] * n, "rope": ["pre"] * n}).with_columns(
                        pl.Series("q", q.astype(np.float32)).cast(pl.List(pl.Float32)),
                        pl.Series("k", k.astype(np.float32)).cast(pl.List(pl.Float32)),
                    )
                )
                qm, km = q.mean(0), k.mean(0)
                cos = float(qm @ km / np.linalg.norm(qm) / np.linalg.norm(km))
                means.append({"layer": layer, "head": head, "rope": "pre", "q_mean": qm, "k_mean": km, "qk_cos": cos})
        for name, df in (("qk_sample", pl.concat(samples)), ("qk", pl.DataFrame(means))):
            write_atomic(df.with_columns(*[pl.lit(v).alias(k) for k, v in ident.items()]), out / f"{name}.parquet")
        dirs.append(out)
    return dirs


def test_default_fit_is_the_svd_of_the_whole_union(tmp_path):
    """By default (the schema's qk_svd.fraction and the functions' own) the SVD is fitted on every sampled q and k
    vector of every step: its singular values and directions are numpy's SVD of the union read back from the
    parquet files independently."""
    run = config.complete({"models": [{"family": "toy", "name": "t", "steps": [0]}]})
    assert run["qk_svd"]["fraction"] == qk_svd.DEFAULT_FRACTION == 1.0
    dirs = synthetic_model(tmp_path, n=40)
    table, _ = qk_svd.qk_svd(dirs)
    samples = pl.concat([pl.read_parquet(d / "qk_sample.parquet") for d in dirs])
    means = pl.concat([pl.read_parquet(d / "qk.parquet") for d in dirs])
    checked = 0
    for (layer, head), group in samples.group_by("layer", "head"):
        q, k = (np.stack(group[c].to_list()).astype(np.float64) for c in ("q", "k"))
        for basis, union in (("common", np.concatenate([q, k])), ("q", q), ("k", k)):
            _, s, vt = np.linalg.svd(union, full_matrices=False)
            rows = table.filter((pl.col("layer") == layer) & (pl.col("head") == head) & (pl.col("basis") == basis))
            assert rows["n_svd"].unique().to_list() == [len(union)] == [3 * 40 * (2 if basis == "common" else 1)]
            np.testing.assert_allclose(rows["sv_1"].to_numpy(), s[0], rtol=1e-9)
            np.testing.assert_allclose(rows["sv_2"].to_numpy(), s[1], rtol=1e-9)
            np.testing.assert_allclose(rows["sv_share_1"].to_numpy(), s[0] / s.sum(), rtol=1e-9)
            for r in rows.iter_rows(named=True):
                m = means.filter((pl.col("layer") == layer) & (pl.col("head") == head) & (pl.col("step") == r["step"]))
                q_mean, k_mean = (np.asarray(m[c][0], np.float64) for c in ("q_mean", "k_mean"))
                for i in range(2):
                    sign = np.sign(vt[i][np.abs(vt[i]).argmax()])  # the module's sign convention
                    assert r[f"q_{i + 1}"] == pytest.approx(sign * vt[i] @ q_mean, abs=1e-9)
                    assert r[f"k_{i + 1}"] == pytest.approx(sign * vt[i] @ k_mean, abs=1e-9)
            checked += 1
    assert checked == 2 * 3 * 3


def test_fraction_outside_zero_one_is_refused():
    x = np.random.default_rng(0).standard_normal((10, D))
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"qk_svd.fraction must be in \(0, 1\]"):
            qk_svd.directions(x, bad, 0)


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_qk_svd_of_a_model_and_its_figures(tmp_path):
    dirs = synthetic_model(tmp_path)
    table, extras = qk_svd.qk_svd(dirs, fraction=0.5, seed=0)
    assert table.height == 2 * 3 * 3 * 3  # layers x heads x bases x steps
    assert table.columns[:5] == list(IDENTITY)
    assert table.filter(pl.col("step") == 50)["tokens_seen"].unique().to_list() == [500]
    final = table.filter((pl.col("step") == 50) & (pl.col("basis") == "common"))
    opposite = final.filter(pl.col("head") == 1)
    assert (np.sign(opposite["q_1"]) == -np.sign(opposite["k_1"])).all()
    assert qk_svd.select_heads(extras["final_qk"], "auto") == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert qk_svd.select_heads(extras["final_qk"], [[1, 2]]) == [(1, 2)]
    with pytest.raises(ValueError, match=r"\[\(5, 0\)\] are not \(layer, head\) pairs"):
        qk_svd.select_heads(extras["final_qk"], [[5, 0]])
    paths = plots_distributions.qk_svd_figures(table, extras, "auto", tmp_path / "figures")
    assert [p.name for p in paths] == list(qk_svd.FIGURES) and all(p.stat().st_size > 10_000 for p in paths)


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
def test_score_hist_figure(tmp_path):
    rows = []
    for step in (0, 10):
        for layer in range(2):
            for b in range(6):
                rows.append({"family": "toy", "model": "m", "step": step, "layer": layer, "bin": b, "count": b + step})
    hist = pl.DataFrame(rows).with_columns(
        pl.col("bin").cast(pl.Float64).sub(3.0).alias("bin_lo"), pl.col("bin").cast(pl.Float64).sub(2.0).alias("bin_hi")
    )
    plots_distributions.score_hist_figure(hist, tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 10_000


def score_table(counts_by_step: dict[int, list[int]], low=-2.0, width=0.5) -> pl.DataFrame:
    """score_hist rows of one layer: counts[0] the underflow bin, counts[-1] the overflow bin."""
    rows = []
    for step, counts in counts_by_step.items():
        n = len(counts) - 2
        edges = [-np.inf, *(low + width * np.arange(n + 1)), np.inf]
        for b, c in enumerate(counts):
            rows.append(
                {"family": "toy", "model": "m", "step": step, "layer": 0, "bin": b, "count": c}
                | {"bin_lo": edges[b], "bin_hi": edges[b + 1]}
            )
    return pl.DataFrame(rows)


def test_score_hist_names_unresolved_steps_and_zooms_to_the_occupied_bins():
    """Steps whose scores all fall in two bins are named as too narrow for the bins; the x range is the occupied
    bins plus one each side; nothing outside the bins reads 'none' (not '0.0% below, 0.0% above')."""
    hist = score_table(
        {
            0: [0, 0, 0, 0, 5, 7, 0, 0, 0, 0, 0, 0],  # bins [-0.5, 0) and [0, 0.5)
            1: [0, 0, 0, 0, 3, 9, 0, 0, 0, 0, 0, 0],
            2: [0, 0, 1, 2, 5, 7, 2, 1, 0, 0, 0, 0],  # six bins, [-1.5, 1.5)
        }
    )
    data = plots_distributions.score_hist_panel_data(hist, 0)
    assert data["xlim"] == (-2.0, 2.0)  # occupied [-1.5, 1.5) plus one bin each side
    assert [u[0] for u in data["unresolved"]] == [0, 1]
    assert data["unresolved"][0][1:] == (-0.5, 0.5, 2)
    np.testing.assert_allclose(data["shares"][0][3:5], [5 / 12, 7 / 12])
    words = plots_distributions._unresolved_words(data["unresolved"], data["steps"], 0.5)
    assert words.startswith("steps 0-1: every score in [-0.5, 0.5)") and "2 bins of width 0.5" in words
    assert plots_distributions._outside_words(0.0, 0.0, -20.0, 20.0) == "scores outside the bins (-20 to 20): none"
    assert plots_distributions._outside_words(0.0123, 0.0, -20.0, 20.0) == (
        "scores outside the bins: 1.23% below -20, none above 20"
    )


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    """A tiny rotary model's extract tables, written to a folder."""
    tmp_path = tmp_path_factory.mktemp("neox")
    path = saved(tmp_path, transformers.GPTNeoXForCausalLM, neox_config(), "m")
    tables, _ = run_extract(path, padded_batch(), qk_sample_tokens=25)
    for name, df in tables.items():
        write_atomic(df, tmp_path / f"{name}.parquet")
    return tables, tmp_path


def test_q_and_k_anisotropy_metrics_match_brute_force(extracted):
    tables, folder = extracted
    metrics = checkpoint_metrics(folder)
    checked = 0
    for (layer, head, rope), group in tables["qk_sample"].group_by("layer", "head", "rope"):
        for which in ("q", "k"):
            x = np.stack(group[which].to_list()).astype(np.float64)
            u = x / np.linalg.norm(x, axis=1, keepdims=True)
            n = len(x)
            cos = (u @ u.T - np.eye(n)).sum() / (n * (n - 1))
            ratio = np.linalg.norm(x.mean(0)) / np.linalg.norm(x, axis=1).mean()
            got = metrics.filter(
                (pl.col("layer") == layer) & (pl.col("head") == head) & (pl.col("site") == f"qk_{rope}")
            )
            assert got.filter(pl.col("metric") == f"{which}_avg_cos")["value"].item() == pytest.approx(cos, abs=1e-9)
            assert got.filter(pl.col("metric") == f"{which}_drift_ratio")["value"].item() == pytest.approx(
                ratio, rel=1e-9
            )
            checked += 1
    assert checked == 2 * 4 * 2 * 2  # layers x heads x ropes x (q, k)
    assert len(qk_sample_rows(tables["qk_sample"])) == checked * 2


def test_spectra_match_numpy_svd(extracted):
    tables, folder = extracted
    spectra = spectra_module.checkpoint_spectra(folder)
    assert spectra.columns[:5] == list(IDENTITY)
    hidden = tables["hidden"].filter((pl.col("layer") == 2) & (pl.col("site") == "resid"))
    x = np.stack(hidden["vector"].to_list()).astype(np.float64)
    s = np.linalg.svd(x, compute_uv=False)
    got = spectra.filter((pl.col("vectors") == "hidden") & (pl.col("layer") == 2) & (pl.col("site") == "resid"))
    np.testing.assert_allclose(got.sort("index")["singular_value"].to_numpy(), s, rtol=1e-9)
    np.testing.assert_allclose(got.sort("index")["share"].to_numpy(), s / s.sum(), rtol=1e-9)
    assert got["head"].is_null().all() and got["n"].unique().to_list() == [len(x)]
    sample = tables["qk_sample"].filter((pl.col("layer") == 1) & (pl.col("head") == 3) & (pl.col("rope") == "post"))
    k = np.stack(sample["k"].to_list()).astype(np.float64)
    got = spectra.filter(
        (pl.col("vectors") == "k") & (pl.col("layer") == 1) & (pl.col("head") == 3) & (pl.col("site") == "qk_post")
    ).sort("index")
    np.testing.assert_allclose(got["singular_value"].to_numpy(), np.linalg.svd(k, compute_uv=False), rtol=1e-9)
    n_groups = spectra.select("layer", "head", "site", "vectors").unique().height
    assert n_groups == tables["hidden"].select("layer", "site").unique().height + 2 * 4 * 2 * 2


def test_planted_rank_one_spectrum():
    u = np.random.default_rng(0).standard_normal(6)
    singular, share = spectra_module.spectrum(np.outer(np.arange(1, 9), u))
    assert share[0] == pytest.approx(1.0) and np.allclose(share[1:], 0, atol=1e-12)
    assert singular[0] == pytest.approx(np.linalg.norm(np.arange(1, 9)) * np.linalg.norm(u))


def test_isotropic_cos_spread_is_the_spread_of_normal_pairs():
    rng = np.random.default_rng(0)
    for d in (16, 256):
        a, b = rng.standard_normal((2, 20_000, d))
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        assert abs(cos.mean()) < 0.01
        assert cos.std() == pytest.approx(geometry.isotropic_cos_spread(d), rel=0.03)
