"""CvT (`CvtModel`, `CvtForImageClassification`, the `microsoft/cvt-13` ... checkpoints): three stages, each a
convolutional token embedding (a strided convolution and a LayerNorm: a (B, C, H, W) map) and pre-LayerNorm blocks
whose attention projects q, k and v by depthwise convolutions (k and v strided: fewer keys than queries); the last
stage puts a [CLS] token before its patches. A stage's positions are its map's cells (and the [CLS]).

CvT computes its attention itself, never calling the attention interface: hooks on each block's
`CvtSelfAttention` give the recorder the q, k and v its own projections make (`OwnAttention`), with CvT's scale,
1/sqrt(the stage's embedding width) rather than of the head's.

Layers are numbered through the stages as MiT's are (anisweep.adapters.segformer): layer 0 stage 0's embedding
(its map flattened to cells), layer l >= 1 block l-1's output, `stage_embed` a later stage's embedding at the layer
of the block before it. The classifier's LayerNorm reads the [CLS] alone: no `final_ln` on the stream."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anisweep.adapters.base import Adapter, Geometry, LayerNormSite, OwnAttention, ResidSite
from anisweep.adapters.cnn import one_position_per_image
from anisweep.adapters.stages import numbered_blocks, staged_geometry

if TYPE_CHECKING:  # torch at run time only: a dry run of the workflow imports the adapters
    import torch


def cvt_qkv(attention):
    """q, k, v (B, heads, T, d_head) as a `CvtSelfAttention` computes them from its inputs (hidden, height, width)."""
    import torch

    def qkv(args):
        hidden, height, width = args[:3]
        if attention.with_cls_token:
            cls_token, hidden = torch.split(hidden, [1, height * width], 1)
        b, _, c = hidden.shape
        grid = hidden.permute(0, 2, 1).reshape(b, c, height, width)
        projected = []
        for conv, linear in (
            (attention.convolution_projection_query, attention.projection_query),
            (attention.convolution_projection_key, attention.projection_key),
            (attention.convolution_projection_value, attention.projection_value),
        ):
            x = conv(grid)
            if attention.with_cls_token:
                x = torch.cat((cls_token, x), dim=1)
            projected.append(attention.rearrange_for_multi_head_attention(linear(x)))
        return tuple(projected)

    return qkv


class CvtAdapter(Adapter):
    model_types = ("cvt",)
    architectures = ("CvtModel", "CvtForImageClassification")
    modality = "image"
    attn_implementation = "eager"  # its attention never calls the interface: the hooks read it

    @staticmethod
    def blocks(base) -> list[tuple[int, int, torch.nn.Module]]:
        """(stage, layer, block) of every block, numbered through the stages."""
        return numbered_blocks(stage.layers for stage in base.encoder.stages)

    def geometry(self, config) -> Geometry:
        return staged_geometry(config.num_heads, config.embed_dim, config.depth)

    def positions(self, base, batch):
        return one_position_per_image(batch)

    def forward_batch(self, base, inputs) -> None:
        base(pixel_values=inputs["pixel_values"])

    def resid_sites(self, base) -> list[ResidSite]:
        widths, stages = base.config.embed_dim, base.encoder.stages
        sites = [ResidSite(0, stages[0].embedding, width=widths[0], channels_first=True)]
        for s, layer, block in self.blocks(base):
            if s and block is stages[s].layers[0]:
                sites.append(
                    ResidSite(layer, stages[s].embedding, site="stage_embed", width=widths[s], channels_first=True)
                )
            sites.append(ResidSite(layer + 1, block, width=widths[s]))
        return sites

    def layernorm_sites(self, base) -> list[LayerNormSite]:
        widths, sites = base.config.embed_dim, []
        for s, layer, block in self.blocks(base):
            sites.append(LayerNormSite(layer + 1, "ln_attn", block.layernorm_before, width=widths[s]))
            sites.append(LayerNormSite(layer + 1, "ln_mlp", block.layernorm_after, width=widths[s]))
        return sites

    def own_attention(self, base, geometry: Geometry) -> list[OwnAttention]:
        return [
            OwnAttention(
                layer, block.attention.attention, cvt_qkv(block.attention.attention), block.attention.attention.scale
            )
            for _, layer, block in self.blocks(base)
        ]

    def embedding_matrices(self, model) -> dict[str, torch.Tensor]:
        return {}
