"""anisweep.measures.pair_bootstrap: CKA, SVCCA and PWCCA of two steps' samples resampled by the units. The
estimates equal compare's pair tables; a replicate equals compare's functions of the drawn tokens of both steps; the
rows of the bootstrap table, a group's, a non-finite sample's, and CKA without a d x d matrix per replicate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from anisweep.measures import bootstrap, compare, pair_bootstrap, unit_products
from anisweep.measures import sample_bootstrap as sb
from anisweep.results import changes_in
from anisweep.sample_storage import vector_columns
from anisweep.tables import read_parquet

D = 5
N_SEQUENCES = 12
PER_SEQUENCE = 6
SITES = ((0, "resid"), (1, "final_ln_out"))
MEASURES = ("cka", "svcca", "pwcca")
SETTINGS = sb.Settings(samples=200, measures=MEASURES)


def layer_norm(h: np.ndarray) -> np.ndarray:
    """float32 LayerNorm without its affine map: every vector in the hyperplane of mean 0, so the covariance's
    smallest eigenvalue is rounding alone (compare's floor drops it)."""
    h = h.astype(np.float32)
    return (h - h.mean(axis=1, keepdims=True)) / h.std(axis=1, keepdims=True)


def write_checkpoint(folder: Path, step: int, model: str = "toy-a", seed: int = 0, precision: str = "float32") -> Path:
    """A checkpoint with hidden.parquet (rows shuffled, in the same order at every step, as extract writes them) at a
    residual site and a LayerNorm output, the steps of one model drifting from a shared start, and the extract.json
    compare and the bootstrap read."""
    folder.mkdir(parents=True, exist_ok=True)
    n = N_SEQUENCES * PER_SEQUENCE
    base = np.random.default_rng([seed, 99]).normal(size=(n, D)) @ np.diag(np.arange(1, D + 1.0))
    rng = np.random.default_rng([seed, step])
    ident = {"family": "toy", "model": model, "seed": seed, "step": step, "tokens_seen": step * 10}
    frames = []
    for layer, site in SITES:
        h = base @ (np.eye(D) + step / 40 * rng.normal(size=(D, D))) + rng.normal(size=(n, D)) + 3.0
        x = layer_norm(h) if site == "final_ln_out" else h.astype(np.float32)
        frame = pl.DataFrame(
            {k: [v] * n for k, v in ident.items()}
            | {"layer": [layer] * n, "site": [site] * n, "seq": np.arange(n) // PER_SEQUENCE}
            | {"position": np.arange(n) % PER_SEQUENCE, "token_id": np.arange(n) % 17}
        ).with_columns(pl.col("seq", "position", "token_id").cast(pl.Int64))
        frames.append(frame.hstack(vector_columns("vector", x, precision)))
    pl.concat(frames).sample(fraction=1.0, shuffle=True, seed=0).write_parquet(folder / "hidden.parquet")
    settings = {"n_sequences": N_SEQUENCES, "seq_len": 8, "sample_tokens": n, "seed": 0, "dtype": "float32"}
    settings |= {"units": 4, "sample_precision": precision}
    (folder / "extract.json").write_text(json.dumps({"checkpoint": ident, "settings": settings}))
    return folder


@pytest.fixture
def model(tmp_path) -> list[Path]:
    return [write_checkpoint(tmp_path / f"step{s}", s) for s in (0, 10, 30)]


def pair_rows(table: pl.DataFrame) -> pl.DataFrame:
    return table.filter(pl.col("metric").is_in(MEASURES))


def test_the_estimates_are_compares_values_and_each_step_meets_the_previous_and_the_final(model):
    table = pair_rows(sb.bootstrap_table([model], SETTINGS))
    pairs = {(0, 30, "final"), (10, 30, "final"), (10, 0, "previous"), (30, 10, "previous")}
    assert set(table.select("step", "ref_step", "against").iter_rows()) == pairs
    assert table.height == len(pairs) * len(SITES) * len(MEASURES)
    assert table["p"].is_null().all() and set(table["design"]) == {"units"} and set(table["n_units"]) == {4}
    for step, ref_step, _ in pairs:
        folder, ref = (model[[0, 10, 30].index(s)] for s in (step, ref_step))
        expected = compare.compare_pair(folder, ref, compare.Settings(sites=tuple(s for _, s in SITES)))
        for r in expected.iter_rows(named=True):
            got = table.filter(step=step, ref_step=ref_step, layer=r["layer"], site=r["site"], metric=r["metric"])
            tolerance = 1e-6 if r["metric"] == "cka" else 1e-12  # CKA's from the units' float32 products
            assert got["estimate"].item() == pytest.approx(r["value"], rel=tolerance)
    intervals = table.filter(pl.col("low").is_finite())
    assert intervals.height == table.height  # every pair resolved on these samples
    assert (intervals["low"] <= intervals["high"]).all()


@pytest.mark.parametrize("unit_products_fit", [True, False], ids=["unit-products", "row-products"])
def test_a_replicate_is_compares_measure_of_the_drawn_tokens_of_both_steps(model, unit_products_fit, monkeypatch):
    """Both steps' rows of the drawn units, a unit as often as drawn: CKA from the units' products (float32, no
    eigendecomposition) within 1e-5 of compare's on those rows, SVCCA and PWCCA (the replicate's cross-products)
    within 1e-9; with the units' matrices held and without them (a site too wide to hold them)."""
    if not unit_products_fit:
        monkeypatch.setattr(unit_products, "MAX_UNIT_GRAM_ELEMENTS", 0)
        monkeypatch.setattr(pair_bootstrap, "MAX_UNIT_GRAM_ELEMENTS", 0)
    a, b = (sb.read_checkpoint(folder, MEASURES) for folder in (model[1], model[2]))
    rng = np.random.default_rng(3)
    draws = np.concatenate([np.arange(4)[None], rng.integers(0, 4, size=(6, 4))])
    for layer, site in SITES:
        x_side, y_side = a.sites[(layer, site)].pair, b.sites[(layer, site)].pair
        pair = pair_bootstrap.Pair(x_side, y_side, SETTINGS.comparisons)
        unit = np.repeat(np.arange(4), np.diff(x_side.bounds))
        for metric in MEASURES:
            got = pair.values(draws)[metric]
            for value, units in zip(got, draws):
                rows = bootstrap.rows_of_units(unit, units)
                x, y = (side.x[rows].astype(np.float64) for side in (x_side, y_side))
                settings = compare.Settings(measures=(metric,))
                want = compare.builtin_rows(x, y, settings, (x_side.rounding(), y_side.rounding()))[0]["value"]
                assert value == pytest.approx(want, rel=1e-5 if metric == "cka" else 1e-9), (site, metric, units)


def test_ckas_replicates_need_no_eigendecomposition(model, monkeypatch):
    a, b = (sb.read_checkpoint(folder, ("cka",)) for folder in (model[0], model[2]))
    pair = pair_bootstrap.Pair(a.sites[(0, "resid")].pair, b.sites[(0, "resid")].pair, compare.Settings(("cka",)))

    def refused(*args, **kw):
        raise AssertionError("CKA's replicates need no eigendecomposition")

    for name in ("eigh", "eigvalsh", "svd"):
        monkeypatch.setattr(np.linalg, name, refused)
    got = pair.values(np.random.default_rng(0).integers(0, 4, size=(50, 4)))["cka"]
    assert np.isfinite(got).all() and ((got > 0) & (got <= 1 + 1e-12)).all()


def test_a_group_resamples_each_seeds_pairs_on_the_same_draws(tmp_path):
    seeds = [[write_checkpoint(tmp_path / f"s{s}" / f"step{t}", t, f"toy-s{s}", s) for t in (0, 30)] for s in (0, 1)]
    table = pair_rows(sb.bootstrap_table(seeds, SETTINGS, group="g"))
    assert set(table["design"]) == {"seeds and units"} and set(table["n_seeds"]) == {2}
    for r in table.iter_rows(named=True):
        at = {0: 0, 30: 1}
        values = [
            compare.compare_pair(seed[at[r["step"]]], seed[at[r["ref_step"]]], compare.Settings(sites=(r["site"],)))
            .filter(layer=r["layer"], metric=r["metric"])["value"]
            .item()
            for seed in seeds
        ]
        assert r["estimate"] == pytest.approx(np.mean(values), rel=1e-6 if r["metric"] == "cka" else 1e-12)
    # a replicate: the mean over its drawn seeds of each seed's value on its drawn units (bootstrap.draws' first)
    block = next(bootstrap.draws(4, 2, samples=SETTINGS.samples, seed=SETTINGS.seed))
    sides = [[sb.read_checkpoint(folder, MEASURES).sites[(0, "resid")].pair for folder in seed] for seed in seeds]
    pairs = [pair_bootstrap.Pair(a, b, SETTINGS.comparisons) for a, b in sides]
    expected = [np.mean([pairs[s].values(units[None])["pwcca"][0] for s in drawn]) for units, drawn in
                zip(block.units[:5], block.base[:5])]  # fmt: skip
    row = table.filter(step=0, layer=0, site="resid", metric="pwcca")
    assert row.height == 1
    got = sb.comparisons(seeds, SETTINGS, {})[("pwcca", 0, "resid", 0, "final")][2][:5]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_a_non_finite_sample_makes_its_comparisons_nan_and_leaves_the_rest(model):
    path = model[1] / "hidden.parquet"
    hidden = read_parquet(path)
    first = (pl.int_range(pl.len()) == 0).over("layer", "site") & (pl.col("site") == "resid")
    hidden.with_columns(
        vector=pl.when(first).then(pl.lit([float("nan")] * D, pl.List(pl.Float32))).otherwise("vector")
    ).write_parquet(path)
    table = pair_rows(sb.bootstrap_table([model], SETTINGS))
    touched = (pl.col("site") == "resid") & ((pl.col("step") == 10) | (pl.col("ref_step") == 10))
    assert table.filter(touched)["estimate"].is_nan().all() and set(table.filter(touched)["undefined"]) == {200}
    assert table.filter(~touched)["estimate"].is_finite().all()


def test_svcca_and_pwcca_wider_than_cca_max_width_are_left_out():
    settings = sb.Settings(samples=10, measures=MEASURES, cca_max_width=D - 1)
    assert settings.comparisons.cca_measures(D) == ()
    assert settings.comparisons.cca_measures(D - 1) == ("svcca", "pwcca")


def test_the_comparisons_are_not_step_changes(model):
    """changes_in reads the step tests alone: a CKA interval (far from 0, `against` previous or final) is not one."""
    table = sb.bootstrap_table([model], sb.Settings(samples=200, measures=("cka",)))
    assert (table["low"] > 0).all()
    assert changes_in(table, against="previous").is_empty() and changes_in(table, against="final").is_empty()


def test_steps_out_of_order_are_refused_for_the_comparisons(model):
    with pytest.raises(sb.BootstrapInputError, match="in step order"):
        sb.bootstrap_table([[model[1], model[0], model[2]]], SETTINGS)


def test_two_groups_comparisons_of_two_steps_are_tested_against_each_other(tmp_path):
    """bootstrap_compare with CKA: a row per step, pair and site; each side's estimate its own group table's, and
    a group paired with itself differs by exactly 0 in every replicate (p 1)."""
    from anisweep.measures.group_bootstrap import comparison_table

    def group(name, seeds):
        return [[write_checkpoint(tmp_path / name / f"s{s}" / f"step{t}", t, f"toy-{name}{s}", s) for t in (0, 10, 30)]
                for s in seeds]  # fmt: skip

    a, b = group("a", (0, 1)), group("b", (2, 3, 4))
    settings = sb.Settings(samples=100, measures=("cka",))
    table = comparison_table(a, b, design="unpaired", settings=settings)
    assert set(table.select("step", "ref_step", "pair").iter_rows()) == {
        (0, 30, "final"), (10, 30, "final"), (10, 0, "previous"), (30, 10, "previous")
    }  # fmt: skip
    assert table.height == 4 * len(SITES) and set(table["against"]) == {"group"}
    own = {name: pair_rows(sb.bootstrap_table(g, settings, group=name)) for name, g in (("a", a), ("b", b))}
    for r in table.iter_rows(named=True):
        where = dict(step=r["step"], ref_step=r["ref_step"], against=r["pair"], layer=r["layer"], site=r["site"])
        assert r["base_estimate"] == own["a"].filter(**where)["estimate"].item()
        assert r["other_estimate"] == own["b"].filter(**where)["estimate"].item()
        assert r["estimate"] == pytest.approx(r["other_estimate"] - r["base_estimate"], abs=1e-15)
    same = comparison_table(a, a, design="paired", settings=settings)
    assert (same["estimate"] == 0).all() and (same["low"] == 0).all() and (same["high"] == 0).all()
    assert (same["p"] == 1).all()


@pytest.mark.parametrize("precision", ["float16", "int8"])
def test_the_cca_estimates_follow_the_samples_storage_as_compare_does(tmp_path, precision):
    """Stored at float16 or int8 (extract.sample_precision), each side's rounding floor is its storage's: SVCCA's and
    PWCCA's estimates are compare's (which reads the same bound) on the LayerNorm output too, and the full draw
    (every unit once) is the estimate."""
    model = [write_checkpoint(tmp_path / f"step{s}", s, precision=precision) for s in (0, 30)]
    table = pair_rows(sb.bootstrap_table([model], SETTINGS)).filter(pl.col("metric") != "cka")
    expected = compare.compare_pair(model[0], model[1], compare.Settings(sites=tuple(s for _, s in SITES)))
    got = table.filter(step=0).join(expected.select("layer", "site", "metric", "value"), on=["layer", "site", "metric"])
    assert got.height == len(SITES) * 2 and got["value"].is_finite().all()
    np.testing.assert_allclose(got["estimate"], got["value"], rtol=1e-12)
    a, b = (sb.read_checkpoint(folder, MEASURES) for folder in model)
    for layer, site in SITES:
        pair = pair_bootstrap.Pair(a.sites[(layer, site)].pair, b.sites[(layer, site)].pair, SETTINGS.comparisons)
        whole = np.arange(4)[None]
        for metric in ("svcca", "pwcca"):
            assert pair.values(whole)[metric][0] == pytest.approx(pair.estimates()[metric], rel=1e-9)
