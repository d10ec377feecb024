"""MiT, SegFormer's hierarchical encoder (`SegformerModel`, `SegformerForImageClassification`, the
`nvidia/mit-b0` ... `mit-b5` checkpoints): four stages, each an overlapping patch embedding (a strided convolution
and a LayerNorm), pre-LayerNorm blocks, and a LayerNorm of its own. A stage's positions are its patches (1/4, 1/8,
1/16 and 1/32 of the image's side), each stage wider than the last and with more heads; its attention reads keys and
values spatially reduced by a strided convolution (`sr_ratios`: keys shorter than queries).

Layers are numbered straight through the stages: layer 0 is stage 0's patch embedding; layer l >= 1 is block l-1's
output, whatever its stage. A later stage's patch embedding is the site `stage_embed` at the layer of the block
before it (its stream starts there, at the new width); each stage's closing LayerNorm is `stage_ln` at its last
block's layer, the last stage's is `final_ln`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anisweep.adapters.base import Adapter, AttentionSite, Geometry, LayerNormSite, ResidSite
from anisweep.adapters.cnn import one_position_per_image
from anisweep.adapters.stages import numbered_blocks, staged_geometry

if TYPE_CHECKING:  # torch at run time only: a dry run of the workflow imports the adapters
    import torch


class SegformerAdapter(Adapter):
    model_types = ("segformer",)
    architectures = ("SegformerModel", "SegformerForImageClassification")
    modality = "image"

    @staticmethod
    def blocks(base) -> list[tuple[int, int, torch.nn.Module]]:
        """(stage, layer, block) of every block, numbered through the stages."""
        return numbered_blocks(stage.blocks for stage in base.stages)

    def geometry(self, config) -> Geometry:
        return staged_geometry(config.num_attention_heads, config.hidden_sizes, config.depths)

    def positions(self, base, batch):
        return one_position_per_image(batch)  # every stage's patches are positions of their own

    def forward_batch(self, base, inputs) -> None:
        base(pixel_values=inputs["pixel_values"])

    def resid_sites(self, base) -> list[ResidSite]:
        widths = base.config.hidden_sizes
        sites = [ResidSite(0, base.stages[0].patch_embeddings, width=widths[0])]
        for s, layer, block in self.blocks(base):
            stage = base.stages[s]
            if s and block is stage.blocks[0]:
                sites.append(ResidSite(layer, stage.patch_embeddings, site="stage_embed", width=widths[s]))
            sites.append(ResidSite(layer + 1, block, width=widths[s]))
        return sites

    def layernorm_sites(self, base) -> list[LayerNormSite]:
        widths, sites = base.config.hidden_sizes, []
        for s, layer, block in self.blocks(base):
            sites.append(LayerNormSite(layer + 1, "ln_attn", block.layernorm_before, width=widths[s]))
            sites.append(LayerNormSite(layer + 1, "ln_mlp", block.layernorm_after, width=widths[s]))
            stage = base.stages[s]
            if block is stage.blocks[-1]:
                last = s == len(base.stages) - 1
                sites.append(LayerNormSite(layer + 1, "final_ln" if last else "stage_ln", stage.layer_norm, widths[s]))
        return sites

    def attention_sites(self, base) -> list[AttentionSite]:
        return [AttentionSite(layer, block.attention) for _, layer, block in self.blocks(base)]

    def embedding_matrices(self, model) -> dict[str, torch.Tensor]:
        return {}
