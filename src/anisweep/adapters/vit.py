"""Vision transformers: ViT, DeiT and BEiT (`ViTModel`, `DeiTModel`, `BeitModel` and their classification and
masked-image heads). Pre-LayerNorm blocks (`layernorm_before`, `layernorm_after`) over the patch sequence; the
positions are the special tokens ([CLS], and DeiT's distillation token) then the patches in raster order, none of
them padding. BEiT adds a relative position bias to the scores, which transformers hands the attention function as
its `attention_mask` (`mask_is_bias`), and scales each sublayer's output (layer scale `lambda_1`, `lambda_2`)
inside the block. A BEiT with mean pooling (`use_mean_pooling`, the default) has no final LayerNorm on the tokens:
its pooler normalises their mean, so it has no `final_ln` sites."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anisweep.adapters.base import Adapter, AttentionSite, Geometry, LayerNormSite, ResidSite

if TYPE_CHECKING:  # torch at run time only: a dry run of the workflow imports the adapters
    import torch


def patch_positions(batch: dict[str, torch.Tensor], patch_size: int, n_special: int):
    """(ids, valid) of a patch sequence: ids -1 (no token stands at a patch), every position valid."""
    import torch

    n, _, height, width = batch["pixel_values"].shape
    t = n_special + (height // patch_size) * (width // patch_size)
    return torch.full((n, t), -1, dtype=torch.int64), torch.ones(n, t, dtype=torch.bool)


class ViTAdapter(Adapter):
    model_types = ("vit", "deit", "beit")
    architectures = (
        "ViTModel",
        "ViTForImageClassification",
        "ViTForMaskedImageModeling",
        "DeiTModel",
        "DeiTForImageClassification",
        "DeiTForImageClassificationWithTeacher",
        "DeiTForMaskedImageModeling",
        "BeitModel",
        "BeitForImageClassification",
        "BeitForMaskedImageModeling",
    )
    modality = "image"
    mask_is_bias = True  # BEiT's relative position bias arrives as the attention mask (None for ViT and DeiT)

    def geometry(self, config) -> Geometry:
        return Geometry(
            n_layers=config.num_hidden_layers,
            n_heads=config.num_attention_heads,
            d_model=config.hidden_size,
            d_head=config.hidden_size // config.num_attention_heads,
            rotary_dims=0,
            causal=False,
        )

    def positions(self, base, batch):
        return patch_positions(batch, base.config.patch_size, 2 if base.config.model_type == "deit" else 1)

    def forward_batch(self, base, inputs) -> None:
        base(pixel_values=inputs["pixel_values"])

    def resid_sites(self, base) -> list[ResidSite]:
        return [ResidSite(0, base.embeddings)] + [ResidSite(i + 1, block) for i, block in enumerate(base.layers)]

    def layernorm_sites(self, base) -> list[LayerNormSite]:
        import torch

        sites = []
        for i, block in enumerate(base.layers):
            sites.append(LayerNormSite(i + 1, "ln_attn", block.layernorm_before))
            sites.append(LayerNormSite(i + 1, "ln_mlp", block.layernorm_after))
        if isinstance(base.layernorm, torch.nn.LayerNorm):  # BEiT with mean pooling: nn.Identity
            sites.append(LayerNormSite(len(base.layers), "final_ln", base.layernorm))
        return sites

    def attention_sites(self, base) -> list[AttentionSite]:
        return [AttentionSite(i, block.attention) for i, block in enumerate(base.layers)]

    def embedding_matrices(self, model) -> dict[str, torch.Tensor]:
        return {}  # patches are projected, not looked up: no vocabulary to measure
