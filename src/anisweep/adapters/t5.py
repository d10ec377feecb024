"""T5 and ByT5 (`T5ForConditionalGeneration`, `T5Model`; ByT5 is T5 v1.1 on bytes): an encoder and a decoder.

Forward. The encoder reads the text; the decoder reads the same text teacher-forced, shifted right as T5 does in
training (`decoder_input_ids = _shift_right(input_ids)`: the decoder start token, then every token but the last),
with the encoder's padding mask as its own (so a right-padded batch keeps the same valid positions in both
stacks). The LM head never runs. Only right padding is accepted: shifting a left-padded row would feed a padding
token where the text starts.

Layers, counted through the decoder as Godey et al. (2024, Fig. 1) concatenate T5's encoder and decoder:
- attention and q/k rows: encoder block i is layer i (0..Le-1), decoder block j is layer Le + j; the decoder's
  layers are causal (`Geometry.causal_layers`);
- residual stream (`resid`): layer 0 the encoder's embedding, layer i the output of encoder block i - 1, so layer
  Le is the encoder's last block output BEFORE the encoder's final norm; layer Le + 1 + j the output of decoder
  block j, the last one (Le + Ld) before the decoder's final norm. Layer l >= 1 is block l - 1's output in both
  stacks, as for every other architecture;
- `decoder_embed` at layer Le: the decoder's embedding of the shifted text, which decoder block Le reads (it
  does not read `resid` layer Le, the encoder's output, which reaches it through cross-attention);
- norms (T5's RMSNorm: a gain, no bias, no centring): `ln_attn` (before self-attention), `ln_cross` (before
  cross-attention, decoder only), `ln_mlp` (before the feed-forward), `encoder_final_ln` at layer Le (the
  encoder's final norm: its output is what the decoder's cross-attention reads), `final_ln` at Le + Ld (the
  decoder's, before the LM head).
The table `layers` of docs/adapters.md spells this out for t5-small.

Attention. T5 does not scale q.k (`scaling` = 1) and adds a learned relative position bias to the scores before
the softmax; the first block of each stack computes it and every block of that stack reuses it. The registered
attention function receives it as `position_bias` and adds it: score statistics (`score_mean`, `score_std`)
are those of the logits q.k + bias the softmax sees, and the probabilities are eager's exactly. The
cross-attention (decoder queries, encoder keys) is recorded apart, in `cross_qk` and `cross_attention` (same
columns as `qk` and `attention`, layer = the decoder block's layer Le + j); it is never mixed into the
self-attention's tables. The qk_sample, score histogram and stream measures see self-attention only.
"""

from __future__ import annotations

from anisweep.adapters.base import Adapter, AttentionSite, Geometry, LayerNormSite, ResidSite


def _n_layers(config) -> tuple[int, int]:
    """(encoder blocks, decoder blocks)."""
    return config.num_layers, config.num_decoder_layers or config.num_layers


class T5Adapter(Adapter):
    model_types = ("t5",)
    architectures = ("T5Model", "T5ForConditionalGeneration")

    def geometry(self, config) -> Geometry:
        n_enc, n_dec = _n_layers(config)
        decoder = tuple(range(n_enc, n_enc + n_dec))
        return Geometry(
            n_layers=n_enc + n_dec,
            n_heads=config.num_heads,
            d_model=config.d_model,
            d_head=config.d_kv,
            rotary_dims=0,
            causal=False,
            causal_layers=decoder,
            cross_layers=decoder,
        )

    def base_model(self, model):
        return model  # T5ForConditionalGeneration holds its stacks itself; `forward` runs them, not the LM head

    def forward(self, base, input_ids, attention_mask) -> None:
        ordered = attention_mask.cummin(dim=1).values == attention_mask  # 1s then 0s in every row
        if not bool(ordered.all()):
            raise ValueError("T5: the decoder reads the text shifted right, which needs right padding")
        encoded = base.encoder(input_ids=input_ids, attention_mask=attention_mask)
        base.decoder(
            input_ids=base._shift_right(input_ids),
            attention_mask=attention_mask,
            encoder_hidden_states=encoded[0],
            encoder_attention_mask=attention_mask,
            use_cache=False,
        )

    def resid_sites(self, base) -> list[ResidSite]:
        encoder, decoder = base.encoder.block, base.decoder.block
        n_enc = len(encoder)
        sites = [ResidSite(0, base.encoder.embed_tokens)]
        sites += [ResidSite(i + 1, block) for i, block in enumerate(encoder)]
        sites.append(ResidSite(n_enc, base.decoder.embed_tokens, site="decoder_embed"))
        sites += [ResidSite(n_enc + 1 + j, block) for j, block in enumerate(decoder)]
        return sites

    def layernorm_sites(self, base) -> list[LayerNormSite]:
        encoder, decoder = base.encoder.block, base.decoder.block
        n_enc = len(encoder)
        sites = []
        for i, block in enumerate(encoder):
            sites.append(LayerNormSite(i + 1, "ln_attn", block.layer[0].layer_norm))
            sites.append(LayerNormSite(i + 1, "ln_mlp", block.layer[-1].layer_norm))
        sites.append(LayerNormSite(n_enc, "encoder_final_ln", base.encoder.final_layer_norm))
        for j, block in enumerate(decoder):
            sites.append(LayerNormSite(n_enc + 1 + j, "ln_attn", block.layer[0].layer_norm))
            sites.append(LayerNormSite(n_enc + 1 + j, "ln_cross", block.layer[1].layer_norm))
            sites.append(LayerNormSite(n_enc + 1 + j, "ln_mlp", block.layer[-1].layer_norm))
        sites.append(LayerNormSite(n_enc + len(decoder), "final_ln", base.decoder.final_layer_norm))
        return sites

    def attention_sites(self, base) -> list[AttentionSite]:
        """The blocks' `layer_idx` restarts at 0 in the decoder: every module is named here."""
        n_enc = len(base.encoder.block)
        sites = [AttentionSite(i, block.layer[0].SelfAttention) for i, block in enumerate(base.encoder.block)]
        for j, block in enumerate(base.decoder.block):
            sites.append(AttentionSite(n_enc + j, block.layer[0].SelfAttention))
            sites.append(AttentionSite(n_enc + j, block.layer[1].EncDecAttention, cross=True))
        return sites
