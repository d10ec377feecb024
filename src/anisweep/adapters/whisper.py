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
`scaling` 1. The model loads with `anisweep_prescaled`, which divides the scale back out of q before the recording
function sees it: the q means and norms are `q_proj`'s output, as for every other architecture, and the scores
q.k * d_head^-0.5 the same. The encoder's attention modules have no `layer_idx`: `attention_sites` names them.

Not recorded: the DECODER. Its positions are text tokens of another length than the encoder's frames (and it would
have to be run on a transcription, teacher-forced), and the recorder keeps one valid mask per batch; the decoder's
self- and cross-attention and its residual stream are therefore left out, and the tables hold the encoder's layers
only (Godey et al. 2024 do not say which of Whisper's stacks Fig. 3a shows; the issue asks for both, so the decoder
is open work). `embedding_matrices` keeps the default: the decoder's token embedding (`embed_in`) and, for
`WhisperForConditionalGeneration`, its tied output projection.
"""

from __future__ import annotations

from functools import cache

from anisweep.adapters.base import Adapter, AttentionSite, Geometry, LayerNormSite, ResidSite

PRESCALED_ATTENTION = "anisweep_prescaled"


def prescaled_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The recording attention function for a module that scaled q itself (`module.scaling`) and passes `scaling`
    1: q unscaled again, and the module's scale given to the recorder."""
    from anisweep.extract.recorder import attention_forward

    return attention_forward(
        module, query / module.scaling, key, value, attention_mask, scaling=module.scaling, dropout=dropout, **kwargs
    )


@cache
def register_prescaled_attention() -> str:
    from transformers import AttentionInterface

    AttentionInterface.register(PRESCALED_ATTENTION, prescaled_attention)
    return PRESCALED_ATTENTION


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

    @property
    def attn_implementation(self) -> str:
        """Registered with transformers when the model is about to load (the adapters import without it)."""
        return register_prescaled_attention()

    def geometry(self, config) -> Geometry:
        return Geometry(
            n_layers=config.encoder_layers,
            n_heads=config.encoder_attention_heads,
            d_model=config.d_model,
            d_head=config.d_model // config.encoder_attention_heads,
            rotary_dims=0,
            causal=False,
        )

    def positions(self, base, batch):
        import torch

        n = batch["input_features"].shape[0]
        t = base.config.max_source_positions
        return torch.full((n, t), -1, dtype=torch.int64), torch.ones(n, t, dtype=torch.bool)

    def forward_batch(self, base, inputs) -> None:
        features = inputs["input_features"].to(base.dtype)  # the extractor's float32, in the model's dtype
        base.encoder(input_features=features)  # the decoder is not run (module docstring)

    def resid_sites(self, base) -> list[ResidSite]:
        layers = base.encoder.layers
        return [ResidSite(0, InputOf(layers[0]))] + [ResidSite(i + 1, block) for i, block in enumerate(layers)]

    def layernorm_sites(self, base) -> list[LayerNormSite]:
        sites = []
        for i, block in enumerate(base.encoder.layers):
            sites.append(LayerNormSite(i + 1, "ln_attn", block.self_attn_layer_norm))
            sites.append(LayerNormSite(i + 1, "ln_mlp", block.final_layer_norm))
        return sites + [LayerNormSite(len(base.encoder.layers), "final_ln", base.encoder.layer_norm)]

    def attention_sites(self, base) -> list[AttentionSite]:
        return [AttentionSite(i, block.self_attn) for i, block in enumerate(base.encoder.layers)]
