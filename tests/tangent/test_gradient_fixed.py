"""Fixed subspaces, the token-embedding change's alignment and the gradient metric rows (anisweep.tangent.fixed,
anisweep.tangent.embedding_change, anisweep.measures.gradient_metrics) against brute force and planted answers."""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pytest
import torch

from anisweep import config as anisweep_config
from anisweep.errors import ConfigError
from anisweep.measures.gradient_metrics import GRADIENT_METRICS, gradient_metric_rows
from anisweep.tangent import embedding_change as ec
from anisweep.tangent import fixed as gs
from anisweep.tangent.analysis import GRADIENT_SCHEMA, analyse
from anisweep.tangent.backward import gradient_pass
from anisweep.tangent.batch import causal_lm_batch, frequency_strata
from anisweep.tangent.settings import GradientSettings
from anisweep.tangent.shares import pca_basis, random_bases

from conftest import tiny_neox_lm


def rows_frame(ids, strata, weights, vectors) -> pl.DataFrame:
    return pl.DataFrame({"token_id": ids, "stratum": strata, "count": [1] * len(ids), "weight": weights}).with_columns(
        pl.Series("vector", np.asarray(vectors, np.float32)).cast(pl.List(pl.Float32))
    )


def brute_share(delta, weight, basis):
    projector = basis @ np.linalg.pinv(basis)
    num = sum(w * np.sum((projector @ v) ** 2) for v, w in zip(delta, weight, strict=True))
    return num / sum(w * np.sum(v**2) for v, w in zip(delta, weight, strict=True))


# --------------------------------------------------------------------------- embedding change
def test_embedding_change_shares_against_brute_force():
    rng = np.random.default_rng(0)
    n, d, k = 60, 12, 3
    e1 = rng.normal(size=(n, d)).astype(np.float32)
    e2 = (e1 + rng.normal(size=(n, d)) * np.linspace(2, 0.1, d)).astype(np.float32)
    strata = np.array(["frequent", "middle", "rare"])[rng.integers(0, 3, n)]
    weight = np.select([strata == "frequent", strata == "middle"], [1.0, 2.0], 5.0)
    raw = rng.normal(size=(d, k))
    basis = np.linalg.qr(raw)[0]
    ids = list(range(100, 100 + n))
    rows = ec.change_rows(
        rows_frame(ids, strata, weight, e1),
        rows_frame(ids[::-1], strata[::-1], weight[::-1], e2[::-1]),  # row order does not matter
        {"checkpoint": {("pca", k): basis}},
        n_random=6,
        seed=3,
        steps=(0, 5),
    )
    delta = e2.astype(np.float64) - e1.astype(np.float64)
    by = {(r["stratum"], r.get("subspace"), r["measure"]): r for r in rows}
    for stratum in ("all", "frequent", "middle", "rare"):
        keep = np.ones(n, bool) if stratum == "all" else strata == stratum
        w = weight[keep] if stratum == "all" else np.ones(keep.sum())
        row = by[(stratum, "pca", "embedding_change_share")]
        assert row["value"] == pytest.approx(brute_share(delta[keep], w, raw), rel=1e-9)
        controls = [brute_share(delta[keep], w, u) for u in random_bases(d, k, 6, 3 + k)]
        assert row["control_mean"] == pytest.approx(np.mean(controls), rel=1e-9)
        assert row["control_sd"] == pytest.approx(np.std(controls, ddof=1), rel=1e-9)
        a = (delta[keep] * w[:, None]).T @ delta[keep]  # the share is tr(P a) / tr(a): the exact null's z
        var = 2 * k * (d - k) / (d * (d - 1) * (d + 2)) * (np.trace(a @ a) - np.trace(a) ** 2 / d) / np.trace(a) ** 2
        assert row["z"] == pytest.approx((row["value"] - k / d) / np.sqrt(var), rel=1e-9)
        assert row["n_tokens"] == keep.sum() and row["step_from"] == 0 and row["chance"] == k / d
        relative = np.sqrt((w @ (delta[keep] ** 2).sum(1)) / (w @ (e1[keep].astype(float) ** 2).sum(1)))
        assert by[(stratum, None, "embedding_change_relative")]["value"] == pytest.approx(relative, rel=1e-9)


def test_a_planted_embedding_change_is_found_and_a_random_one_is_at_chance():
    rng = np.random.default_rng(1)
    n, d, k = 300, 32, 4
    basis = np.linalg.qr(rng.normal(size=(d, k)))[0]
    e1 = rng.normal(size=(n, d))
    planted = e1 + rng.normal(size=(n, k)) @ basis.T * 0.1 + 1e-4 * rng.normal(size=(n, d))
    unrelated = e1 + 0.1 * rng.normal(size=(n, d))
    strata = np.array(["frequent", "middle", "rare"])[np.arange(n) % 3]
    ids, weight = list(range(n)), np.ones(n)
    for e2, expect_found in ((planted, True), (unrelated, False)):
        rows = ec.change_rows(
            rows_frame(ids, strata, weight, e1),
            rows_frame(ids, strata, weight, e2),
            {"fixed": {("seminmf", k): basis}},
            n_random=20,
            seed=0,
            steps=(1, 2),
        )
        for r in rows:
            if r.get("subspace") != "seminmf":
                continue
            if expect_found:
                assert r["value"] > 0.99 and r["z"] > 20, r
            else:
                assert r["value"] == pytest.approx(k / d, abs=0.05) and abs(r["z"]) < 4, r


def test_kept_token_ids_are_a_seeded_stratified_sample():
    rng = np.random.default_rng(2)
    ids = torch.from_numpy(rng.zipf(1.5, size=(8, 50)) % 400)
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[0, 40:] = False
    strata, _ = frequency_strata(ids, valid)
    by_id = {int(i): int(s) for i, s in zip(ids[valid], strata[valid], strict=True)}
    every = ec.sample_ids(ids, valid, 10_000, seed=0)
    assert sorted(every["token_id"]) == sorted(by_id) and (every["weight"] == 1).all()
    for r in every.iter_rows(named=True):
        assert ec.STRATUM_NAMES[by_id[r["token_id"]]] == r["stratum"]
        assert r["count"] == int((ids[valid] == r["token_id"]).sum())
    capped = ec.sample_ids(ids, valid, 30, seed=0)
    assert capped.equals(ec.sample_ids(ids, valid, 30, seed=0))
    assert not capped.equals(ec.sample_ids(ids, valid, 30, seed=1))
    sizes = [int((every["stratum"] == name).sum()) for name in ec.STRATUM_NAMES]
    assert sizes == [1, 4, 60]  # the frequent and middle strata leave most of their thirds to the rare one
    for name, total, quota in zip(ec.STRATUM_NAMES, sizes, [1, 4, 25], strict=True):
        part = capped.filter(pl.col("stratum") == name)
        assert part.height == quota
        assert set(part["token_id"]) <= set(every["token_id"])
        assert np.allclose(part["weight"], total / part.height)
    assert capped.height == 30


def zipf_batch():
    """A batch whose strata hold 2 (frequent), 18 (middle) and 268 (rare) distinct ids."""
    rng = np.random.default_rng(5)
    ids = torch.from_numpy(rng.zipf(1.3, size=(16, 64)) % 2000)
    return ids, torch.ones_like(ids, dtype=torch.bool)


def test_stratum_quotas_pass_unused_budget_on():
    assert ec.stratum_quotas([2, 18, 268], 100) == [2, 18, 80]
    assert ec.stratum_quotas([100, 5, 100], 90) == [43, 5, 42]  # the remainder to the first open stratum
    assert ec.stratum_quotas([10, 40, 100], 90) == [10, 40, 40]
    assert ec.stratum_quotas([100, 100, 100], 90) == [30, 30, 30]
    assert ec.stratum_quotas([100, 100, 100], 91) == [31, 30, 30]
    assert ec.stratum_quotas([0, 50, 50], 60) == [0, 30, 30]
    assert ec.stratum_quotas([1, 2, 3], 100) == [1, 2, 3]
    assert ec.stratum_quotas([5, 5, 5], 0) == [0, 0, 0]
    rng = np.random.default_rng(0)
    for _ in range(200):
        sizes, cap = rng.integers(0, 60, 3).tolist(), int(rng.integers(0, 200))
        quota = ec.stratum_quotas(sizes, cap)
        assert sum(quota) == min(cap, sum(sizes))  # the whole budget, when there are ids for it
        assert all(0 <= q <= n for q, n in zip(quota, sizes, strict=True))
        # a stratum short of its quota is kept whole; the sampled ones differ by at most one id
        sampled = [q for q, n in zip(quota, sizes, strict=True) if q < n]
        assert not sampled or max(sampled) - min(sampled) <= 1
        assert all(n <= max(sampled) for q, n in zip(quota, sizes, strict=True) if q == n) if sampled else True


def test_every_id_is_kept_when_the_budget_allows_and_the_budget_is_used():
    """Issue 28 item 7: each stratum capped at a third of the budget kept 477 of 664 ids under 1,024."""
    ids, valid = zipf_batch()
    every = ec.sample_ids(ids, valid, 10_000, seed=0)
    assert every.height == 288 and (every["weight"] == 1).all()
    for cap in (288, 300):
        assert ec.sample_ids(ids, valid, cap, seed=3).equals(every)  # exact: every distinct id, weight 1
    for cap in (60, 100, 287):
        kept = ec.sample_ids(ids, valid, cap, seed=3)
        assert kept.height == cap and kept["token_id"].n_unique() == cap
        by = {name: kept.filter(pl.col("stratum") == name) for name in ec.STRATUM_NAMES}
        assert by["frequent"].height == 2 and by["middle"].height == 18  # kept whole
        assert by["rare"].height == cap - 20 and np.allclose(by["rare"]["weight"], 268 / (cap - 20))


def test_the_weighted_all_share_is_unbiased_over_seeds():
    """The `all` share of a stratified sample (w = the stratum's ids / its sampled ids) averages to the share over
    every distinct id; the unweighted sample's does not (the small strata are over-represented)."""
    ids, valid = zipf_batch()
    every = ec.sample_ids(ids, valid, 10_000, seed=0)
    rng = np.random.default_rng(6)
    d, k = 16, 4
    basis = np.linalg.qr(rng.normal(size=(d, k)))[0]
    delta = {}
    for r in every.iter_rows(named=True):  # frequent and middle ids move along the basis, rare ones isotropically
        v = rng.normal(size=d) * (0.3 if r["stratum"] == "rare" else 1.0)
        delta[r["token_id"]] = v if r["stratum"] == "rare" else v + basis @ rng.normal(size=k) * 3
    exact = ec.weighted_share(np.stack([delta[i] for i in every["token_id"]]), np.ones(every.height), basis)
    weighted, plain = [], []
    for seed in range(400):
        kept = ec.sample_ids(ids, valid, 60, seed=seed)
        sample = np.stack([delta[i] for i in kept["token_id"]])
        weighted.append(ec.weighted_share(sample, kept["weight"].to_numpy(), basis))
        plain.append(ec.weighted_share(sample, np.ones(kept.height), basis))
    assert np.mean(weighted) == pytest.approx(exact, abs=max(3 * np.std(weighted) / np.sqrt(400), 1e-3))
    assert np.mean(plain) - exact > 0.05


def test_mismatched_token_ids_are_named():
    frame = rows_frame([1, 2], ["rare", "rare"], [1.0, 1.0], np.ones((2, 4)))
    other = rows_frame([1, 3], ["rare", "rare"], [1.0, 1.0], np.ones((2, 4)))
    with pytest.raises(ValueError, match="steps 0 and 8 kept different token ids"):
        ec.change_rows(frame, other, {}, 3, 0, (0, 8))


# --------------------------------------------------------------------------- fixed subspaces
def hidden_frame(x: np.ndarray, layer: int, site: str) -> pl.DataFrame:
    return pl.DataFrame({"layer": [layer] * len(x), "site": [site] * len(x)}).with_columns(
        pl.Series("vector", x.astype(np.float32)).cast(pl.List(pl.Float32))
    )


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_fixed_bases_equal_a_direct_fit_on_the_pooled_sample():
    rng = np.random.default_rng(5)
    d = 10
    tables, pooled = [], {}
    for step in range(3):
        parts = []
        for layer, site in ((0, "resid"), (1, "resid"), (2, "resid"), (2, "final_ln_in"), (2, "final_ln_out")):
            x = rng.normal(size=(40, d)) + step
            if step == 1 and layer == 0:
                x[3] = np.nan  # a non-finite row is dropped, as everywhere
            parts.append(hidden_frame(x, layer, site))
            pooled.setdefault((layer, site), []).append(x[np.isfinite(x).all(1)].astype(np.float32))
        tables.append(pl.concat(parts))
    settings = GradientSettings(rank=[2, 3])
    bases = gs.fit_fixed_bases(tables, settings)
    # the default sites: layers 0 and n_layers // 2, and the final LayerNorm's input and output
    assert sorted({key[:2] for key in bases}) == [(0, "resid"), (1, "resid"), (2, "final_ln_in"), (2, "final_ln_out")]
    for (layer, site, rank), fitted in bases.items():
        x = np.concatenate(pooled[(layer, site)]).astype(np.float64)
        assert len(x) == 119 if layer == 0 else 120
        direct = gs.fit_bases(x, rank, settings.seed, settings.max_iter)
        for method in gs.METHODS:
            np.testing.assert_allclose(fitted[method], direct[method], atol=1e-12)
            np.testing.assert_allclose(fitted[method].T @ fitted[method], np.eye(rank), atol=1e-10)
        np.testing.assert_allclose(direct["pca"], pca_basis(x, rank))
    again = gs.bases_from_frame(gs.bases_frame(bases))
    for key, fitted in bases.items():
        for method in gs.METHODS:
            np.testing.assert_array_equal(again[key][method], fitted[method])


def test_the_fixed_bases_file_names_its_window_and_the_rows_carry_it(tmp_path):
    from anisweep.tables import read_parquet, with_identity, write_atomic

    rng = np.random.default_rng(4)
    paths = []
    for step in (64, 16, 32):
        x = rng.normal(size=(30, 6))
        frame = pl.concat([hidden_frame(x, layer, "resid") for layer in (0, 1, 2)])
        ident = {"family": "toy", "model": "m", "seed": 0, "step": step, "tokens_seen": step * 64}
        paths.append(tmp_path / f"step{step}" / "hidden.parquet")
        write_atomic(with_identity(frame, ident), paths[-1])
    settings = GradientSettings(rank=2, max_iter=2000, final_ln=False)
    gs.fixed_bases_file(paths, settings, tmp_path / "fixed.parquet")
    frame = read_parquet(tmp_path / "fixed.parquet")
    assert frame["window"].unique().to_list() == ["steps 16, 32, 64"] and gs.window_of(frame) == "steps 16, 32, 64"
    tables = [read_parquet(p, columns=["layer", "site", "vector"]) for p in paths]
    direct = gs.fit_fixed_bases(tables, settings)
    for key, by in gs.bases_from_frame(frame).items():
        for method, basis in by.items():
            np.testing.assert_array_equal(basis, direct[key][method])
    # the embedding-change rows of the fixed bases carry the window; the per-checkpoint ones do not
    d, ids = 6, list(range(9))
    strata = ["frequent", "middle", "rare"] * 3
    embeddings = {t: rows_frame(ids, strata, [1.0] * 9, rng.normal(size=(9, d))) for t in (0, 10)}
    layer0 = frame.filter((pl.col("layer") == 0) & (pl.col("site") == "resid"))
    rows = ec.sweep_rows([0, 10], embeddings, {0: layer0.drop("window")}, frame, 4, 0)
    fits = {(r.get("fit"), r.get("window")) for r in rows}
    assert ("fixed", "steps 16, 32, 64") in fits and ("checkpoint", None) in fits
    assert not any(r.get("window") for r in rows if r.get("fit") != "fixed")


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_analyse_with_fixed_bases_equal_to_its_own_gives_the_same_shares(tmp_path):
    model, adapter, batch = tiny_neox_lm(tmp_path)
    lm = causal_lm_batch(batch["input_ids"], batch["attention_mask"].bool())
    settings = GradientSettings(rank=2, n_random=4)
    result = gradient_pass(model, adapter, 32, 2, lm, settings, batch_size=5, progress=False)
    own: dict = {}
    plain = analyse(result, settings, 32, progress=False, bases_out=own)
    both = GradientSettings(rank=2, n_random=4, subspaces="both")
    table = analyse(result, both, 32, progress=False, fixed=own)
    shares = table.filter(pl.col("measure").is_in(["energy_share", "anisotropy_share"]))
    key = ["layer", "site", "stratum", "subspace", "measure"]
    checkpoint = shares.filter(pl.col("fit") == "checkpoint").sort(key)
    fixed = shares.filter(pl.col("fit") == "fixed").sort(key)
    assert fixed.height == checkpoint.height > 0
    for column in ("value", "control_mean", "z"):
        np.testing.assert_allclose(fixed[column], checkpoint[column])
    assert plain.filter(pl.col("fit") == "checkpoint").height == plain["fit"].is_not_null().sum()
    assert (
        plain.filter(pl.col("fit") == "checkpoint")
        .sort(key + ["rank"])
        .equals(table.filter(pl.col("fit") == "checkpoint").sort(key + ["rank"]))
    )
    with pytest.raises(ValueError, match="fixed subspaces but none were given"):
        analyse(result, both, 32, progress=False)
    with pytest.raises(ValueError, match="no basis for layer 0 resid at rank 2"):
        analyse(result, both, 32, progress=False, fixed={})


# --------------------------------------------------------------------------- config
DEFAULT_GRID = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]  # config/config.yaml's toys
PYTHIA_GRID = [0, *(2**i for i in range(10)), *range(1000, 143_001, 1000)]


def test_the_default_fit_window_is_early_training_not_the_initialisation():
    """Issue 28 item 5: the default was the first three swept steps, on log-spaced grids 0, 1, 2 (the
    initialisation's subspaces). Now the swept steps within 1-10% of the final step."""
    assert gs.window_steps(DEFAULT_GRID, None) == [16, 32, 64]
    assert gs.window_steps(DEFAULT_GRID, None, final=1000) == [16, 32, 64]
    assert gs.window_steps(PYTHIA_GRID, None) == list(range(2000, 14_001, 1000))
    assert gs.window_steps(PYTHIA_GRID[::-1] + [2000], None, final=143_000) == list(range(2000, 14_001, 1000))
    multiberts = [0, *range(20_000, 200_001, 20_000), *range(300_000, 2_000_001, 100_000)]
    assert gs.window_steps(multiberts, None) == list(range(20_000, 200_001, 20_000))
    for grid in (DEFAULT_GRID, PYTHIA_GRID, [0, 1, 2, 4, 8, 16]):
        assert 0 not in gs.window_steps(grid, None)  # never the initialisation while a trained step is swept
        assert gs.window_steps(grid, None) != sorted(grid)[:3]
    # the final step is the model's, not the last swept one: Pythia swept up to 1000 is still warming up at 64
    assert gs.window_steps(DEFAULT_GRID, None, final=143_000) == [1000]
    # fallbacks: no swept step in the window -> the nearest trained one on a log scale, the earlier on a tie
    assert gs.window_steps([0, 143_000], None, final=143_000) == [143_000]
    assert gs.window_steps([0, 1, 2], None, final=1000) == [2]
    assert gs.window_steps([0, 5, 500], None, final=5000) == [500]  # 500 is the window's upper end
    assert gs.window_steps([0, 30, 300], None, final=10_000) == [300]  # log distance 0.52 vs 0.48
    assert gs.window_steps([0, 100, 100_000], None, final=100_000) == [100]  # 1 decade each way: the earlier
    assert gs.window_steps([0, 3, 30, 31], None, final=300) == [3, 30]  # the window's ends are in it
    assert gs.window_steps([0], None) == [0]  # only the initialisation is swept
    assert gs.window_steps([7], None) == [7]
    # a pure function of the swept steps and the final step: order and repeats do not matter
    assert gs.window_steps(DEFAULT_GRID[::-1] * 2, None) == [16, 32, 64]
    # check_config takes each model's final step
    section = {"enabled": True, "subspaces": "both", "fit_window": None, "layers": None}
    gs.check_config(section, {"pythia/m": DEFAULT_GRID}, {"pythia/m": 143_000})


def test_window_labels():
    assert gs.window_label([64, 16, 32, 16]) == "steps 16, 32, 64"
    assert gs.window_label([1000]) == "step 1000"
    assert gs.window_label(range(2000, 14_001, 1000)) == "steps 2000-14000 (13 swept steps)"
    assert gs.window_of(pl.DataFrame({"layer": [0]})) is None
    assert gs.window_of(pl.DataFrame({"layer": [0], "window": ["step 8"]})) == "step 8"


def test_window_steps_and_config_errors():
    steps = [0, 1, 2, 4, 8, 16]
    assert gs.window_steps(steps, [0, 2]) == [0, 1, 2]  # the old default, now explicit
    assert gs.window_steps(steps, [3, 8]) == [4, 8]
    with pytest.raises(ConfigError, match=r"fit_window \[9, 12\] holds none of the swept steps of toy/m"):
        gs.window_steps(steps, [9, 12], "toy/m")
    with pytest.raises(ConfigError, match="start <= stop"):
        gs.window_steps(steps, [8, 4])
    section = {"enabled": True, "subspaces": "both", "fit_window": [9, 12], "layers": None}
    with pytest.raises(ConfigError, match="holds none"):
        gs.check_config(section, {"toy/a": steps})
    gs.check_config({**section, "subspaces": "per_checkpoint"}, {"toy/a": steps})  # no fixed fit: no window
    gs.check_config({**section, "enabled": False}, {"toy/a": steps})
    with pytest.raises(ConfigError, match="embedding output \\(layer 0\\)"):
        gs.check_config({"enabled": True, "embedding_change": True, "layers": [1, 2]}, {"toy/a": steps})
    models = {"models": [{"family": "toy", "name": "toy-neox", "steps": "all"}]}
    with pytest.raises(ConfigError, match="gradients.subspaces"):
        anisweep_config.complete({**models, "gradients": {"subspaces": "sometimes"}})
    with pytest.raises(ConfigError, match="gradients.fit_window"):
        anisweep_config.complete({**models, "gradients": {"fit_window": [1, 2, 3]}})
    filled = anisweep_config.complete(models)["gradients"]
    assert filled["subspaces"] == "per_checkpoint" and filled["fit_window"] is None
    assert filled["embedding_change"] is False and filled["embedding_tokens"] == 1024


# --------------------------------------------------------------------------- metric rows
def test_gradient_metric_rows_equal_the_gradients_table():
    rng = np.random.default_rng(7)
    rows = []
    for layer, site in ((0, "resid"), (2, "final_ln_out")):
        for fit in ("checkpoint", "fixed"):
            for subspace in ("seminmf", "pca", "random"):
                for stratum in ("all", "rare"):
                    for rank in (4, 16):
                        for measure in ("energy_share", "anisotropy_share"):
                            v = rng.random(3)
                            rows.append(
                                {"layer": layer, "site": site, "stratum": stratum, "subspace": subspace, "fit": fit,
                                 "rank": rank, "measure": measure, "value": v[0], "control_mean": v[1], "z": v[2]}
                            )  # fmt: skip
    rows.append({"layer": 0, "site": "resid", "stratum": "all", "subspace": "pca", "fit": "checkpoint", "rank": 16,
                 "measure": "explained_variance", "value": 0.5})  # fmt: skip
    table = pl.DataFrame(rows, schema={k: GRADIENT_SCHEMA[k] for k in GRADIENT_SCHEMA if k in rows[0]})
    metric = gradient_metric_rows(table)
    assert len(metric) == 3 * 2 * 2 * 2 * 2 * 2 * 2  # no random, no fit-quality rows; value, control mean, z
    assert {r["metric"] for r in metric} == set(GRADIENT_METRICS) == {
        "grad_energy_share", "grad_energy_share_control_mean", "grad_energy_share_z",
        "grad_anisotropy_share", "grad_anisotropy_share_control_mean", "grad_anisotropy_share_z",
    }  # fmt: skip
    key = ("layer", "site", "metric", "subspace", "fit", "rank", "stratum")
    by = {tuple(r[k] for k in key): r["value"] for r in metric}
    assert len(by) == len(metric)  # the parameter columns tell every row apart
    for r in table.filter(pl.col("measure").is_in(["energy_share", "anisotropy_share"])).iter_rows(named=True):
        for statistic, suffix in (("value", ""), ("control_mean", "_control_mean"), ("z", "_z")):
            where = (r["layer"], r["site"], f"grad_{r['measure']}{suffix}", r["subspace"], r["fit"], r["rank"])
            if r["subspace"] == "random":
                assert (*where, r["stratum"]) not in by
                continue
            assert by[(*where, r["stratum"])] == r[statistic]
    # the parameters are columns, never parts of the name (the old form was grad_energy_share_seminmf_fixed_k16_rare_z)
    assert not any(re.search(r"_k\d+_|seminmf|pca|fixed|frequent|middle|rare", r["metric"]) for r in metric)


def test_gradient_rows_land_in_metrics_parquet_with_their_parameters_as_columns():
    from anisweep.tables import METRIC_KEY, METRIC_SCHEMA, metric_rows

    row = {"layer": 0, "site": "resid", "stratum": "all", "subspace": "pca", "fit": "fixed", "rank": 4,
           "measure": "energy_share", "value": 0.25, "control_mean": 0.125, "z": 3.0}  # fmt: skip
    table = pl.DataFrame([row, {**row, "rank": 8, "value": 0.5}], schema={k: GRADIENT_SCHEMA[k] for k in row})
    ident = {"family": "toy", "model": "m", "seed": 0, "step": 2, "tokens_seen": 20}
    other = [{"layer": 0, "site": "resid", "metric": "avg_cos", "value": 0.5}]
    metrics = metric_rows(ident, other + gradient_metric_rows(table))
    assert list(metrics.schema.items()) == list(METRIC_SCHEMA.items())
    assert set(METRIC_KEY) >= {"subspace", "fit", "rank", "stratum"}
    shares = metrics.filter(pl.col("metric") == "grad_energy_share").sort("rank")
    assert shares.select("subspace", "fit", "rank", "stratum", "value").rows() == [
        ("pca", "fixed", 4, "all", 0.25),
        ("pca", "fixed", 8, "all", 0.5),
    ]
    plain = metrics.filter(pl.col("metric") == "avg_cos")
    assert plain.select("subspace", "fit", "rank", "stratum").rows() == [(None, None, None, None)]
    # without the parameter columns two ranks' rows would be one key: metric_rows refuses such rows
    with pytest.raises(ValueError, match="share their key columns"):
        metric_rows(ident, [{k: v for k, v in r.items() if k != "rank"} for r in gradient_metric_rows(table)])


@pytest.mark.slow  # over 10 s
def test_sweep_with_fixed_and_embedding_change_draws_every_figure(tmp_path):
    from anisweep.plots.gradients import gradient_figures, plot_gradients
    from anisweep.tables import with_identity, write_atomic
    from anisweep.tangent.sweep import gradients_sweep

    model, adapter, batch = tiny_neox_lm(tmp_path)
    settings = GradientSettings(rank=2, n_random=4, subspaces="both", embedding_change=True, embedding_tokens=9)
    fixed = None
    paths, bases_paths, embedding_paths, tables = [], [], [], {}
    for step in (0, 10, 100):
        with torch.no_grad():  # a "training step": perturb the embeddings
            model.get_input_embeddings().weight.add_(0.01 * torch.randn_like(model.get_input_embeddings().weight))
        lm = causal_lm_batch(batch["input_ids"], batch["attention_mask"].bool())
        result = gradient_pass(model, adapter, 32, 2, lm, settings, batch_size=5, progress=False)
        own: dict = {}
        if fixed is None:
            analyse(result, GradientSettings(rank=2, n_random=4), 32, progress=False, bases_out=own)
            fixed = own
        table = analyse(result, settings, 32, progress=False, fixed=fixed, bases_out=own)
        ident = {"family": "toy", "model": "m", "seed": 0, "step": step, "tokens_seen": step * 64}
        folder = tmp_path / f"step{step}"
        paths.append(folder / "gradients.parquet")
        write_atomic(with_identity(table, ident), paths[-1])
        bases_paths.append(folder / "bases.parquet")
        write_atomic(gs.bases_frame({k: v for k, v in own.items() if k[:2] == (0, "resid")}), bases_paths[-1])
        kept = ec.sample_ids(batch["input_ids"], batch["attention_mask"].bool(), settings.embedding_tokens, 0)
        embedding_paths.append(folder / "embeddings.parquet")
        weights = model.get_input_embeddings().weight.detach().numpy()
        write_atomic(ec.embedding_rows(weights, kept), embedding_paths[-1])
        tables[step] = (weights[kept["token_id"].to_numpy()].astype(np.float64), own[(0, "resid", 2)])
    write_atomic(gs.bases_frame(fixed), tmp_path / "fixed.parquet")
    sweep = gradients_sweep(
        paths, bases_paths, embedding_paths, tmp_path / "fixed.parquet", {"rank": 2, "n_random": 4, "subspaces": "both"}
    )
    change = sweep.filter(pl.col("measure") == "embedding_change_share")
    assert sorted(change["step"].unique()) == [10, 100] and sorted(change["step_from"].unique()) == [0, 10]
    row = change.filter(
        (pl.col("step") == 100)
        & (pl.col("stratum") == "all")
        & (pl.col("subspace") == "pca")
        & (pl.col("fit") == "checkpoint")
    )
    (e10, bases10), (e100, _) = tables[10], tables[100]
    weight = kept["weight"].to_numpy()
    assert row["value"][0] == pytest.approx(brute_share(e100 - e10, weight, bases10["pca"]), rel=1e-5)
    assert row["family"][0] == "toy" and row["tokens_seen"][0] == 6400
    names = gradient_figures({"subspaces": "both", "embedding_change": True})
    written = plot_gradients(sweep, tmp_path / "figures", names)
    assert [p.name for p in written] == names and len(names) == 4
    assert all(p.stat().st_size > 10_000 for p in written)
    with pytest.raises(ValueError, match="no fixed-subspace rows"):
        plot_gradients(sweep.filter(pl.col("fit") != "fixed"), tmp_path / "other", ["gradients_fixed.png"])
