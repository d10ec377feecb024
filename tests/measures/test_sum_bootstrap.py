"""The measures built of sums, from each resampling unit's sums (units.parquet): at unit weights they are the values
metrics computes from extract's tables; under any other counts they are what extract measures on the batch with each
sequence repeated that many times; and the norms' spread stays exact where their mean is large against it."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch
import transformers

from anisweep.extract.streaming import Units
from anisweep.measures import metrics, rogue, sinks, sum_bootstrap

from conftest import bert_config, neox_config, padded_batch, run_extract, saved

FROM_FLOAT32_MEANS = ("qk_cos", "qk_mean_score", "qk_cos_abs_mean")
MODELS = {"bert": (transformers.BertModel, bert_config), "gpt_neox": (transformers.GPTNeoXModel, neox_config)}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_path(request, tmp_path_factory):
    cls, config = MODELS[request.param]
    return saved(tmp_path_factory.mktemp(request.param), cls, config(), request.param)


def metric_values(tables) -> dict:
    rows = metrics.stats_rows(tables["hidden_stats"]) + metrics.attention_rows(tables["attention"])
    rows += metrics.qk_rows(tables["qk"]) + sinks.sink_rows(tables["sinks"], tables["sink_keys"], tables["attention"])
    rows += rogue.rogue_rows(tables["hidden_stats"], {})  # the shares, from the streamed statistics alone
    return {(r["metric"], r["layer"], r["site"], r.get("head")): r["value"] for r in rows}


def assert_close(got: float, want: float, what, rtol: float) -> None:
    if math.isnan(want):
        assert math.isnan(got), what
    else:
        assert got == pytest.approx(want, rel=rtol, abs=1e-12), what


@pytest.mark.parametrize("max_units", [32, 2])
def test_unit_weights_give_the_stored_values(model_path, max_units):
    """Every unit once: each measure equals metrics' value from the streamed statistics, for units of one sequence
    and of several (5 padded sequences in 2 units of 3 and 2), on the CPU's branch that cuts padding rows."""
    tables, _ = run_extract(model_path, padded_batch(), units=max_units)
    n_units, measures = len(tables["units"]["values"][0]) // tables["units"]["width"][0], None
    assert n_units == Units.of(5, max_units).n_units
    measures = sum_bootstrap.measures_of(tables["units"], sum_bootstrap.MEASURES, tables["sinks"])
    stored = metric_values(tables)
    assert {m.metric for m in measures} == set(sum_bootstrap.MEASURES)
    for m in measures:
        # the qk table holds the mean q and k as float32 (the output contract): metrics' cosines are theirs
        assert_close(m.value, stored[m.key], m.key, rtol=1e-6 if m.metric in FROM_FLOAT32_MEANS else 1e-10)


def repeated(batch: dict, counts: np.ndarray) -> dict:
    order = np.repeat(np.arange(len(counts)), counts)
    return {name: x[torch.as_tensor(order)] for name, x in batch.items()}


def test_reweighted_sums_are_the_batch_with_sequences_repeated(model_path):
    """Counts (0, 2, 1, 3, 1) of the 5 sequences: the reweighted sums give what extract and metrics measure on the
    batch that holds each sequence that many times (an independent run, in other mini-batches)."""
    batch = padded_batch()
    counts = np.array([0, 2, 1, 3, 1])
    tables, _ = run_extract(model_path, batch, units=32)
    measures = sum_bootstrap.measures_of(tables["units"], sum_bootstrap.MEASURES, tables["sinks"])
    again, _ = run_extract(model_path, repeated(batch, counts), units=0, batch_size=3)
    want = metric_values(again)
    for m in measures:
        got = float(m.of_sums(counts.astype(float) @ m.per_unit))
        assert_close(got, want[m.key], m.key, rtol=2e-5)


def test_norm_spread_is_exact_about_a_large_mean():
    """Norms of mean 1e4 and spread 1e-4 in 40 units of uneven sizes: the reweighted std equals a two-pass float64
    std of the norms repeated by the counts, where sum ||x||^2 - N mean^2 would lose every digit."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 30, size=40)
    norms = [1e4 + 1e-4 * rng.standard_normal(n) for n in sizes]
    stats = {
        "n": sizes[:, None].astype(float),
        "n_zero": np.zeros((40, 1)),
        "sum_norm": np.array([[v.sum()] for v in norms]),
        "m2_norm": np.array([[((v - v.mean()) ** 2).sum()] for v in norms]),
        "sum_x": np.zeros((40, 3)),
        "sum_unit": np.zeros((40, 3)),
    }
    measure = sum_bootstrap._hidden(0, "resid", stats, "norm_std")
    for seed in range(5):
        counts = np.random.default_rng(seed).multinomial(40, np.full(40, 1 / 40))
        drawn = np.concatenate([np.tile(v, c) for v, c in zip(norms, counts)])
        want = np.sqrt(((drawn - drawn.mean()) ** 2).mean())
        assert float(measure.of_sums(counts @ measure.per_unit)) == pytest.approx(want, rel=1e-6)
        naive = np.sqrt(max((drawn**2).sum() / len(drawn) - drawn.mean() ** 2, 0.0))
        assert abs(naive - want) > 0.1 * want  # the raw moments' answer is wrong here: the test can tell


def test_a_missing_or_empty_units_table_names_the_fix(tmp_path):
    with pytest.raises(sum_bootstrap.UnitsError, match="rerun this checkpoint's extract"):
        sum_bootstrap.read_units(tmp_path, ["avg_cos"])
    with pytest.raises(sum_bootstrap.UnitsError, match="not built of sums"):
        sum_bootstrap.measures_of(None, ["isoscore"])


def write_checkpoint(folder, model_path, units: int = 32, step: int = 3, model: str = "m"):
    from anisweep.extract.run import write_extract

    tables, _ = run_extract(model_path, padded_batch(), units=units)
    ident = {"family": "test", "model": model, "step": step}
    tables = {name: t.with_columns(**{k: pl.lit(v) for k, v in ident.items()}) for name, t in tables.items()}
    write_extract(folder, tables, {"settings": {"n_sequences": 5}})
    metrics.checkpoint_metrics(folder).write_parquet(folder / "metrics.parquet")  # as the metrics job: the estimates
    return folder, tables


def test_a_group_of_two_seeds_resamples_the_sums_on_the_sequences_drawn(tmp_path, model_path):
    """bootstrap_table on two seeds' checkpoints (two models of one shape): each sum-built row's estimate is the mean
    over the seeds of metrics' values, and replicate r is the mean over the seeds drawn of each one's measure on the
    sums weighted by how often draw r takes each sequence (bootstrap.draws of the table's seed)."""
    from anisweep.measures import bootstrap
    from anisweep.measures import sample_bootstrap as sb

    other_path = another_seed(model_path, tmp_path / "x")
    folders = [
        write_checkpoint(tmp_path / name / "step3", path, model=name)
        for name, path in (("a", model_path), ("b", other_path))
    ]
    settings = sb.Settings(samples=40, seed=3, measures=("isoscore", "avg_cos", "entropy_mean", "sink1_eps"))
    table = sb.bootstrap_table([[folder] for folder, _ in folders], settings, group="g")
    intervals = table.filter(pl.col("against").is_null())
    assert set(intervals["metric"]) == {"isoscore", "avg_cos", "entropy_mean", "sink1_eps"}
    # without a measure of the sampled vectors no vector is read, and the sums' rows are the same
    sums_alone = sb.Settings(samples=40, seed=3, measures=("avg_cos", "entropy_mean", "sink1_eps"))
    alone = sb.bootstrap_table([[folder] for folder, _ in folders], sums_alone, group="g")
    assert alone.equals(table.filter(pl.col("metric") != "isoscore"))
    per_seed = [metric_values(tables) for _, tables in folders]
    draws = list(bootstrap.draws(5, 2, samples=40, seed=3))
    counts, seeds = draws[0].counts, draws[0].base
    for r in intervals.filter(pl.col("metric") != "isoscore").iter_rows(named=True):
        key = (r["metric"], r["layer"], r["site"], r["head"])
        assert r["estimate"] == pytest.approx(np.mean([values[key] for values in per_seed]), rel=1e-6, abs=1e-12)
        assert r["n_units"] == 5 and r["n_seeds"] == 2 and r["design"] == "seeds and units"
        measures = [
            {m.key: m for m in sum_bootstrap.measures_of(t["units"], [r["metric"]], t["sinks"])}[key]
            for _, t in folders
        ]
        replicates = np.array(
            [np.mean([measures[s].of_sums(c @ measures[s].per_unit) for s in draw]) for c, draw in zip(counts, seeds)]
        )
        if np.isnan(replicates).any():
            assert np.isnan(r["low"])
            continue
        assert (r["low"], r["high"]) == pytest.approx(bootstrap.percentile_interval(replicates, 0.95), rel=1e-12)
        assert r["bias"] == pytest.approx(replicates.mean() - r["estimate"], rel=1e-9, abs=1e-12)


def another_seed(model_path, folder):
    """The same shape with other weights: the model's perturbed."""
    model = transformers.AutoModel.from_pretrained(model_path)
    torch.manual_seed(7)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    return folder


def test_a_units_floats_are_what_docs_results_counts(model_path):
    """docs/results.md's size of a unit: 2 d_model + 4 floats per hidden-state site and d_model more at the sampled
    sites (the rogue dimensions' sum u_j^2), 3 per layer and 6 per head for attention, 2 + (2 d_head + 2) per head for
    each layer's q/k rope."""
    tables, parts = run_extract(model_path, padded_batch(), units=32)
    g = parts.geometry
    units = tables["units"]
    per_unit = int(units["width"].sum())
    ropes = units.filter(pl.col("table") == "qk")["site"].n_unique()
    sites = tables["hidden_stats"].height
    sampled = tables["hidden_stats"].filter(pl.col("site").is_in(rogue.ROGUE_SITES)).height
    assert 0 < sampled < sites
    expected = sites * (2 * g.d_model + 4) + sampled * g.d_model + g.n_layers * (3 + 6 * g.n_heads)
    expected += g.n_layers * ropes * (2 + g.n_heads * (2 * g.d_head + 2))
    assert per_unit == expected
    assert all(len(v) == 5 * w for v, w in zip(units["values"], units["width"]))  # 5 sequences, each its own unit
