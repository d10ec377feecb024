"""Whisper (`WhisperModel`, `WhisperForConditionalGeneration`): its ENCODER, over the log-mel `input_features`.

Positions. The encoder's frames: two convolutions over the log-mel spectrogram (10 ms a mel frame; the second
convolution has stride 2) give `max_source_positions` frames, 1500 for the published checkpoints, each 20 ms of a
30-second window. The feature extractor pads (or cuts) every clip to those 30 s, and the encoder attends over all
1500 frames, padding included: Whisper has no padding mask and was trained that way (its `attention_mask`
argument is ignored). So every frame is a valid position here, padding frames included; a clip shorter than 30 s
contributes the frames of its trailing silence too, as the model sees them.

Sites (pre-LayerNorm blocks): `resid` layer 0 is the stream entering the first block (conv features + sinusoidal
positions; no module returns it, so it is read as the first block's input, `InputOf`), layer i the output of
block i - 1; `ln_attn` (`self_attn_layer_norm`) and `ln_mlp` (`final_layer_norm`) before each sublayer; `final_ln`
the encoder's `layer_norm` after the last block.

Attention. Whisper multiplies q by d_head^-0.5 as it leaves `q_proj` and calls the attention interface with
`scaling` 1. The adapter says so (`query_prescaled`): the recording function divides the scale back out of q before
it records anything: the q means and norms are `q_proj`'s output, as for every other architecture, and the scores
q.k * d_head^-0.5 the same. The encoder's attention modules have no `layer_idx`: `attention_sites` names them.

The DECODER reads the model's own greedy continuation of `<|startoftranscript|>`: `DECODER_TOKENS` tokens (at most
`max_target_positions`) per clip, decoded before the recording pass with eager attention, the logits from the tied
token embedding, and nothing stopping at end-of-text, so that every clip's decoder has as many positions, all valid.
It is then run teacher-forced on them, and its rows in the tables (hidden.parquet's `token_id`, massive's and
sink_keys') name the token it reads at each position (`other_token_ids`): the start token at position 0, then the
greedy tokens. Its layers are counted after the encoder's, as T5's are: decoder block j is
layer n_encoder + j; `decoder_embed` (its token and position embedding) and the encoder's final norm
(`encoder_final_ln`) sit at layer n_encoder, the decoder's final norm is `final_ln`. Self-attention is causal;
cross-attention (queries from the decoder's tokens, keys from the encoder's 1500 frames) goes to its own tables
(`cross_qk`, `cross_attention`). Greedy decoding costs `DECODER_TOKENS` decoder passes per clip, on
`DECODE_CLIPS` clips at a time.
"""

from __future__ import annotations

from anisweep.adapters.base import Adapter, AttentionSite, Geometry, LayerNormSite, ResidSite

DECODER_TOKENS = 32  # the decoder's positions per clip (at most the model's max_target_positions)
DECODE_CLIPS = 4  # clips decoded together: the encoder's eager attention maps are clips x heads x 1500^2 floats


class InputOf:
    """A resid site read from a module's INPUT (the stream no module returns): it hooks `module` and hands the hook
    the module's first argument as the output."""

    def __init__(self, module):
        self.module = module

    def register_forward_hook(self, hook):
        return self.module.register_forward_hook(lambda module, args, output: hook(module, args, args[0]))


class WhisperAdapter(Adapter):
    model_types = ("whisper",)
    architectures = ("WhisperModel", "WhisperForConditionalGeneration")
    modality = "audio"

    query_prescaled = True  # q arrives multiplied by the module's `scaling`, the interface told scaling 1

    def geometry(self, config) -> Geometry:
        n_enc, n_dec = config.encoder_layers, config.decoder_layers
        decoder = tuple(range(n_enc, n_enc + n_dec))
        heads = (config.encoder_attention_heads,) * n_enc + (config.decoder_attention_heads,) * n_dec
        same = len(set(heads)) == 1
        return Geometry(
            n_layers=n_enc + n_dec,
            n_heads=max(heads),
            d_model=config.d_model,
            d_head=config.d_model // max(heads),
            rotary_dims=0,
            causal=False,
            causal_layers=decoder,
            cross_layers=decoder,
            layer_heads=() if same else heads,
            layer_d_head=() if same else tuple(config.d_model // h for h in heads),
        )

    def positions(self, base, batch):
        """The encoder's frames, every one valid; and the decoder's tokens, decoded here, added to the batch
        (`decoder_input_ids`) as an input the model takes."""
        import torch

        features = batch["input_features"]
        n, t = features.shape[0], base.config.max_source_positions
        batch["decoder_input_ids"] = torch.cat(
            [greedy_tokens(base, features[i : i + DECODE_CLIPS]) for i in range(0, n, DECODE_CLIPS)]
        )
        return torch.full((n, t), -1, dtype=torch.int64), torch.ones(n, t, dtype=torch.bool)

    def other_token_ids(self, batch):
        """The decoder's tokens, by their number: `decoder_start_token_id`, then the greedy ones (`positions`)."""
        ids = batch["decoder_input_ids"]
        return {ids.shape[1]: ids}

    def forward_batch(self, base, inputs) -> None:
        features = inputs["input_features"].to(base.dtype)  # the extractor's float32, in the model's dtype
        base(input_features=features, decoder_input_ids=inputs["decoder_input_ids"], use_cache=False)

    def resid_sites(self, base) -> list[ResidSite]:
        encoder, decoder = base.encoder.layers, base.decoder.layers
        n = len(encoder)
        sites = [ResidSite(0, InputOf(encoder[0]))] + [ResidSite(i + 1, block) for i, block in enumerate(encoder)]
        sites.append(ResidSite(n, InputOf(decoder[0]), site="decoder_embed"))
        return sites + [ResidSite(n + j + 1, block) for j, block in enumerate(decoder)]

    def layernorm_sites(self, base) -> list[LayerNormSite]:
        sites, n = [], len(base.encoder.layers)
        for i, block in enumerate(base.encoder.layers):
            sites.append(LayerNormSite(i + 1, "ln_attn", block.self_attn_layer_norm))
            sites.append(LayerNormSite(i + 1, "ln_mlp", block.final_layer_norm))
        sites.append(LayerNormSite(n, "encoder_final_ln", base.encoder.layer_norm))
        for j, block in enumerate(base.decoder.layers):
            sites.append(LayerNormSite(n + j + 1, "ln_attn", block.self_attn_layer_norm))
            sites.append(LayerNormSite(n + j + 1, "ln_cross", block.encoder_attn_layer_norm))
            sites.append(LayerNormSite(n + j + 1, "ln_mlp", block.final_layer_norm))
        return sites + [LayerNormSite(n + len(base.decoder.layers), "final_ln", base.decoder.layer_norm)]

    def attention_sites(self, base) -> list[AttentionSite]:
        n = len(base.encoder.layers)
        sites = [AttentionSite(i, block.self_attn) for i, block in enumerate(base.encoder.layers)]
        for j, block in enumerate(base.decoder.layers):
            sites += [AttentionSite(n + j, block.self_attn), AttentionSite(n + j, block.encoder_attn, cross=True)]
        return sites


def greedy_tokens(base, features):
    """(clips, n) token ids: `decoder_start_token_id`, then the argmax of the tied embedding's logits, n - 1 times,
    without a cache and with eager attention (the recording function runs only in the recording pass)."""
    import torch

    config = base.config
    n = min(DECODER_TOKENS, config.max_target_positions)
    features = features.to(device=base.device, dtype=base.dtype)
    implementation = config._attn_implementation
    base.set_attn_implementation("eager")
    try:
        encoded = base.encoder(input_features=features).last_hidden_state
        ids = torch.full((features.shape[0], 1), config.decoder_start_token_id, dtype=torch.long, device=base.device)
        for _ in range(n - 1):
            hidden = base.decoder(input_ids=ids, encoder_hidden_states=encoded, use_cache=False).last_hidden_state
            logits = hidden[:, -1] @ base.decoder.embed_tokens.weight.T
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    finally:
        base.set_attn_implementation(implementation)
    return ids.cpu()
