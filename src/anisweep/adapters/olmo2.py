"""OLMo 2 (OLMo-2-0425-1B, OLMo-2-1124-7B): RMSNorm AFTER each sublayer (on its output, before the residual add)
instead of before it, an RMSNorm on the whole q and on the whole k projection before the rotation, full rotary.

q/k sites: `pre_norm` is the projection's output, `pre` the q_norm/k_norm output (what the rotation turns),
`post` what attention sees. Norm sites: `ln_attn_post` and `ln_mlp_post` normalise the sublayers' outputs,
`final_ln` the stream before the unembedding; no norm sits on the residual stream inside the blocks."""

from __future__ import annotations

import dataclasses

from anisweep.adapters.base import Geometry, LayerNormSite, PreRotaryQK, heads
from anisweep.adapters.llama import LlamaAdapter, decoder_geometry


class Olmo2Adapter(LlamaAdapter):
    model_types = ("olmo2",)
    architectures = ("Olmo2Model", "Olmo2ForCausalLM")

    def geometry(self, config) -> Geometry:
        return dataclasses.replace(decoder_geometry(config), pre_norm_qk=True)

    def layernorm_sites(self, base) -> list[LayerNormSite]:
        sites = []
        for i, block in enumerate(base.layers):
            sites.append(LayerNormSite(i + 1, "ln_attn_post", block.post_attention_layernorm))
            sites.append(LayerNormSite(i + 1, "ln_mlp_post", block.post_feedforward_layernorm))
        sites.append(LayerNormSite(len(base.layers), "final_ln", base.norm))
        return sites

    def pre_rotary_qk(self, base, geometry: Geometry) -> list[PreRotaryQK]:
        n_q, n_kv = geometry.n_heads, geometry.kv_heads
        sites = []
        for i, block in enumerate(base.layers):
            attn = block.self_attn
            for rope, q_module, k_module in (("pre_norm", attn.q_proj, attn.k_proj), ("pre", attn.q_norm, attn.k_norm)):
                sites.append(PreRotaryQK(i, q_module, lambda x, n=n_q: (heads(x, n), None), rope))
                sites.append(PreRotaryQK(i, k_module, lambda x, n=n_kv: (None, heads(x, n)), rope))
        return sites
