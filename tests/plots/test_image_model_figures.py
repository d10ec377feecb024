"""An image model lacks what a language model's figures draw: a convolutional network has no attention and no
LayerNorm on its stream, MiT and CvT keep no q/k sample. Its real tables go through the metrics, the sweep, the
per-model figures and the q/k SVD: every figure is drawn, and those with nothing to draw say why."""

from __future__ import annotations

import json

import polars as pl
import pytest
import torch
import transformers

from anisweep.measures.metrics import checkpoint_metrics
from anisweep.measures.sweep import aggregate
from anisweep.mechanism.qk_svd import qk_svd
from anisweep.plots.distributions import qk_svd_figures
from anisweep.plots.sweep import MODEL_FIGURES, NEEDS, plot_model
from anisweep.tables import write_atomic

from conftest import run_extract, saved

MODELS = {
    "resnet": (transformers.ResNetModel, lambda: transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16])),
    "mit": (transformers.SegformerModel, lambda: transformers.SegformerConfig(depths=[1, 1, 1, 1])),
}


def checkpoint(tmp_path, kind):
    cls, config = MODELS[kind]
    folder = tmp_path / kind / "step0"
    pixels = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    tables, _ = run_extract(saved(tmp_path, cls, config(), kind), {"pixel_values": pixels})
    for name, df in tables.items():
        write_atomic(df, folder / f"{name}.parquet")
    (folder / "extract.json").write_text(json.dumps({"checkpoint": {"weight_files": {}}}))
    write_atomic(checkpoint_metrics(folder), folder / "metrics.parquet")
    return folder


@pytest.mark.slow  # every model figure, twice
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_an_image_models_figures_are_drawn_or_say_what_it_lacks(tmp_path, kind):
    folder = checkpoint(tmp_path, kind)
    sweep = aggregate([folder / "metrics.parquet"])
    paths = plot_model(sweep, tmp_path / "figures")
    assert sorted(p.name for p in paths) == sorted(MODEL_FIGURES)
    assert all(p.stat().st_size > 5_000 for p in paths)
    lacking = {name for name, (metric, _) in NEEDS.items() if metric not in set(sweep["metric"])}
    if kind == "resnet":
        assert {"qk_alignment.png", "attention_entropy.png", "final_layernorm.png"} <= lacking
    else:
        assert not lacking  # MiT has attention and LayerNorms: its figures are drawn
    table, extras = qk_svd([folder])
    assert table.is_empty()
    assert ("no attention" if kind == "resnet" else "MiT, CvT") in extras["why"]
    assert all(p.stat().st_size > 2_000 for p in qk_svd_figures(table, extras, "auto", tmp_path / "svd"))
    assert pl.read_parquet(folder / "qk_sample.parquet").is_empty()
