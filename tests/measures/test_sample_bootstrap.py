"""anisweep.measures.sample_bootstrap: the Multi-Bootstrap of the sampled vectors' measures from hidden.parquet,
on synthetic checkpoint folders: estimates equal to metrics' values, replicates equal to the measures of the
resampled vectors, the intervals and step tests, groups of seeds and the refusals."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from anisweep.measures import bootstrap, geometry, metrics, spectra, spectral, unit_products
from anisweep.measures import sample_bootstrap as sb
from anisweep.tables import IDENTITY, metric_rows, read_parquet

N_SEQUENCES = 12
D = 6
SITES = ((0, "resid"), (1, "resid"))


def tokens(n_sequences: int = N_SEQUENCES, seed: int = 0) -> list[tuple[int, int, int]]:
    """The sampled (seq, position, token_id), sorted: a few positions of every sequence but the last."""
    rng = np.random.default_rng(seed)
    rows = []
    for seq in range(n_sequences - 1):  # the last sequence has no sampled token: a unit drawn with nothing in it
        for position in sorted(rng.choice(32, size=int(rng.integers(3, 8)), replace=False)):
            rows.append((seq, int(position), int(rng.integers(0, 100))))
    return rows


def write_checkpoint(
    folder: Path, model: str, step: int, scale: float = 1.0, seed: int = 0, sample: list | None = None
) -> Path:
    """A checkpoint folder with hidden.parquet (anisotropic Gaussian vectors, each dimension scaled by
    `scale` ** i), the extract.json fields the bootstrap reads and metrics.parquet's rows of the sampled vectors."""
    folder.mkdir(parents=True, exist_ok=True)
    sample = sample or tokens()
    rng = np.random.default_rng([seed, step])
    rows = []
    for layer, site in SITES:
        x = rng.normal(size=(len(sample), D)) * scale ** np.arange(D) + 0.3
        for (seq, position, token_id), vector in zip(sample, x):
            rows.append(
                {"family": "toy", "model": model, "seed": seed, "step": step, "tokens_seen": step * 10}
                | {"layer": layer, "site": site, "seq": seq, "position": position, "token_id": token_id}
                | {"vector": vector.astype(np.float32).tolist()}
            )
    pl.DataFrame(rows).with_columns(pl.col("vector").cast(pl.List(pl.Float32))).write_parquet(folder / "hidden.parquet")
    (folder / "extract.json").write_text(json.dumps({"settings": {"n_sequences": N_SEQUENCES}}))
    write_metrics(folder)
    return folder


def write_metrics(folder: Path) -> None:
    """metrics.parquet's rows of the sampled vectors, as the metrics job writes them (its sample_geometry and
    spectral_shape measures, from hidden.parquet)."""
    hidden = read_parquet(folder / "hidden.parquet")
    ident = {key: hidden[key][0] for key in IDENTITY}
    with warnings.catch_warnings():  # a site without spread: the metrics job warns, its values are NaN
        warnings.simplefilter("ignore")
        frames = [
            metric_rows(ident, metrics.sample_rows(hidden), "sample_geometry"),
            metric_rows(ident, metrics.spectral_rows(hidden), "spectral_shape"),
        ]
    pl.concat(frames).write_parquet(folder / "metrics.parquet")


@pytest.fixture
def model(tmp_path) -> list[Path]:
    return [write_checkpoint(tmp_path / f"step{s}", "toy-a", s, scale) for s, scale in ((0, 1.0), (8, 1.2), (32, 2.0))]


# the measures defined on these 6-dimensional clouds (alpha_req fits ranks 12 on: test_alpha_req_... below)
DEFINED = tuple(m for m in sb.MEASURES if m != "alpha_req")
SETTINGS = sb.Settings(samples=300, measures=DEFINED)


def test_the_estimates_are_metrics_values_exactly(model):
    table = sb.bootstrap_table([model], SETTINGS)
    for folder in model:
        hidden = read_parquet(folder / "hidden.parquet")
        step = hidden["step"][0]
        expected = {
            (r["metric"], r["layer"], r["site"]): r["value"]
            for r in metrics.sample_rows(hidden) + metrics.spectral_rows(hidden)
            if r["metric"] in DEFINED
        }
        got = table.filter(pl.col("against").is_null() & (pl.col("step") == step))
        assert got.height == len(expected) == len(SITES) * len(DEFINED)
        for r in got.iter_rows(named=True):
            assert r["estimate"] == expected[(r["metric"], r["layer"], r["site"])]


def test_the_estimates_are_read_from_metrics_parquet_not_recomputed(model):
    """A value planted in metrics.parquet (and a NaN) is the estimate: the table reads it, it does not recompute it.
    A row of one head is not the layer's value."""
    table = read_parquet(model[0] / "metrics.parquet")
    at = (pl.col("layer") == 1) & (pl.col("site") == "resid")
    table = table.with_columns(
        value=pl.when(at & (pl.col("metric") == "isoscore"))
        .then(0.25)
        .when(at & (pl.col("metric") == "rankme"))
        .then(float("nan"))
        .otherwise(pl.col("value"))
    )
    other = table.filter(at & (pl.col("metric") == "isoscore")).with_columns(
        value=pl.lit(0.75), head=pl.lit(0, pl.Int64)
    )
    pl.concat([table, other]).write_parquet(model[0] / "metrics.parquet")
    got = sb.bootstrap_table([model], SETTINGS).filter(
        pl.col("against").is_null() & (pl.col("step") == 0) & (pl.col("layer") == 1)
    )
    estimate = dict(zip(got["metric"], got["estimate"]))
    assert estimate["isoscore"] == 0.25 and np.isnan(estimate["rankme"])
    assert (
        estimate["top_eig_share"]
        == read_parquet(model[0] / "metrics.parquet").filter(at & (pl.col("metric") == "top_eig_share"))["value"][0]
    )


def test_a_missing_metrics_table_or_row_names_the_file_and_the_fix(model):
    path = model[1] / "metrics.parquet"
    table = read_parquet(path)
    table.filter(~((pl.col("metric") == "rankme") & (pl.col("layer") == 1))).write_parquet(path)
    with pytest.raises(
        sb.BootstrapInputError, match=r"step8/metrics.parquet: no rankme row at layer 1 resid.*rerun its metrics job"
    ):
        sb.bootstrap_table([model], SETTINGS)
    sb.read_checkpoint(model[1], ("isoscore",))  # only the measures resampled need their rows
    path.unlink()
    with pytest.raises(sb.BootstrapInputError, match=r"step8/metrics.parquet: missing.*rerun its metrics job"):
        sb.bootstrap_table([model], SETTINGS)


DIRECT = {  # each measure of a cloud of vectors as metrics computes it (metrics.sample_rows, spectral_rows)
    "isoscore": geometry.isoscore,
    "top_eig_share": geometry.top_eig_share,
    "rankme": lambda x: spectral.rankme(spectra.spectrum(x)[0]),
    "rankme_cov": lambda x: spectral.rankme(spectral.covariance_eigenvalues(x)),
    "alpha_req": lambda x: spectral.alpha_req(spectral.covariance_eigenvalues(x))[0],
    "prop_effective_rank": lambda x: spectral.proportional_effective_rank(spectra.spectrum(x)[0]),
}


@pytest.mark.parametrize("n", [60, 200])
def test_alpha_req_of_a_replicate_is_the_drawn_vectors(n):
    """alpha_req (ranks 12 to 100 of 130 dimensions) and the other spectral measures of replicates of a power-law
    cloud, from the units' moments, equal metrics' functions of the drawn vectors: with more vectors than dimensions,
    and with fewer (a rank-deficient covariance: the SVD's exact zeros, which the eigenvalues' rounding must not
    count as positive ranks)."""
    rng = np.random.default_rng(n)
    d = 130
    x = (rng.standard_normal((n, d)) * np.arange(1, d + 1) ** -0.8 + 0.5).astype(np.float32).astype(np.float64)
    unit = np.arange(n) % 10
    site = sb.SiteSample.of(x, unit, 10, ("alpha_req",))
    draws = np.concatenate([np.arange(10)[None], rng.integers(0, 10, size=(8, 10))])
    for metric in ("alpha_req", "rankme_cov", "prop_effective_rank", "rankme", "top_eig_share"):
        got = site.values(metric, draws)
        for value, units in zip(got, draws):
            want = DIRECT[metric](x[bootstrap.rows_of_units(unit, units)])
            assert value == pytest.approx(want, rel=1e-8), (metric, units)
    assert np.isfinite(site.values("alpha_req", draws)).all()


def checkpoint_vectors(folder: Path, layer: int, site: str) -> np.ndarray:
    """hidden.parquet's vectors at (layer, site), float64, in the table's order."""
    hidden = read_parquet(folder / "hidden.parquet").filter((pl.col("layer") == layer) & (pl.col("site") == site))
    return np.asarray(hidden["vector"].to_list(), dtype=np.float64)


@pytest.mark.parametrize("metric", sb.MEASURES)
@pytest.mark.parametrize("unit_grams", [True, False], ids=["unit-grams", "weighted-rows"])
def test_a_replicate_is_the_measure_of_the_drawn_sequences_vectors(model, metric, unit_grams, monkeypatch):
    """Every sampled vector of a drawn sequence, as often as it is drawn: the value equals the metric computed from
    those vectors themselves (the full sample, and random draws), up to rounding; with the per-sequence Gram
    matrices and without them (a site too large to hold them; IsoScore's K from each unit's products with every
    row)."""
    if not unit_grams:
        monkeypatch.setattr(sb, "MAX_UNIT_GRAM_ELEMENTS", 0)
        monkeypatch.setattr(unit_products, "MAX_UNIT_GRAM_ELEMENTS", 0)
    checkpoint = sb.read_checkpoint(model[1], sb.MEASURES)
    site = checkpoint.sites[(1, "resid")]
    direct = DIRECT[metric]
    rng = np.random.default_rng(1)
    draws = np.concatenate([np.arange(N_SEQUENCES)[None], rng.integers(0, N_SEQUENCES, size=(5, N_SEQUENCES))])
    got = site.values(metric, draws)
    vectors = checkpoint_vectors(model[1], 1, "resid")
    rtol = 2e-5 if metric == "isoscore" else 1e-10  # IsoScore's products are float32 matrix products (unit_products)
    for value, units in zip(got, draws):
        x = vectors[bootstrap.rows_of_units(site.unit, units)]
        assert value == pytest.approx(direct(x), rel=rtol, abs=1e-12, nan_ok=True)
    assert got[0] == pytest.approx(checkpoint.exact[(metric, 1, "resid")], rel=rtol / 100, nan_ok=True)


@pytest.mark.parametrize("unit_grams", [True, False], ids=["unit-grams", "weighted-rows"])
def test_the_measures_of_a_site_share_each_replicates_moments(model, unit_grams, monkeypatch):
    """Each measure alone and all three at once give the same table, bit for bit; the two of the replicates' moments
    build them once: as many Gram matrices as one measure alone (in several chunks of replicates); IsoScore none."""
    if not unit_grams:
        monkeypatch.setattr(sb, "MAX_UNIT_GRAM_ELEMENTS", 0)
    monkeypatch.setattr(sb, "CHUNK_ELEMENTS", 40 * D * D)  # 300 replicates in 8 chunks
    calls = []
    moments = sb.SiteSample.moments
    monkeypatch.setattr(
        sb.SiteSample, "moments", lambda site, counts: calls.append(len(counts)) or moments(site, counts)
    )
    together = sb.bootstrap_table([model], SETTINGS)
    built = list(calls)
    for metric in DEFINED:
        calls.clear()
        alone = sb.bootstrap_table([model], sb.Settings(samples=300, measures=(metric,)))
        assert calls == ([] if metric == "isoscore" else built)  # the same replicates' moments, built once for two
        assert_frame_equal(together.filter(pl.col("metric") == metric), alone, check_exact=True)
    assert len(built) == len(model) * len(SITES) * 8 and sum(built) == len(model) * len(SITES) * 300


def test_isoscore_from_the_trace_and_norm_is_the_eigenvalues_formula():
    """isoscore_of_trace against geometry.isoscore_of_variances on random spectra (flat, decaying, a line, some
    zeros) and the ends: equal variances 1, one direction 0, no variance NaN."""
    rng = np.random.default_rng(4)
    for d in (2, 3, 7, 64, 768):
        spectra = [rng.exponential(size=d), np.arange(1, d + 1) ** -2.0, np.ones(d) + 1e-9 * rng.random(d)]
        spectra.append(np.where(rng.random(d) < 0.5, 0.0, rng.exponential(size=d)))
        for lam in spectra:
            got = unit_products.isoscore_of_trace(np.array([lam.sum()]), np.array([lam @ lam]), d)[0]
            assert got == pytest.approx(geometry.isoscore_of_variances(lam), rel=1e-12, abs=1e-14)
        ends = unit_products.isoscore_of_trace(np.array([3.0 * d, 2.0, 0.0]), np.array([9.0 * d, 4.0, 0.0]), d)
        np.testing.assert_array_equal(ends[:2], [1.0, 0.0])
        assert np.isnan(ends[2])


@pytest.mark.parametrize("n", [D, D + 1, 40])
@pytest.mark.parametrize("scale", [1.0, 3.0])
@pytest.mark.parametrize("offset", [0.3, 1e4])
@pytest.mark.parametrize("unit_grams", [True, False], ids=["unit-grams", "row-products"])
def test_a_replicates_isoscore_needs_no_eigenvalues(n, scale, offset, unit_grams, monkeypatch):
    """Replicates of n float32 vectors (as hidden.parquet stores them; n = d: the centred covariance of rank d - 1,
    one eigenvalue 0 up to rounding, which the eigenvalues' path clips), flat or strongly anisotropic, about a small
    or a large mean: IsoScore from the units' products (float32 matrix products) equals isoscore_of_variances of the
    drawn vectors' clipped float64 covariance eigenvalues, NaN at the same replicates, and calls no
    eigendecomposition. Equal as participation ratios t^2 / F^2 = 1 + IsoScore (d - 1) to 2e-5 (7e-6 at most here;
    3e-8 with float64 products): IsoScore is that ratio minus 1, which near 1 (these strongly anisotropic clouds in 6
    dimensions) multiplies the float32 products' relative rounding by up to ~40."""
    if not unit_grams:
        monkeypatch.setattr(unit_products, "MAX_UNIT_GRAM_ELEMENTS", 0)
    rng = np.random.default_rng(n)
    x = (rng.normal(size=(n, D)) * scale ** -np.arange(D) + offset).astype(np.float32).astype(np.float64)
    unit = np.arange(n) % 4
    draws = np.concatenate([np.arange(4)[None], rng.integers(0, 4, size=(30, 4))])
    eigen = np.full(len(draws), np.nan)
    for i, units in enumerate(draws):
        drawn = x[bootstrap.rows_of_units(unit, units)]
        if len(drawn) >= D and geometry.has_spread(drawn):
            eigen[i] = geometry.isoscore_of_variances(geometry.cov_eigvals(drawn))
    ok = np.isfinite(eigen)
    assert ok.any() and (not ok.all() or n == 40)
    products = unit_products.UnitProducts.of(x, unit, 4)

    def refused(*args, **kw):
        raise AssertionError("IsoScore's replicates need no eigendecomposition")

    monkeypatch.setattr(np.linalg, "eigvalsh", refused)
    monkeypatch.setattr(np.linalg, "eigh", refused)
    got = products.isoscore(bootstrap.unit_counts(draws, 4))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(eigen))
    np.testing.assert_allclose(1 + got[ok] * (D - 1), 1 + eigen[ok] * (D - 1), rtol=2e-5)


def test_the_sampled_vectors_are_drawn_by_extracts_units(tmp_path):
    """With extract.units below n_sequences, the sampled tokens are resampled by extract's units (consecutive
    sequences in groups of ceil(n_sequences / units), as units.parquet's sums): n_units is theirs, and a replicate's
    IsoScore is that of the vectors of the sequences of its drawn units."""
    folder = write_checkpoint(tmp_path / "step0", "toy-a", 0)
    (folder / "extract.json").write_text(json.dumps({"settings": {"n_sequences": N_SEQUENCES, "units": 5}}))
    checkpoint = sb.read_checkpoint(folder, ("isoscore",))
    assert checkpoint.n_units == 4  # 12 sequences in units of ceil(12 / 5) = 3
    site = checkpoint.sites[(1, "resid")]
    hidden = read_parquet(folder / "hidden.parquet").filter((pl.col("layer") == 1) & (pl.col("site") == "resid"))
    seq = hidden["seq"].to_numpy()
    x = checkpoint_vectors(folder, 1, "resid")
    np.testing.assert_array_equal(site.unit, seq // 3)
    assert site.x is None  # IsoScore alone keeps products, not the vectors
    draws = np.array([[0, 1, 2, 3], [0, 0, 3, 3], [2, 1, 1, 0]])
    got = site.values("isoscore", draws)
    for value, units in zip(got, draws):
        drawn = np.concatenate([x[seq // 3 == u] for u in units])
        assert value == pytest.approx(geometry.isoscore(drawn), rel=2e-5)
    table = sb.bootstrap_table([[folder]], sb.Settings(samples=50, measures=("isoscore",)))
    assert set(table["n_units"]) == {4}


def test_a_model_alone_gets_example_level_intervals_and_step_tests(model):
    table = sb.bootstrap_table([model], SETTINGS)
    intervals = table.filter(pl.col("against").is_null())
    assert set(intervals["design"]) == {"units"} and set(intervals["n_seeds"]) == {1}
    assert set(intervals["n_units"]) == {N_SEQUENCES} and set(intervals["samples"]) == {300}
    assert intervals["p"].null_count() == intervals.height
    assert (intervals["low"] <= intervals["high"]).all()
    tests = table.filter(pl.col("against").is_not_null())
    pairs = sorted(set(zip(tests["step"], tests["ref_step"], tests["against"])))
    assert pairs == [(0, 32, "final"), (8, 0, "previous"), (8, 32, "final"), (32, 8, "previous")]
    assert set(tests["design"]) == {"paired"}
    assert tests["p"].is_between(0, 1).all()
    # the difference is the step's estimate minus the reference step's
    value = {(r["metric"], r["layer"], r["step"]): r["estimate"] for r in intervals.iter_rows(named=True)}
    for r in tests.iter_rows(named=True):
        assert (
            r["estimate"]
            == value[(r["metric"], r["layer"], r["step"])] - value[(r["metric"], r["layer"], r["ref_step"])]
        )
    # step 32's strongly anisotropic cloud (scale 2 per dimension) against step 0's isotropic one: a clear change
    change = tests.filter((pl.col("metric") == "isoscore") & (pl.col("step") == 0) & (pl.col("against") == "final"))
    assert (change["p"] <= 2 / 300).all() and (change["low"] > 0).all()  # step 0 is the more isotropic


def test_the_same_vectors_at_two_steps_differ_by_nothing(tmp_path):
    folders = [write_checkpoint(tmp_path / f"step{s}", "toy-a", s) for s in (0, 4)]
    (folders[1] / "hidden.parquet").write_bytes((folders[0] / "hidden.parquet").read_bytes())
    hidden = read_parquet(folders[1] / "hidden.parquet").with_columns(step=pl.lit(4, pl.Int64))
    hidden.write_parquet(folders[1] / "hidden.parquet")
    write_metrics(folders[1])
    tests = sb.bootstrap_table([folders], SETTINGS).filter(pl.col("against") == "previous")
    assert (tests["estimate"] == 0).all() and (tests["low"] == 0).all() and (tests["high"] == 0).all()
    assert (tests["p"] == 1).all()


def test_a_group_resamples_its_seeds_and_shares_the_sequences(tmp_path):
    seeds = [
        [write_checkpoint(tmp_path / m / f"step{s}", m, s, 1.0 + 0.1 * s, seed=i) for s in (0, 8)]
        for i, m in enumerate(["seed_0", "seed_1", "seed_2"])
    ]
    table = sb.bootstrap_table(seeds, SETTINGS, group="recipe")
    intervals = table.filter(pl.col("against").is_null())
    assert set(intervals["design"]) == {"seeds and units"} and set(intervals["n_seeds"]) == {3}
    assert set(table["group"]) == {"recipe"} and table["model"].null_count() == table.height
    assert table["models"][0].to_list() == ["toy/seed_0", "toy/seed_1", "toy/seed_2"]
    alone = [sb.bootstrap_table([folders], SETTINGS).filter(pl.col("against").is_null()) for folders in seeds]
    for r in intervals.iter_rows(named=True):
        per_seed = [
            t.filter((pl.col(k) == r[k]) for k in ("metric", "layer", "site", "step"))["estimate"][0] for t in alone
        ]
        assert r["estimate"] == pytest.approx(np.mean(per_seed), rel=1e-15)
    # the seeds' spread widens the interval beyond one seed's example-level one, on the same draws of sequences
    one = alone[0].filter(pl.col("metric") == "isoscore")
    three = intervals.filter(pl.col("metric") == "isoscore")
    assert (three["high"] - three["low"]).sum() > 0 and (one["high"] - one["low"]).sum() > 0


def test_a_group_of_models_measured_on_other_samples_is_refused(tmp_path):
    a = [write_checkpoint(tmp_path / "a" / "step0", "toy-a", 0)]
    b = [write_checkpoint(tmp_path / "b" / "step0", "toy-b", 0, sample=tokens(seed=5))]
    with pytest.raises(sb.BootstrapInputError, match="toy/toy-a step 0 and toy/toy-b step 0 were not measured on one"):
        sb.bootstrap_table([a, b], SETTINGS, group="mixed")


def test_bad_settings_are_named():
    with pytest.raises(sb.BootstrapInputError, match=r"measures \['centred_avg_cos'\]: not resampled here"):
        sb.Settings(measures=("isoscore", "centred_avg_cos"))
    with pytest.raises(sb.BootstrapInputError, match="level 95"):
        sb.Settings(level=95)
