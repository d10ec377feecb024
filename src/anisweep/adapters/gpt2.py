"""GPT-2 (the Stanford CRFM Mistral runs): learned positions added to the token embedding, one Conv1D `c_attn`
holding [Q | K | V] (thirds of the hidden size, not interleaved per head), pre-LayerNorm blocks, `ln_f`.

No rotary: the attention function sees q and k as they leave c_attn (rope `pre`). Its `scaling` is the one the
model applies, 1/sqrt(d_head) times 1/(layer+1) where `scale_attn_by_inverse_layer_idx` is set (as in the
Mistral runs): score_mean and score_std are the logits the softmax receives."""

from __future__ import annotations

from anisweep.adapters.base import Adapter, Geometry, LayerNormSite, ResidSite


class GPT2Adapter(Adapter):
    model_types = ("gpt2",)
    architectures = ("GPT2Model", "GPT2LMHeadModel")

    def geometry(self, config) -> Geometry:
        return Geometry(
            n_layers=config.n_layer,
            n_heads=config.n_head,
            d_model=config.n_embd,
            d_head=config.n_embd // config.n_head,
            rotary_dims=0,
            causal=True,
        )

    def resid_sites(self, base) -> list[ResidSite]:
        # `drop` outputs token + position embedding (dropout is the identity in eval)
        return [ResidSite(0, base.drop)] + [ResidSite(i + 1, block) for i, block in enumerate(base.h)]

    def layernorm_sites(self, base) -> list[LayerNormSite]:
        sites = []
        for i, block in enumerate(base.h):
            sites.append(LayerNormSite(i + 1, "ln_attn", block.ln_1))
            sites.append(LayerNormSite(i + 1, "ln_mlp", block.ln_2))
        sites.append(LayerNormSite(len(base.h), "final_ln", base.ln_f))
        return sites
