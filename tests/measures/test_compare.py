"""Comparative measures of a pair of checkpoints from their hidden.parquet: SVCCA and PWCCA against google/svcca's
reference code on the same arrays (vendored in svcca_reference/), CKA against the Gram-matrix formula, the refusal
of two different samples, and a user's comparative measure through the registry."""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from anisweep.measures import compare
from anisweep.measures.compare import ComparisonError, Settings, compare_pair, layer_matrix, pwcca, svcca
from anisweep.measures.registry import MeasureError, comparative_measure, measure_of
from anisweep.sample_storage import decode, vector_columns

REFERENCE = Path(__file__).parent / "svcca_reference"


@pytest.fixture(scope="module")
def reference():
    sys.path.insert(0, str(REFERENCE))
    try:
        yield importlib.import_module("cca_core"), importlib.import_module("pwcca")
    finally:
        sys.path.remove(str(REFERENCE))


def related(n=600, d=12, seed=0, noise=0.5):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) + rng.normal(size=d)
    y = np.tanh(x @ rng.normal(size=(d, d))) + noise * rng.normal(size=(n, d))
    return x, y


def reference_svcca(cca_core, x, y, variance):
    """The svcca tutorial's reduction (tutorials/001_Introduction.ipynb), keeping the top directions that explain
    `variance` of each side's variance, then get_cca_similarity's mean coefficient."""
    reduced = []
    for acts in (x.T, y.T):
        centred = acts - acts.mean(axis=1, keepdims=True)
        _, s, v = np.linalg.svd(centred, full_matrices=False)
        share = np.cumsum(s**2) / np.sum(s**2)
        k = int(np.searchsorted(share, variance - 1e-12) + 1)
        reduced.append(np.dot(s[:k] * np.eye(k), v[:k]))
    results = cca_core.get_cca_similarity(reduced[0], reduced[1], epsilon=0.0, verbose=False)
    return float(np.mean(results["cca_coef1"]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pwcca_equals_the_reference(reference, seed):
    _, pwcca_module = reference
    x, y = related(seed=seed)
    expected, _, _ = pwcca_module.compute_pwcca(x.T.copy(), y.T.copy(), epsilon=0.0)
    assert pwcca(x, y) == pytest.approx(expected, rel=1e-9)


def test_pwcca_equals_the_reference_on_a_drifted_anisotropic_representation(reference):
    """Transformer states share a large common vector (the drift) and a few dominant directions: the Cholesky route
    from the d x d products must hold where D D^T carries n m m^T."""
    _, pwcca_module = reference
    rng = np.random.default_rng(13)
    x, y = related(n=2000, d=24, seed=13)
    x = x * np.geomspace(30, 0.05, 24) + 200 * rng.normal(size=24)
    expected, _, _ = pwcca_module.compute_pwcca(x.T.copy(), y.T.copy(), epsilon=0.0)
    assert pwcca(x, y) == pytest.approx(expected, rel=1e-7)


@pytest.mark.parametrize("variance", [0.99, 0.9, 0.5])
def test_svcca_equals_the_reference(reference, variance):
    cca_core, _ = reference
    x, y = related(seed=3)
    assert svcca(x, y, variance) == pytest.approx(reference_svcca(cca_core, x, y, variance), rel=1e-9)


def test_cca_of_a_linear_map_is_one_and_of_noise_is_small():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2000, 8))
    assert pwcca(x, x @ rng.normal(size=(8, 8))) == pytest.approx(1.0)
    assert svcca(x, rng.normal(size=(2000, 8)), 0.99) < 0.1


def layer_norm_outputs(n=1500, d=16, seed=0):
    """Two LayerNorm outputs of related inputs, computed and stored in float32 as a model's are: each lies in a
    hyperplane, so its sample has d - 1 directions of spread and one at the rounding of its values."""
    rng = np.random.default_rng(seed)
    gain, bias = rng.uniform(0.5, 1.5, size=d), rng.normal(size=d)

    def layer_norm(h):
        h = h.astype(np.float32)
        h = (h - h.mean(axis=1, keepdims=True)) / h.std(axis=1, keepdims=True)
        return (h * gain.astype(np.float32) + bias.astype(np.float32)).astype(np.float64)

    h = rng.normal(size=(n, d)) @ rng.normal(size=(d, d))
    return layer_norm(h), layer_norm(np.tanh(h @ rng.normal(size=(d, d)) / 4) + 0.1 * rng.normal(size=(n, d)))


def rerounded(x, seed):
    """The same float32 values rounded again: each moved by up to half its ulp."""
    ulp = np.spacing(np.abs(x.astype(np.float32))).astype(np.float64)
    return x + np.random.default_rng(seed).uniform(-0.5, 0.5, size=x.shape) * ulp


def principal_coordinates(x):
    """x's centred coordinates on its principal directions whose singular value exceeds float32's epsilon times the
    sample's Frobenius norm (docs/measures.md)."""
    centred = x - x.mean(axis=0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    return centred @ vt[s > 2.0**-23 * np.linalg.norm(x)].T


def test_cca_of_a_layernorm_output_is_stable_under_rerounding_and_the_references_on_its_principal_coordinates(
    reference,
):
    cca_core, pwcca_module = reference
    x, y = layer_norm_outputs()
    zx, zy = principal_coordinates(x), principal_coordinates(y)
    assert zx.shape[1] == zy.shape[1] == x.shape[1] - 1
    expected, _, _ = pwcca_module.compute_pwcca(zx.T.copy(), zy.T.copy(), epsilon=0.0)
    assert pwcca(x, y) == pytest.approx(expected, rel=1e-9)
    assert svcca(x, y, 1.0) == pytest.approx(reference_svcca(cca_core, zx, zy, 1.0), rel=1e-9)
    for measure in (pwcca, lambda a, b: svcca(a, b, 1.0)):
        values = [measure(rerounded(x, seed), rerounded(y, seed + 10)) for seed in range(4)]
        assert max(values) - min(values) < 1e-6


def test_a_cca_that_float64_cannot_resolve_is_nan_with_the_reason():
    """A principal direction above the float32 rounding of the values but 5e5 times narrower than the widest:
    whitening it would decide PWCCA by float64 rounding. SVCCA's 99.99% of the variance leaves it out."""
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(400, 6)) * [1, 1, 1, 1, 1, 2e-6] + 5) @ np.linalg.qr(rng.normal(size=(6, 6)))[0]
    rows = {r["metric"]: r for r in compare.builtin_rows(x, x.copy(), Settings(svcca_variance=0.9999))}
    assert rows["cka"]["value"] == pytest.approx(1.0) and rows["svcca"]["value"] == pytest.approx(1.0)
    assert math.isnan(rows["pwcca"]["value"])
    assert "principal variances above rounding span a ratio of 2.8e+11" in rows["pwcca"]["reason"]


# --------------------------------------------------------------------------- pair tables from Parquet


EXTRACT = {"n_sequences": 10, "seq_len": 4, "sample_tokens": 40, "seed": 0, "dtype": "float32"}


def write_checkpoint(
    folder: Path,
    step: int,
    vectors: dict,
    model="toy-x",
    seed=0,
    token_ids=None,
    positions=None,
    settings=None,
    precision="float32",
):
    """A checkpoint folder with extract.json (its `settings`: EXTRACT and `settings`) and a hidden.parquet holding
    `vectors` {(layer, site): n x d} stored at `precision` (extract.sample_precision), its tokens at seq i // 4,
    position i % 4, written in a shuffled row order."""
    folder.mkdir(parents=True, exist_ok=True)
    ident = {"family": "toy", "model": model, "seed": seed, "step": step, "tokens_seen": step * 10}
    info = {"checkpoint": ident, "settings": {**EXTRACT, **(settings or {})}}
    (folder / "extract.json").write_text(json.dumps(info))
    frames = []
    for (layer, site), x in vectors.items():
        n = len(x)
        ids = np.arange(n) if token_ids is None else token_ids
        pos = np.arange(n) % 4 if positions is None else positions
        keys = {"layer": layer, "site": site, "seq": np.arange(n) // 4, "position": pos, "token_id": ids}
        keys = pl.DataFrame({**{k: [v] * n for k, v in ident.items()}, **keys})
        keys = keys.with_columns(pl.col("seq", "position", "token_id").cast(pl.Int64))
        frames.append(keys.hstack(vector_columns("vector", x, precision)))
    frame = pl.concat(frames)
    frame.sample(fraction=1.0, shuffle=True, seed=step).write_parquet(folder / "hidden.parquet")
    return folder


def gram_cka(x, y):
    n = len(x)
    h = np.eye(n) - np.ones((n, n)) / n
    k, l = x @ x.T, y @ y.T  # noqa: E741
    hsic = lambda a, b: np.trace(a @ h @ b @ h)  # noqa: E731
    return hsic(k, l) / math.sqrt(hsic(k, k) * hsic(l, l))


def test_pair_table_aligns_tokens_and_equals_independent_computations(tmp_path):
    x0, y0 = related(n=80, d=6, seed=5)
    x1, y1 = related(n=80, d=6, seed=6)
    a = write_checkpoint(tmp_path / "a", 1, {(0, "resid"): x0, (1, "resid"): x1})
    b = write_checkpoint(tmp_path / "b", 2, {(0, "resid"): y0, (1, "resid"): y1})
    table = compare_pair(a, b, Settings(cka_debiased=True))
    assert set(table["metric"]) == {"cka", "cka_debiased", "svcca", "pwcca"}
    assert table.select("step", "ref_step").unique().rows() == [(1, 2)]
    x32, y32 = (v.astype(np.float32).astype(np.float64) for v in (x1, y1))
    row = table.filter(layer=1, metric="cka")
    assert row["value"].item() == pytest.approx(gram_cka(x32, y32), rel=1e-9)
    assert table.filter(layer=1, metric="pwcca")["value"].item() == pytest.approx(pwcca(x32, y32), rel=1e-9)
    assert row["n_tokens"].item() == 80


@pytest.mark.parametrize("precision", ["int8", "float16"])
def test_cca_of_a_stored_layernorm_output_drops_its_rounding_direction_as_float32_storage_does(tmp_path, precision):
    """int8 and float16 storage round far coarser than float32: the rounding floor follows the storage, so the
    direction that is rounding noise is dropped and PWCCA stays within 1e-3 of float32 storage's (off by 0.02
    with float32's floor)."""
    x, y = layer_norm_outputs()
    folders = {}
    for stored in ("float32", precision):
        settings = {"sample_precision": stored}
        folders[stored] = [
            write_checkpoint(tmp_path / stored / name, step, {(0, "resid"): v}, settings=settings, precision=stored)
            for name, step, v in (("a", 1, x), ("b", 2, y))
        ]
    values = {stored: compare_pair(a, b).filter(metric="pwcca")["value"].item() for stored, (a, b) in folders.items()}
    assert values[precision] == pytest.approx(values["float32"], abs=1e-3)
    a, b = (compare.Checkpoint.read(folder, ["resid"]) for folder in folders[precision])
    key = (0, "resid")
    products = compare.CrossProducts.of(a.vectors[key], b.vectors[key], a.rounding[key], b.rounding[key])
    assert len(products.principal_x[0]) == len(products.principal_y[0]) == x.shape[1] - 1


def test_the_rounding_bound_holds_for_each_storage():
    """rounding_bound against the rounding each storage actually makes of float32 values."""
    x, _ = layer_norm_outputs(n=400, d=16, seed=3)
    x = x * np.geomspace(1e-6, 1e3, 16)  # float16 subnormals, and int8 vectors with one dominant component
    for precision in ("float32", "float16", "int8"):
        columns = vector_columns("vector", x, precision)
        frame = pl.DataFrame(columns)
        scales = frame["vector_scale"].to_numpy().astype(np.float64) if precision == "int8" else None
        stored = np.array(decode(frame)["vector"].to_list(), dtype=np.float64)
        error = np.linalg.norm(stored - x)
        bound = compare.rounding_bound(stored, "float32", precision, scales)
        assert error <= bound, precision
    with pytest.raises(ValueError, match="vector_scale"):
        compare.rounding_bound(x, "float32", "int8")


def test_float32_samples_give_the_float64_values():
    """CCA of float32 arrays computes in float64: in float32, Xc^T Xc's rounding sits above the floor."""
    x, y = layer_norm_outputs(n=1500, d=32, seed=21)
    x32, y32 = x.astype(np.float32), y.astype(np.float32)
    assert pwcca(x32, y32) == pytest.approx(pwcca(x, y), rel=1e-12)
    assert svcca(x32, y32, 1.0) == pytest.approx(svcca(x, y, 1.0), rel=1e-12)


def test_too_few_tokens_for_cca_is_a_reason_not_a_failure(tmp_path):
    x, y = related(n=8, d=12, seed=7)
    a = write_checkpoint(tmp_path / "a", 1, {(0, "resid"): x})
    b = write_checkpoint(tmp_path / "b", 2, {(0, "resid"): y})
    table = compare_pair(a, b)
    cca = table.filter(pl.col("measure").is_in(["svcca", "pwcca"]))
    assert cca["value"].is_nan().all() and cca["reason"].str.contains("more sampled tokens").all()
    assert table.filter(metric="cka")["value"].is_finite().all()


def test_two_samples_of_other_tokens_are_refused(tmp_path):
    x, y = related(n=40, d=4, seed=8)
    a = write_checkpoint(tmp_path / "a", 1, {(0, "resid"): x})
    b = write_checkpoint(tmp_path / "b", 2, {(0, "resid"): y}, token_ids=np.arange(40) + 1)
    with pytest.raises(ComparisonError, match=r"toy/toy-x/step1 and toy/toy-x/step2 .*same sampled tokens.*token_id"):
        compare_pair(a, b)
    c = write_checkpoint(tmp_path / "c", 3, {(0, "resid"): y[:36]})
    with pytest.raises(ComparisonError, match="40 against 36 tokens"):
        compare_pair(a, c)


def test_a_sample_with_nan_makes_every_measure_nan_naming_the_nonfinite_values(tmp_path):
    x0, x1 = related(n=80, d=6, seed=14)
    broken = x1.copy()
    broken[3, 2] = np.nan
    a = write_checkpoint(tmp_path / "a", 1, {(0, "resid"): x0, (1, "resid"): broken})
    b = write_checkpoint(tmp_path / "b", 2, {(0, "resid"): x0 + 1, (1, "resid"): x1})
    table = compare_pair(a, b, Settings(cka_debiased=True))
    bad = table.filter(layer=1)
    assert set(bad["metric"]) == {"cka", "cka_debiased", "svcca", "pwcca"}
    assert bad["value"].is_nan().all()
    assert bad["reason"].str.contains(r"toy/toy-x/step1's sample holds non-finite values \(1 NaN, 0 infinite").all()
    assert table.filter(layer=0)["value"].is_finite().all()
    matrix = layer_matrix(a)
    assert matrix.filter(layer=0, ref_layer=0)["value"].item() == pytest.approx(1.0)
    with_nan = matrix.filter((pl.col("layer") == 1) | (pl.col("ref_layer") == 1))
    assert with_nan.height == 3 and with_nan["value"].is_nan().all()
    assert with_nan["reason"].str.contains("layer 1 resid's sample holds non-finite values").all()


def test_a_refusal_names_the_extract_settings_that_differ_or_else_the_text_and_tokenizer(tmp_path):
    x, y = related(n=40, d=4, seed=8)
    a = write_checkpoint(tmp_path / "a", 1, {(0, "resid"): x}, settings={"seq_len": 64})
    b = write_checkpoint(
        tmp_path / "b", 2, {(0, "resid"): y}, positions=np.arange(40) % 4 + 1, settings={"seq_len": 32}
    )
    with pytest.raises(
        ComparisonError, match=r"\(seq, position\) differ\): extract.json settings differ, seq_len 64 against 32"
    ):
        compare_pair(a, b)
    d = write_checkpoint(tmp_path / "d", 1, {(0, "resid"): x})
    e = write_checkpoint(tmp_path / "e", 3, {(0, "resid"): y}, model="toy-y", token_ids=np.arange(40) + 1)
    with pytest.raises(ComparisonError, match=r"agree, so the evaluation text or its tokens differ: .*toy-x's against"):
        compare_pair(d, e)


def test_layer_matrix_is_cka_of_every_pair_of_layers(tmp_path):
    x0, x1 = related(n=50, d=5, seed=9)
    a = write_checkpoint(tmp_path / "a", 1, {(0, "resid"): x0, (1, "resid"): x1})
    table = layer_matrix(a)
    assert table.height == 4
    x0, x1 = (v.astype(np.float32).astype(np.float64) for v in (x0, x1))
    assert table.filter(layer=0, ref_layer=1)["value"].item() == pytest.approx(gram_cka(x0, x1), rel=1e-9)
    assert table.filter(layer=1, ref_layer=1)["value"].item() == pytest.approx(1.0)


@comparative_measure
def mean_shift(x, y):
    """The distance between the two representations' mean vectors."""
    return [{"metric": "mean_shift", "value": float(np.linalg.norm(x.mean(axis=0) - y.mean(axis=0)))}]


def test_a_users_comparative_measure_runs_beside_the_builtins(tmp_path):
    x, y = related(n=40, d=4, seed=10)
    a = write_checkpoint(tmp_path / "a", 1, {(0, "resid"): x})
    b = write_checkpoint(tmp_path / "b", 2, {(0, "resid"): y})
    measure = measure_of(mean_shift, "tests:mean_shift")
    assert measure.kind == "comparative" and measure.figures == ()
    table = compare_pair(a, b, Settings(measures=("cka",)), user=[measure])
    row = table.filter(measure="mean_shift")
    x32, y32 = (v.astype(np.float32).astype(np.float64) for v in (x, y))
    assert row["value"].item() == pytest.approx(np.linalg.norm(x32.mean(axis=0) - y32.mean(axis=0)))


def test_a_comparative_measure_of_the_wrong_shape_is_refused():
    def one(x):
        return 0.0

    with pytest.raises(MeasureError, match="takes two arguments"):
        measure_of(comparative_measure(one), "tests:one")


def test_aggregate_tags_each_pair_with_its_role(tmp_path):
    x, y = related(n=40, d=4, seed=11)
    a = write_checkpoint(tmp_path / "a", 1, {(0, "resid"): x})
    b = write_checkpoint(tmp_path / "b", 2, {(0, "resid"): y})
    compare_pair(a, b).write_parquet(tmp_path / "ab.parquet")
    table = compare.aggregate([("final", tmp_path / "ab.parquet"), ("previous", tmp_path / "ab.parquet")])
    assert sorted(set(table["role"])) == ["final", "previous"]
    assert table.height == 2 * 3


def test_the_docs_comparative_measure_loads_by_its_entry_and_runs(tmp_path, monkeypatch):
    """docs/measures.md's `mymeasures.similar:mean_cosine`, as the config names it."""
    from docs_measures import docs_package

    from anisweep.measures.registry import load

    monkeypatch.syspath_prepend(str(docs_package(tmp_path / "pkg")))
    measure = load("mymeasures.similar:mean_cosine")
    x, y = related(n=40, d=4, seed=12)
    a = write_checkpoint(tmp_path / "a", 1, {(0, "resid"): x})
    b = write_checkpoint(tmp_path / "b", 2, {(0, "resid"): y})
    row = compare_pair(a, b, Settings(measures=()), user=[measure])
    x32, y32 = (v.astype(np.float32).astype(np.float64) for v in (x, y))
    expected = np.mean(np.sum(x32 * y32, axis=1) / (np.linalg.norm(x32, axis=1) * np.linalg.norm(y32, axis=1)))
    assert row.select("measure", "metric").rows() == [("mean_cosine", "mean_cosine")]
    assert row["value"].item() == pytest.approx(expected)


def test_layers_wider_than_cca_max_width_get_cka_alone_and_the_log_says_so(tmp_path, capsys):
    narrow, wide = related(n=80, d=6, seed=9), related(n=80, d=12, seed=10)
    a = write_checkpoint(tmp_path / "a", 1, {(0, "resid"): narrow[0], (1, "resid"): wide[0]})
    b = write_checkpoint(tmp_path / "b", 2, {(0, "resid"): narrow[1], (1, "resid"): wide[1]})
    table = compare_pair(a, b, Settings(cca_max_width=8))
    assert sorted(table.filter(layer=0)["metric"]) == ["cka", "pwcca", "svcca"]
    assert table.filter(layer=1)["metric"].to_list() == ["cka"]
    assert "svcca and pwcca not computed at width 12, above compare.cca_max_width 8" in capsys.readouterr().err
    every = compare_pair(a, b, Settings(cca_max_width=None))
    assert sorted(every.filter(layer=1)["metric"]) == ["cka", "pwcca", "svcca"]
    assert every.filter(layer=0).equals(table.filter(layer=0))


def test_by_default_a_pythia_1b_wide_layer_gets_cka_alone_and_a_pythia_410m_wide_one_every_measure():
    assert Settings().cca_measures(2048) == () and Settings().cca_measures(1024) == ("svcca", "pwcca")
    rng = np.random.default_rng(11)
    for width, expected in ((1025, ["cka"]), (64, ["cka", "svcca", "pwcca"])):  # the default sweep's toys: 64
        x = rng.normal(size=(width + 40, width))
        rows = compare.builtin_rows(x, x + rng.normal(size=x.shape), Settings())
        assert [r["metric"] for r in rows] == expected
        assert all(np.isfinite(r["value"]) for r in rows)


def test_svcca_asks_for_the_singular_values_alone(monkeypatch):
    calls = []
    svd = np.linalg.svd

    def recorded(a, *args, **kwargs):
        calls.append(kwargs.get("compute_uv", True))
        return svd(a, *args, **kwargs)

    monkeypatch.setattr(np.linalg, "svd", recorded)
    svcca(*related(seed=12))
    assert calls == [False]
