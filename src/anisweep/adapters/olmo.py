"""OLMo (OLMo-1B-hf, OLMo-7B-hf): Llama's block with a LayerNorm that has no gain and no bias (eps 1e-5, fixed in
its forward), full rotary, and on some checkpoints `clip_qkv`, a clamp of q, k and v before the rotation."""

from __future__ import annotations

from anisweep.adapters.base import Geometry, PreRotaryQK
from anisweep.adapters.llama import LlamaAdapter, separate_qk


class OlmoAdapter(LlamaAdapter):
    model_types = ("olmo",)
    architectures = ("OlmoModel", "OlmoForCausalLM")

    def pre_rotary_qk(self, base, geometry: Geometry) -> list[PreRotaryQK]:
        # the clamp is in place on the projection's output, after a forward hook has seen it: apply it here
        clip = base.config.clip_qkv
        return [site for i, block in enumerate(base.layers) for site in separate_qk(i, block.self_attn, geometry, clip)]
