"""What an adapter tells the extractor: where each quantity lives in one architecture.

The adapter is the only code that knows module names. The tables name what was measured by their own
sites (`resid`, `final_ln_out`, `ln_attn_in`, ...); `TRANSFORMERLENS_HOOKS` says which TransformerLens
hook point each one equals, for comparing with work done in TransformerLens (`adapters/README.md` shows
it as a table).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the annotations only: the workflow imports the adapters without torch when it is parsed
    import torch
    from torch import nn

#: (tables, site) -> (the TransformerLens hook point holding the same vectors in a pre-LayerNorm decoder such
#: as GPT-NeoX/Pythia (`HookedTransformer`), the same in BERT (`HookedEncoder`: LayerNorm after each residual
#: add)). Hook names as in TransformerLens's source (`components/`); `{l}` is the row's `layer` column. The
#: tables count layers two ways: q/k and attention rows count blocks from 0 (layer l = `blocks.{l}`); residual
#: and LayerNorm rows count from the embedding (layer 0 = the embedding output, layer l = block l-1's output
#: and LayerNorms). TransformerLens hooks no LayerNorm's input (`hook_scale` holds only its scale): the
#: `*_in` sites are the residual hook feeding it. Every `*_out` is the output with gain and bias, as
#: `hook_normalized` is when TransformerLens loads a model without folding LayerNorms
#: (`from_pretrained_no_processing`).
TRANSFORMERLENS_HOOKS: dict[tuple[str, str], tuple[str, str]] = {
    ("hidden_stats, hidden", "resid, layer 0"): (
        "blocks.0.hook_resid_pre (= hook_embed, + hook_pos_embed with learned positions)",
        "blocks.0.hook_resid_pre (= hook_full_embed, after embed.ln)",
    ),
    ("hidden_stats, hidden", "resid, layer l >= 1"): (
        "blocks.{l-1}.hook_resid_post",
        "blocks.{l-1}.hook_normalized_resid_post",
    ),
    ("hidden_stats", "ln_embed_in / ln_embed_out"): (
        "(no such LayerNorm)",
        "hook_embed + hook_pos_embed + hook_token_type_embed / embed.ln.hook_normalized",
    ),
    ("hidden_stats", "ln_attn_in / ln_attn_out"): (
        "blocks.{l-1}.hook_resid_pre / blocks.{l-1}.ln1.hook_normalized",
        "blocks.{l-1}.hook_resid_mid / blocks.{l-1}.ln1.hook_normalized",
    ),
    ("hidden_stats", "ln_mlp_in / ln_mlp_out"): (
        "blocks.{l-1}.hook_resid_pre (parallel residual, as Pythia; else hook_resid_mid)"
        " / blocks.{l-1}.ln2.hook_normalized",
        "blocks.{l-1}.hook_resid_post / blocks.{l-1}.ln2.hook_normalized (the last block's is final_ln)",
    ),
    ("hidden_stats, hidden", "final_ln_in / final_ln_out"): (
        "blocks.{l-1}.hook_resid_post / ln_final.hook_normalized",
        "blocks.{l-1}.hook_resid_post / blocks.{l-1}.hook_normalized_resid_post (the last block's ln2)",
    ),
    ("hidden_stats", "ln_attn_post_in / ln_attn_post_out (OLMo 2)"): (
        "blocks.{l-1}.hook_attn_out / blocks.{l-1}.ln1.hook_normalized",
        "(no such norm)",
    ),
    ("hidden_stats", "ln_mlp_post_in / ln_mlp_post_out (OLMo 2)"): (
        "blocks.{l-1}.hook_mlp_out / blocks.{l-1}.ln2.hook_normalized",
        "(no such norm)",
    ),
    ("hidden_stats", "ln_cross_in / ln_cross_out (T5's decoder)"): (
        "(no such norm: TransformerLens's HookedEncoderDecoder is not mapped here)",
        "(no such norm)",
    ),
    ("hidden_stats", "encoder_final_ln_in / encoder_final_ln_out (T5's encoder)"): (
        "(no such norm: TransformerLens's HookedEncoderDecoder is not mapped here)",
        "(no such norm)",
    ),
    ("hidden_stats", "stage_ln_in / stage_ln_out (MiT's stages)"): (
        "(no such norm: TransformerLens maps no vision model)",
        "(no such norm)",
    ),
    ("qk", "rope = pre_norm (OLMo 2)"): (
        "blocks.{l}.attn.hook_q / hook_k (TransformerLens applies q_norm / k_norm after them)",
        "(no q/k norm)",
    ),
    ("qk", "rope = pre"): (
        "blocks.{l}.attn.hook_q / hook_k (OLMo 2: after q_norm / k_norm, no hook); with grouped-query"
        " attention hook_k has the key heads, our kv_head",
        "blocks.{l}.attn.hook_q / hook_k",
    ),
    ("qk", "rope = post"): ("blocks.{l}.attn.hook_rot_q / hook_rot_k", "(no rotary embeddings)"),
    ("attention", "scores: score_mean, score_std"): (
        "blocks.{l}.attn.hook_attn_scores",
        "blocks.{l}.attn.hook_attn_scores",
    ),
    ("attention", "probabilities: entropy, p_max, p_median, p_min"): (
        "blocks.{l}.attn.hook_pattern",
        "blocks.{l}.attn.hook_pattern",
    ),
}


def transformerlens_table() -> str:
    """`TRANSFORMERLENS_HOOKS` as the markdown table of `adapters/README.md` (which a test keeps equal)."""
    lines = [
        "| tables | site | decoders: GPT-NeoX, GPT-2, Llama, OLMo, OLMo 2 (`HookedTransformer`)"
        " | BERT (`HookedEncoder`) |",
        "|---|---|---|---|",
    ]
    for (tables, site), (decoder, encoder) in TRANSFORMERLENS_HOOKS.items():
        lines.append(f"| {tables} | {site} | {decoder} | {encoder} |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Geometry:
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    rotary_dims: int  # 0 for models without rotary embeddings
    causal: bool
    n_kv_heads: int = 0  # grouped-query attention: key/value heads; 0 = one per query head
    pre_norm_qk: bool = False  # q and k pass a norm of their own before the rotation (OLMo 2)
    causal_layers: tuple[int, ...] = ()  # layers causal in a model that is not (an encoder-decoder's decoder)
    cross_layers: tuple[int, ...] = ()  # layers with a cross-attention beside their self-attention (T5's decoder)
    #: per layer, query heads and their width where they differ from layer to layer (a hierarchical model: MiT's and
    #: CvT's stages widen); () where every layer has n_heads of d_head
    layer_heads: tuple[int, ...] = ()
    layer_d_head: tuple[int, ...] = ()

    def heads(self, layer: int) -> int:
        """Query heads of `layer`."""
        return self.layer_heads[layer] if self.layer_heads else self.n_heads

    def head_width(self, layer: int) -> int:
        """d_head of `layer`."""
        return self.layer_d_head[layer] if self.layer_d_head else self.d_head

    def is_causal(self, layer: int) -> bool:
        """Whether `layer`'s self-attention hides later keys."""
        return self.causal or layer in self.causal_layers

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def group(self) -> int:
        """Query heads per key head: query head h attends with key head h // group."""
        return self.n_heads // self.kv_heads if self.kv_heads else 1  # 1 where there is no attention (a CNN)

    @property
    def ropes(self) -> tuple[str, ...]:
        """The `rope` values of qk.parquet: where q and k are read. `pre_norm` is before a q/k norm, `pre`
        what the rotation turns (or what attention sees, without rotary), `post` what attention sees."""
        return ("pre_norm",) * self.pre_norm_qk + (("pre", "post") if self.rotary_dims else ("pre",))


@dataclass(frozen=True)
class ResidSite:
    """A module whose output is the residual stream after `layer` blocks (0 = embedding output). `site` names
    another stream read the same way (T5's decoder embedding, `decoder_embed`); `width`, where it is not the
    model's d_model. A module applied several times in one forward (ALBERT's shared layer, T5's shared embedding)
    is listed once per application, in the order they run: the hook counts them."""

    layer: int
    module: nn.Module
    site: str = "resid"
    width: int | None = None
    channels_first: bool = False  # a convolution's (B, C, H, W) map: its H * W cells are the positions, C wide


@dataclass(frozen=True)
class LayerNormSite:
    """A LayerNorm, named `site` (`final_ln` for the last one before the unembedding)."""

    layer: int
    site: str
    module: nn.Module
    width: int | None = None  # where it is not d_model (ALBERT's embedding LayerNorm, at the embedding size)


@dataclass(frozen=True)
class AttentionSite:
    """An attention module whose calls of the registered attention function belong to `layer` (for modules
    without a `layer_idx` of their own, or applied several times: list one site per application, in order);
    `cross`: a cross-attention (queries from the decoder, keys from the encoder), kept in tables of its own."""

    layer: int
    module: nn.Module
    cross: bool = False


@dataclass(frozen=True)
class OwnAttention:
    """An attention module that computes its attention itself, never calling the registered attention function
    (CANINE): a forward hook hands the recorder the q, k, v that `qkv(args)` makes from the module's inputs (each
    (B, heads, T, d_head)) and the module's `scaling`; the recorder's statistics come from them, and the model's
    output stays the module's own."""

    layer: int
    module: nn.Module
    qkv: Callable[[tuple], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    scaling: float


@dataclass(frozen=True)
class PreRotaryQK:
    """A module whose output holds pre-rotary q and/or k; `split` maps it to (q, k) as (B, heads, T, d_head),
    None for the one it does not hold (separate q and k projections are two sites). `rope` names the
    qk.parquet rows it feeds (`pre`, or `pre_norm` for q/k before their own norm)."""

    layer: int
    module: nn.Module
    split: Callable[[torch.Tensor], tuple[torch.Tensor | None, torch.Tensor | None]]
    rope: str = "pre"


def heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, n_heads * d_head) -> (B, n_heads, T, d_head)."""
    b, t, _ = x.shape
    return x.view(b, t, n_heads, -1).transpose(1, 2)


def norm_parameters(module: nn.Module) -> tuple[float | None, torch.Tensor | None, torch.Tensor | None]:
    """(eps, gain, bias) of a LayerNorm-like module, each None where it has none: RMSNorm has a gain only
    (its eps is `variance_epsilon` in transformers), OLMo's LayerNorm neither (eps fixed at 1e-5 in its
    forward, not stored)."""
    eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
    gain, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    return (None if eps is None else float(eps)), gain, bias


class Adapter:
    """Base class: subclasses fill in the module names of one architecture family."""

    model_types: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()
    #: what the model reads: `text` (token ids), `image` (pixel values) or `audio` (waveforms or log-mel features)
    modality: str = "text"
    #: the `attention_mask` transformers passes the attention function is an additive score bias (BEiT's relative
    #: positions), never a padding mask
    mask_is_bias: bool = False
    #: the attention module multiplies q by its `scaling` before the attention interface and passes scaling 1
    #: (Whisper): the recording function divides it back out, so that q is the projection's, as for every model
    query_prescaled: bool = False
    #: the attention implementation the model loads with: None for the recording function (`anisweep`); "eager" for
    #: a model whose attention never calls it (then `own_attention` names the modules the recorder hooks)
    attn_implementation: str | None = None
    #: a masked language model whose `output_hidden_states` are its residual stream: extract adds the masked pass
    #: (anisweep.extract.masked) that the logit lens of an encoder reads
    masked_lm: bool = False

    def geometry(self, config) -> Geometry:
        raise NotImplementedError

    def base_model(self, model: nn.Module) -> nn.Module:
        return model.base_model

    def resid_sites(self, base: nn.Module) -> list[ResidSite]:
        raise NotImplementedError

    def layernorm_sites(self, base: nn.Module) -> list[LayerNormSite]:
        raise NotImplementedError

    def pre_rotary_qk(self, base: nn.Module, geometry: Geometry) -> list[PreRotaryQK]:
        """Empty when the attention function already sees pre-rotary q and k."""
        return []

    def attention_sites(self, base: nn.Module) -> list[AttentionSite]:
        """Empty where every attention module has its own `layer_idx` and is applied once per forward."""
        return []

    def own_attention(self, base: nn.Module, geometry: Geometry) -> list[OwnAttention]:
        """Attention modules that compute attention themselves (see OwnAttention); empty for the others."""
        return []

    def recorded_positions(
        self, config, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids, valid mask) of the sequence every site and attention the adapter names runs over: the input
        itself, unless the recorded stack runs on another sequence (CANINE's deep stack, on molecules)."""
        return input_ids, attention_mask

    def positions(self, base: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, valid mask), each (N, T), of the positions the tables cover for the whole evaluation `batch`: for
        text the tokens (`recorded_positions`); for images and audio the patches, frames or cells the model's
        layers see (ids -1: no token stands there)."""
        return self.recorded_positions(base.config, batch["input_ids"], batch["attention_mask"].bool())

    def other_token_ids(self, batch: dict[str, torch.Tensor]) -> dict[int, torch.Tensor]:
        """The (N, T') token ids of a sequence of T' positions that some sites run on beside `positions`' (Whisper's
        decoder, on its own tokens), by T', read after `positions`: the tables name those sites' tokens by them.
        Empty where every site runs on `positions`' sequence or on positions without tokens (an image's cells)."""
        return {}

    def forward_batch(self, base: nn.Module, inputs: dict[str, torch.Tensor]) -> None:
        """Run the base model on one mini-batch of the evaluation batch's model inputs (`input_ids` and
        `attention_mask` for text; the processor's tensors for images and audio)."""
        self.forward(base, inputs["input_ids"], inputs["attention_mask"].long())

    def forward(self, base: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Run the base model on one mini-batch, without a KV cache (an encoder-decoder runs its encoder, then its
        decoder on the same text teacher-forced, and no LM head)."""
        base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)

    def rotary_embedding(self, base: nn.Module) -> nn.Module:
        """The base model's rotary module: called on (x, position_ids), it gives the (cos, sin) its blocks take
        as `position_embeddings` (running one block alone, as the untrained block does)."""
        raise NotImplementedError(f"{type(self).__name__}: no rotary embedding")

    def embedding_matrices(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """`embed_in` and, when the checkpoint has an LM head, `embed_out` (V x d)."""
        matrices = {"embed_in": model.get_input_embeddings().weight}
        out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if out is not None:
            matrices["embed_out"] = out.weight
        return matrices
