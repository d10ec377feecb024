"""The figures of rogue dimensions, massive activations, attention sinks and LayerNorm outliers (plots/outliers.py)
from a sweep of the planted tiny GPT-2 whose plants grow over three steps; and the cross-checkpoint table of the
massive-activation dimension (measures.massive.dimension_identity) from that sweep."""

from __future__ import annotations

import json

import polars as pl
import pytest
from planted import MASSIVE_DIM, planted_batch, planted_gpt2

from anisweep.extract import tables as extract_tables
from anisweep.extract.model import ExtractSettings, load_model
from anisweep.extract.run import run, write_extract
from anisweep.measures.massive import dimension_identity
from anisweep.measures.metrics import checkpoint_metrics
from anisweep.measures.registry import BUILTIN
from anisweep.measures.sweep import aggregate
from anisweep.plots import outliers
from anisweep.plots.sweep import PLOTTERS

STEPS = {0: 0.0, 10: 0.3, 100: 1.0}  # step: the plants' strength


def planted_sweep(tmp_path) -> pl.DataFrame:
    batch = planted_batch()
    paths = []
    for step, strength in STEPS.items():
        loaded = load_model(planted_gpt2(tmp_path, f"model{step}", strength), device="cpu")
        recorder = run(loaded, batch, ExtractSettings(batch_size=5, sample_tokens=10_000, device="cpu"), progress=False)
        ident = {"family": "toy", "model": "planted", "seed": 0, "step": step, "tokens_seen": step * 60}
        out = tmp_path / f"step{step}"
        write_extract(out, extract_tables.tables(recorder, loaded, ident), {"checkpoint": ident})
        checkpoint_metrics(out).write_parquet(out / "metrics.parquet")
        paths.append(out / "metrics.parquet")
    return aggregate(paths, list(STEPS))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return planted_sweep(tmp_path_factory.mktemp("planted"))


MEASURES = ("rogue_dimensions", "massive_activations", "attention_sinks", "layernorm_outliers")


@pytest.mark.slow  # ten figures: ~16 s on 2 cores
def test_every_outlier_figure_is_drawn(sweep, tmp_path):
    """The figures the four measures name, among plot_model's, each drawn from the sweep's rows: several times the
    size of the placeholder a sweep from before these measures gets."""
    assert {f for m in MEASURES for f in BUILTIN[m][1]} == set(outliers.PLOTTERS)
    assert all(PLOTTERS[name] is draw for name, draw in outliers.PLOTTERS.items())
    analysed = sweep.filter(pl.col("status") == "ok")
    older = analysed.filter(~pl.col("measure").is_in(MEASURES))
    for name, draw in outliers.PLOTTERS.items():
        draw(analysed, tmp_path / name)
        draw(older, tmp_path / f"older_{name}")
        assert (tmp_path / name).stat().st_size > 2 * (tmp_path / f"older_{name}").stat().st_size, name


def test_dimension_identity_over_training(sweep):
    """The embedding layer's largest activation sits at MASSIVE_DIM once planted (steps 10 and 100), elsewhere at
    step 0: the table says which steps agree with the last."""
    identity = dimension_identity(sweep).filter(pl.col("layer") == 0).sort("step")
    assert identity["dim"].to_list()[1:] == [MASSIVE_DIM, MASSIVE_DIM]
    assert identity["dim"][0] != MASSIVE_DIM
    assert identity["same_as_last"].to_list() == [False, True, True]
    assert identity["same_as_previous"].to_list() == [None, False, True]
    assert identity["share_as_last"][0] == pytest.approx(2 / 3)
    assert json.dumps(dimension_identity(sweep.filter(pl.col("metric") == "avg_cos")).columns)  # empty: its columns


def test_dimension_identity_takes_a_frame_of_several_models_model_by_model():
    """Issue 43: on every model's sweep together (the README's `scan(root, "sweep")`), the rows of two models at one
    layer were compared with each other: model b's step 10 was "the previous step" of model a's step 100. Each model
    is now its own sequence of checkpoints, its identity columns kept."""
    rows = [
        {"family": "f", "model": model, "seed": 0, "step": step, "layer": 0, "head": None, "site": "resid"}
        | {"metric": "massive_dim_1", "value": float(dim)}
        for model, dims in (("a", {0: 5, 10: 7, 100: 7}), ("b", {0: 3, 10: 3, 50: 9}))
        for step, dim in dims.items()
    ]
    identity = dimension_identity(pl.DataFrame(rows))
    assert identity.columns[:3] == ["family", "model", "seed"]
    a, b = (identity.filter(pl.col("model") == m).sort("step") for m in "ab")
    assert a["dim"].to_list() == [5, 7, 7] and b["dim"].to_list() == [3, 3, 9]
    assert a["same_as_last"].to_list() == [False, True, True] and b["same_as_last"].to_list() == [False, False, True]
    assert a["same_as_previous"].to_list() == [None, False, True]
    assert b["same_as_previous"].to_list() == [None, True, False]
    assert a["share_as_last"][0] == pytest.approx(2 / 3) and b["share_as_last"][0] == pytest.approx(1 / 3)
