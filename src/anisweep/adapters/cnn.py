"""Convolutional networks: ResNet, ConvNeXt and EfficientNet (`ResNetModel`, `ConvNextModel`, `EfficientNetModel`
and their image classifiers). As Godey et al. (2024, Section 3.2) do, each feature map (B, C, H, W) is flattened to
its H x W cells, each a C-wide vector: the cells are the positions, all valid, and every stage has its own number
and width of them. The layers are those of transformers' `output_hidden_states`: layer 0 the stem (`embedder` /
`embeddings`), then each stage's output (ResNet, ConvNeXt) or each MBConv block's (EfficientNet; its final 1x1
`top_conv` is not a layer there, nor here). No attention, so no q/k or attention tables; no LayerNorm runs on the
cells' stream (BatchNorm, or ConvNeXt's LayerNorms inside its blocks), so no `final_ln` sites."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from anisweep.adapters.base import Adapter, Geometry, LayerNormSite, ResidSite

if TYPE_CHECKING:  # torch at run time only: a dry run of the workflow imports the adapters
    import torch


def one_position_per_image(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's own positions for a network whose every site has positions of its own (its cells): one per
    image, so that extract.json's `n_valid_tokens` counts images."""
    import torch

    n = batch["pixel_values"].shape[0]
    return torch.full((n, 1), -1, dtype=torch.int64), torch.ones(n, 1, dtype=torch.bool)


class ConvNetAdapter(Adapter):
    model_types = ("resnet", "convnext", "efficientnet")
    architectures = (
        "ResNetModel",
        "ResNetForImageClassification",
        "ConvNextModel",
        "ConvNextForImageClassification",
        "EfficientNetModel",
        "EfficientNetForImageClassification",
    )
    modality = "image"

    @staticmethod
    def stem_and_layers(base) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
        stem = base.embedder if hasattr(base, "embedder") else base.embeddings
        return stem, list(base.encoder.blocks if hasattr(base.encoder, "blocks") else base.encoder.stages)

    @staticmethod
    def widths(config) -> tuple[int, list[int]]:
        """(the stem's channels, each layer's)."""
        if config.model_type == "efficientnet":
            from transformers.models.efficientnet.modeling_efficientnet import round_filters

            out = []  # EfficientNetEncoder's blocks: each stage's repeats scaled by the depth coefficient
            for channels, repeats in zip(config.out_channels, config.num_block_repeats):
                out += [round_filters(config, channels)] * math.ceil(config.depth_coefficient * repeats)
            return round_filters(config, 32), out
        stem = config.embedding_size if config.model_type == "resnet" else config.hidden_sizes[0]
        return stem, list(config.hidden_sizes)

    def geometry(self, config) -> Geometry:
        _, widths = self.widths(config)
        return Geometry(n_layers=len(widths), n_heads=0, d_model=widths[-1], d_head=0, rotary_dims=0, causal=False)

    def positions(self, base, batch):
        return one_position_per_image(batch)

    def forward_batch(self, base, inputs) -> None:
        base(pixel_values=inputs["pixel_values"])

    def resid_sites(self, base) -> list[ResidSite]:
        stem, layers = self.stem_and_layers(base)
        stem_width, widths = self.widths(base.config)
        sites = [ResidSite(0, stem, width=stem_width, channels_first=True)]
        return sites + [
            ResidSite(i + 1, layer, width=width, channels_first=True)
            for i, (layer, width) in enumerate(zip(layers, widths))
        ]

    def layernorm_sites(self, base) -> list[LayerNormSite]:
        return []

    def embedding_matrices(self, model) -> dict[str, torch.Tensor]:
        return {}
