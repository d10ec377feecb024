"""Convolutional networks (ResNet, ConvNeXt, EfficientNet) against Hugging Face's own `output_hidden_states`: each
feature map flattened to its cells, every cell a vector, the statistics and the hidden-state sample of each layer
on cells of its own."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
import transformers

from conftest import run_extract

TOL = 1e-4

CONVNETS = {
    "resnet": (
        transformers.ResNetForImageClassification,
        lambda: transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1]),
    ),
    "resnet_bottleneck": (
        transformers.ResNetModel,
        lambda: transformers.ResNetConfig(
            embedding_size=8, hidden_sizes=[16, 32], depths=[1, 2], layer_type="bottleneck"
        ),
    ),
    "convnext": (
        transformers.ConvNextForImageClassification,
        lambda: transformers.ConvNextConfig(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 2, 1], patch_size=2),
    ),
    "efficientnet": (
        transformers.EfficientNetForImageClassification,
        lambda: transformers.EfficientNetConfig(
            image_size=32, width_coefficient=0.1, depth_coefficient=0.3, hidden_dim=128, num_labels=3
        ),
    ),
}


def saved_convnet(tmp_path, cls, config, name):
    """A tiny random network whose signal survives its depth: BatchNorm statistics and weights of order one (freshly
    initialised EfficientNet blocks shrink it to zero, where a vector has no direction)."""
    torch.manual_seed(2)
    model = cls(config)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.8, 1.6)
                module.bias.normal_(0, 0.2)
            elif isinstance(module, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(module.weight)
    model.save_pretrained(tmp_path / name)
    return tmp_path / name


@torch.no_grad()
def reference_cells(path, pixel_values):
    model = transformers.AutoModel.from_pretrained(path).eval()
    out = model(pixel_values=pixel_values, output_hidden_states=True)
    return [h.flatten(2).transpose(1, 2).double() for h in out.hidden_states]


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize("kind", sorted(CONVNETS))
def test_convnets_cells_match_hidden_states(tmp_path, kind):
    cls, config = CONVNETS[kind]
    path = saved_convnet(tmp_path, cls, config(), kind)
    pixel_values = torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    tables, loaded = run_extract(path, {"pixel_values": pixel_values}, batch_size=2, sample_tokens=40)
    cells = reference_cells(path, pixel_values)
    assert loaded.geometry.n_layers == len(cells) - 1
    assert len({x.shape[1] for x in cells}) > 1  # the layers' cells differ in number: a test of positions per site
    stats, hidden = tables["hidden_stats"], tables["hidden"]
    assert set(stats["site"]) == {"resid"}
    assert tables["qk"].is_empty() and tables["attention"].is_empty()
    for layer, x in enumerate(cells):
        flat = x.reshape(-1, x.shape[-1])
        assert flat.norm(dim=-1).min() > 1e-3  # every cell has a direction: the comparison means something
        row = stats.filter((pl.col("layer") == layer) & (pl.col("site") == "resid")).row(0, named=True)
        assert row["n"] == flat.shape[0]
        np.testing.assert_allclose(row["sum_x"], flat.sum(0).numpy(), rtol=TOL, atol=TOL * flat.shape[0])
        unit = flat / flat.norm(dim=-1, keepdim=True)
        np.testing.assert_allclose(row["sum_unit"], unit.sum(0).numpy(), atol=TOL * flat.shape[0])
        sample = hidden.filter((pl.col("layer") == layer) & (pl.col("site") == "resid"))
        assert sample.height == min(40, flat.shape[0])
        seq, position = (torch.from_numpy(sample[c].to_numpy(writable=True)) for c in ("seq", "position"))
        kept = np.stack(sample["vector"].to_list())
        np.testing.assert_allclose(kept, x[seq, position].numpy(), atol=TOL)
