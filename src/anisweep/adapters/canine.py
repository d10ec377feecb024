"""CANINE (-s and -c, `CanineModel`): characters in, a deep BERT stack on a downsampled sequence.

The input is one id per character (its Unicode code point: CANINE's tokenizer adds [CLS] = 0xE000 and
[SEP] = 0xE001 and pads with 0). CanineModel then runs:
1. hashed character embeddings and one shallow Transformer layer with LOCAL attention (chunks of
   `local_transformer_stride` characters) over the characters;
2. `chars_to_molecules`: a strided convolution (`downsampling_rate`, 4) that turns every 4 characters into one
   "molecule", with [CLS]'s encoding kept as molecule 0 (molecule i >= 1 is the convolution of characters
   4(i-1)..4i-1; the last window is dropped), then a LayerNorm;
3. the deep stack: `num_hidden_layers` (12) BERT layers over the T // 4 molecules;
4. upsampling back to characters and one final shallow layer over the characters.

What the tables cover: the deep stack, on the molecule sequence. `resid` layer 0 is `chars_to_molecules`' output
(after its LayerNorm, recorded as `ln_embed`), layer l the output of deep layer l - 1; `ln_attn`, `ln_mlp` and
`final_ln` as BERT's; q/k and attention rows are the deep layers 0..11. Positions are molecule positions, masked
as CANINE masks them: molecule i is valid where any of characters 4i..4i+3 is (HF's `_downsample_attention_mask`,
a max-pool, which is what the deep stack's attention sees); `token_id` in hidden.parquet and qk_sample is the
code point of the first character molecule i covers ([CLS] for molecule 0). The shallow character layers
(local attention on chunks of characters, another sequence length) are not recorded.

Attention: CanineSelfAttention computes its attention itself and never calls transformers' attention interface,
so the model loads with `eager` attention (its own masks, as trained) and a forward hook on each deep layer's
attention module hands the recorder q, k, v made from the module's input with its own projections, and the
scaling 1/sqrt(d_head): the statistics are those of the attention the module computed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anisweep.adapters.base import Adapter, Geometry, LayerNormSite, OwnAttention, ResidSite, heads

if TYPE_CHECKING:  # the workflow imports the adapters without torch when it is parsed
    import torch


class CanineAdapter(Adapter):
    model_types = ("canine",)
    architectures = ("CanineModel",)
    attn_implementation = "eager"

    def geometry(self, config) -> Geometry:
        return Geometry(
            n_layers=config.num_hidden_layers,
            n_heads=config.num_attention_heads,
            d_model=config.hidden_size,
            d_head=config.hidden_size // config.num_attention_heads,
            rotary_dims=0,
            causal=False,
        )

    def recorded_positions(self, config, input_ids, attention_mask):
        """(ids, mask) of the molecules: mask as HF's max-pool over windows of `downsampling_rate` characters, id
        the first character of the window the molecule holds (molecule 0: [CLS], the first character)."""
        import torch

        rate = config.downsampling_rate
        b, t = input_ids.shape
        n = t // rate
        mask = attention_mask[:, : n * rate].reshape(b, n, rate).amax(dim=-1)
        ids = torch.cat([input_ids[:, :1], input_ids[:, : (n - 1) * rate : rate]], dim=1)
        return ids, mask

    def resid_sites(self, base) -> list[ResidSite]:
        sites = [ResidSite(0, base.chars_to_molecules)]
        return sites + [ResidSite(i + 1, layer) for i, layer in enumerate(base.encoder.layer)]

    def layernorm_sites(self, base) -> list[LayerNormSite]:
        layers = base.encoder.layer
        sites = [LayerNormSite(0, "ln_embed", base.chars_to_molecules.LayerNorm)]
        for i, layer in enumerate(layers):
            sites.append(LayerNormSite(i + 1, "ln_attn", layer.attention.output.LayerNorm))
            if i + 1 < len(layers):
                sites.append(LayerNormSite(i + 1, "ln_mlp", layer.output.LayerNorm))
        sites.append(LayerNormSite(len(layers), "final_ln", layers[-1].output.LayerNorm))
        return sites

    def own_attention(self, base, geometry: Geometry) -> list[OwnAttention]:
        def qkv(args, module):
            from_tensor, to_tensor = args[0], args[1]
            return tuple(
                heads(proj(x), geometry.n_heads)
                for proj, x in ((module.query, from_tensor), (module.key, to_tensor), (module.value, to_tensor))
            )

        return [
            OwnAttention(
                i, layer.attention.self, lambda args, m=layer.attention.self: qkv(args, m), geometry.d_head**-0.5
            )
            for i, layer in enumerate(base.encoder.layer)
        ]

    def embedding_matrices(self, model) -> dict[str, torch.Tensor]:
        """None: CANINE hashes code points into several small bucket tables (no one input embedding matrix, no
        output embedding), whose I(W) would not be the paper's."""
        return {}
