"""ALBERT: one block's weights shared across depth, and the embedding size projected to the hidden size.

The encoder (`albert.encoder`) projects the embedding (`embedding_size`, e.g. 128) to `hidden_size` with
`embedding_hidden_mapping_in`, then applies the same `AlbertLayer` `num_hidden_layers` times (one layer group,
one layer in it, in every released checkpoint; several groups or inner layers are enumerated in the order the
encoder applies them). Every block is one application of a shared module, so the sites below list the same
module once per application and the extractor's hooks count applications to number the layers; the attention
module has no `layer_idx`, so `attention_sites` numbers its calls the same way. AlbertAttention calls the
registered attention function (transformers' `ALL_ATTENTION_FUNCTIONS`) with q, k, v and its scaling
1/sqrt(d_head), as BERT does.

Residual stream: layer 0 is the projection's output (hidden size, what transformers returns as
`hidden_states[0]`); the embedding LayerNorm (`ln_embed`) is recorded at the embedding size. Post-LayerNorm
blocks as in BERT: `ln_attn` is the attention's output LayerNorm, `ln_mlp` the block's
`full_layer_layer_norm`, the last application of which is `final_ln`.
"""

from __future__ import annotations

from anisweep.adapters.base import Adapter, AttentionSite, Geometry, LayerNormSite, ResidSite


class AlbertAdapter(Adapter):
    model_types = ("albert",)
    architectures = ("AlbertModel", "AlbertForPreTraining", "AlbertForMaskedLM")

    @staticmethod
    def applications(base) -> list:
        """The AlbertLayer of each block, in the order the encoder applies them (the same module, repeated)."""
        config, groups = base.config, base.encoder.albert_layer_groups
        n = config.num_hidden_layers
        return [layer for i in range(n) for layer in groups[int(i / (n / config.num_hidden_groups))].albert_layers]

    def geometry(self, config) -> Geometry:
        return Geometry(
            n_layers=config.num_hidden_layers * config.inner_group_num,
            n_heads=config.num_attention_heads,
            d_model=config.hidden_size,
            d_head=config.hidden_size // config.num_attention_heads,
            rotary_dims=0,
            causal=False,
        )

    def resid_sites(self, base) -> list[ResidSite]:
        sites = [ResidSite(0, base.encoder.embedding_hidden_mapping_in)]
        return sites + [ResidSite(i + 1, block) for i, block in enumerate(self.applications(base))]

    def layernorm_sites(self, base) -> list[LayerNormSite]:
        blocks = self.applications(base)
        embed = base.embeddings.LayerNorm
        sites = [LayerNormSite(0, "ln_embed", embed, width=base.config.embedding_size)]
        for i, block in enumerate(blocks):
            sites.append(LayerNormSite(i + 1, "ln_attn", block.attention.LayerNorm))
            name = "ln_mlp" if i + 1 < len(blocks) else "final_ln"
            sites.append(LayerNormSite(i + 1, name, block.full_layer_layer_norm))
        return sites

    def attention_sites(self, base) -> list[AttentionSite]:
        return [AttentionSite(i, block.attention) for i, block in enumerate(self.applications(base))]
