"""GPT-NeoX (Pythia, the toy decoder): fused per-head-interleaved QKV, partial rotary, final LayerNorm."""

from __future__ import annotations

from anisweep.adapters.base import Adapter, Geometry, LayerNormSite, PreRotaryQK, ResidSite


class GPTNeoXAdapter(Adapter):
    model_types = ("gpt_neox",)
    architectures = ("GPTNeoXModel", "GPTNeoXForCausalLM")

    def geometry(self, config) -> Geometry:
        d_head = config.hidden_size // config.num_attention_heads
        factor = config.rope_parameters.get("partial_rotary_factor", 1.0)
        return Geometry(
            n_layers=config.num_hidden_layers,
            n_heads=config.num_attention_heads,
            d_model=config.hidden_size,
            d_head=d_head,
            rotary_dims=int(d_head * factor),
            causal=True,
        )

    def resid_sites(self, base) -> list[ResidSite]:
        sites = [ResidSite(0, base.embed_in)]
        sites += [ResidSite(i + 1, block) for i, block in enumerate(base.layers)]
        return sites

    def rotary_embedding(self, base):
        return base.rotary_emb

    def layernorm_sites(self, base) -> list[LayerNormSite]:
        sites = []
        for i, block in enumerate(base.layers):
            sites.append(LayerNormSite(i + 1, "ln_attn", block.input_layernorm))
            sites.append(LayerNormSite(i + 1, "ln_mlp", block.post_attention_layernorm))
        sites.append(LayerNormSite(len(base.layers), "final_ln", base.final_layer_norm))
        return sites

    def pre_rotary_qk(self, base, geometry: Geometry) -> list[PreRotaryQK]:
        n_heads, d_head = geometry.n_heads, geometry.d_head

        def split(qkv):
            # The fused output is interleaved per head: (B, T, H, 3 * d_head), not [Q | K | V] thirds.
            b, t, _ = qkv.shape
            per_head = qkv.view(b, t, n_heads, 3 * d_head).transpose(1, 2)
            return per_head[..., :d_head], per_head[..., d_head : 2 * d_head]

        return [PreRotaryQK(i, block.attention.query_key_value, split) for i, block in enumerate(base.layers)]
