"""BERT (MultiBERTs, the toy encoder): separate query/key/value Linears, post-LayerNorm blocks."""

from __future__ import annotations

from anisweep.adapters.base import Adapter, Geometry, LayerNormSite, ResidSite


class BertAdapter(Adapter):
    model_types = ("bert",)
    architectures = ("BertModel", "BertForPreTraining", "BertForMaskedLM", "BertLMHeadModel")
    masked_lm = True

    def geometry(self, config) -> Geometry:
        d_head = config.hidden_size // config.num_attention_heads
        return Geometry(
            n_layers=config.num_hidden_layers,
            n_heads=config.num_attention_heads,
            d_model=config.hidden_size,
            d_head=d_head,
            rotary_dims=0,
            causal=bool(config.is_decoder),
        )

    def resid_sites(self, base) -> list[ResidSite]:
        sites = [ResidSite(0, base.embeddings)]
        sites += [ResidSite(i + 1, block) for i, block in enumerate(base.encoder.layer)]
        return sites

    def layernorm_sites(self, base) -> list[LayerNormSite]:
        # BERT normalises after each residual add; the last block's output LayerNorm is the final one.
        blocks = base.encoder.layer
        sites = [LayerNormSite(0, "ln_embed", base.embeddings.LayerNorm)]
        for i, block in enumerate(blocks):
            sites.append(LayerNormSite(i + 1, "ln_attn", block.attention.output.LayerNorm))
            if i + 1 < len(blocks):
                sites.append(LayerNormSite(i + 1, "ln_mlp", block.output.LayerNorm))
        sites.append(LayerNormSite(len(blocks), "final_ln", blocks[-1].output.LayerNorm))
        return sites
