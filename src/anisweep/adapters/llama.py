"""Llama (TinyLlama, the Llama-style suites): RMSNorm pre-norm blocks, SwiGLU, full rotary, and grouped-query
attention (`num_key_value_heads` key/value heads shared by groups of query heads)."""

from __future__ import annotations

from anisweep.adapters.base import Adapter, Geometry, LayerNormSite, PreRotaryQK, ResidSite, heads


def decoder_geometry(config) -> Geometry:
    """Geometry of the Llama family of decoders (Llama, OLMo, OLMo 2): separate q/k/v projections, rotary on
    `partial_rotary_factor` (default all) of each head."""
    d_head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    factor = (getattr(config, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)
    kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return Geometry(
        n_layers=config.num_hidden_layers,
        n_heads=config.num_attention_heads,
        d_model=config.hidden_size,
        d_head=d_head,
        rotary_dims=int(d_head * factor),
        causal=True,
        n_kv_heads=kv if kv != config.num_attention_heads else 0,
    )


def separate_qk(layer: int, attn, geometry: Geometry, clip: float | None = None) -> list[PreRotaryQK]:
    """q_proj and k_proj outputs as two sites; `clip`: the clamp OLMo applies to them before the rotation."""

    def split_q(x):
        return heads(x if clip is None else x.clamp(-clip, clip), geometry.n_heads), None

    def split_k(x):
        return None, heads(x if clip is None else x.clamp(-clip, clip), geometry.kv_heads)

    return [PreRotaryQK(layer, attn.q_proj, split_q), PreRotaryQK(layer, attn.k_proj, split_k)]


class LlamaAdapter(Adapter):
    model_types = ("llama",)
    architectures = ("LlamaModel", "LlamaForCausalLM")

    def geometry(self, config) -> Geometry:
        return decoder_geometry(config)

    def resid_sites(self, base) -> list[ResidSite]:
        return [ResidSite(0, base.embed_tokens)] + [ResidSite(i + 1, block) for i, block in enumerate(base.layers)]

    def layernorm_sites(self, base) -> list[LayerNormSite]:
        sites = []
        for i, block in enumerate(base.layers):
            sites.append(LayerNormSite(i + 1, "ln_attn", block.input_layernorm))
            sites.append(LayerNormSite(i + 1, "ln_mlp", block.post_attention_layernorm))
        sites.append(LayerNormSite(len(base.layers), "final_ln", base.norm))
        return sites

    def pre_rotary_qk(self, base, geometry: Geometry) -> list[PreRotaryQK]:
        return [site for i, block in enumerate(base.layers) for site in separate_qk(i, block.self_attn, geometry)]
