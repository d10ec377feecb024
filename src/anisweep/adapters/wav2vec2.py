"""wav2vec 2.0 (`Wav2Vec2Model`, `Wav2Vec2ForCTC`, `Wav2Vec2ForPreTraining`) and HuBERT (`HubertModel`,
`HubertForCTC`): a convolutional feature encoder over the waveform, then a transformer encoder over its frames.

Positions. One per frame the convolutional feature encoder emits (`_get_feat_extract_output_lengths` of the padded
waveform: 20 ms of audio each at 16 kHz, a receptive field of 25 ms, for the published conv stacks). A batch of clips of
unequal length is padded with zeros to the longest and carries the feature extractor's `attention_mask` over samples;
a frame is valid where transformers' `_get_feature_vector_attention_mask` says (the frames of each clip's own
length), and padding frames are masked as padding tokens are for text: out of every statistic and out of every
valid frame's keys. The model is always given the mask, so that it zeroes the padding frames before the positional
convolution as it does with a mask (transformers advises against passing one to the group-norm checkpoints such as
wav2vec2-base; there the feature encoder's GroupNorm still sees the padding: a padded clip's frames differ a little
from the clip's alone. Clips cut to one length, `corpus.max_seconds` at most the shortest, avoid padding).

Sites. The stream entering the blocks, `resid` layer 0, is the output of the encoder's dropout, in both variants:
- `do_stable_layer_norm` False (wav2vec2-base, hubert-base; post-LayerNorm blocks, as BERT): features + the
  positional convolution, then the encoder's LayerNorm (`ln_embed`, layer 0) before the first block; each block
  normalises after its attention add (`ln_attn`) and after its feed-forward add (`ln_mlp`); the last block's
  `final_layer_norm` is `final_ln`, and its output the last `resid`;
- `do_stable_layer_norm` True (the large "lv60" models, hubert-large / -xlarge; pre-LayerNorm blocks): features +
  the positional convolution enter the first block unnormalised; `ln_attn` / `ln_mlp` before each sublayer;
  the encoder's LayerNorm after the last block is `final_ln`.
The feature projection's LayerNorm (over the conv channels, before the projection to the hidden size) and the
conv stack itself are not recorded; neither are the CTC head, the quantizer or an adapter stack after the encoder.

Attention. The encoder's attention modules call the attention interface (`anisweep`) with transformers' padding
mask, which the recording function ignores: it builds its own from the valid frames, which is eager attention
exactly on every valid frame. The modules have no `layer_idx`: `attention_sites` names them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anisweep.adapters.base import Adapter, AttentionSite, Geometry, LayerNormSite, ResidSite

if TYPE_CHECKING:  # torch at run time only: a dry run of the workflow imports the adapters
    import torch


def frame_positions(base, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids -1, valid) of the frames the feature encoder emits for the padded waveforms of `batch`."""
    import torch

    n, length = batch["input_values"].shape
    # the frames entering the encoder: before wav2vec2's optional adapter stack after it (HuBERT has none)
    encoder_only = {"add_adapter": False} if base.config.model_type == "wav2vec2" else {}
    t = int(base._get_feat_extract_output_lengths(torch.tensor(length), **encoder_only))
    mask = batch.get("attention_mask")
    if mask is None:
        valid = torch.ones(n, t, dtype=torch.bool)
    else:
        valid = base._get_feature_vector_attention_mask(t, mask.long(), **encoder_only).bool()
    return torch.full((n, t), -1, dtype=torch.int64), valid


class Wav2Vec2Adapter(Adapter):
    model_types = ("wav2vec2", "hubert")
    architectures = (
        "Wav2Vec2Model",
        "Wav2Vec2ForCTC",
        "Wav2Vec2ForPreTraining",
        "HubertModel",
        "HubertForCTC",
    )
    modality = "audio"

    def geometry(self, config) -> Geometry:
        return Geometry(
            n_layers=config.num_hidden_layers,
            n_heads=config.num_attention_heads,
            d_model=config.hidden_size,
            d_head=config.hidden_size // config.num_attention_heads,
            rotary_dims=0,
            causal=False,
        )

    def positions(self, base, batch):
        return frame_positions(base, batch)

    def forward_batch(self, base, inputs) -> None:
        mask = inputs.get("attention_mask")
        values = inputs["input_values"].to(base.dtype)  # the extractor's float32, in the dtype the model loaded in
        base(input_values=values, attention_mask=None if mask is None else mask.long())

    def resid_sites(self, base) -> list[ResidSite]:
        encoder = base.encoder
        return [ResidSite(0, encoder.dropout)] + [ResidSite(i + 1, block) for i, block in enumerate(encoder.layers)]

    def layernorm_sites(self, base) -> list[LayerNormSite]:
        encoder, blocks = base.encoder, base.encoder.layers
        n = len(blocks)
        if base.config.do_stable_layer_norm:  # pre-LayerNorm blocks, a final LayerNorm after the last
            sites = []
            for i, block in enumerate(blocks):
                sites.append(LayerNormSite(i + 1, "ln_attn", block.layer_norm))
                sites.append(LayerNormSite(i + 1, "ln_mlp", block.final_layer_norm))
            return sites + [LayerNormSite(n, "final_ln", encoder.layer_norm)]
        sites = [LayerNormSite(0, "ln_embed", encoder.layer_norm)]  # post-LayerNorm: the encoder's before the blocks
        for i, block in enumerate(blocks):
            sites.append(LayerNormSite(i + 1, "ln_attn", block.layer_norm))
            if i + 1 < n:
                sites.append(LayerNormSite(i + 1, "ln_mlp", block.final_layer_norm))
        return sites + [LayerNormSite(n, "final_ln", blocks[-1].final_layer_norm)]

    def attention_sites(self, base) -> list[AttentionSite]:
        return [AttentionSite(i, block.attention) for i, block in enumerate(base.encoder.layers)]

    def embedding_matrices(self, model) -> dict[str, torch.Tensor]:
        return {}  # frames are convolved from the waveform, not looked up: no vocabulary to measure
