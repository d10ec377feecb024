"""Which tensor of a saved checkpoint is what, per architecture: the attention's W_Q, W_K, W_V (heads, d_head,
d_model) and W_O (heads, d_model, d_head) of each layer (grouped-query heads expanded to the query heads), the
token embedding, the norm that acts before each layer's attention, the final norm and the unembedding (an
encoder's: its MLM head's decoder). Column-vector convention: a head's query of x is W_Q[h] @ x, its write is
W_O[h] @ (W_V[h] @ x). Weights only: the projections' biases are not part of W_QK and W_VO (Elhage et al. 2021).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from anisweep.measures.registry import WEIGHT_ROLES as ROLES  # the roles a weight measure may name
from anisweep.weights.source import Unmeasurable, WeightsError

__all__ = ["ROLES", "Heads", "Layout", "MissingHead", "Norm", "Shapes", "UnsupportedLayout", "layout_for"]


@dataclass(frozen=True)
class Norm:
    """A normalisation: `layer` (LayerNorm: centred, divided by the standard deviation), `rms` (RMSNorm) or `none`,
    with its gain and bias (None where it has none: OLMo's non-parametric LayerNorm)."""

    kind: str
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    eps: float = 1e-5

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "layer":
            x = x - x.mean(-1, keepdim=True)
            x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        elif self.kind == "rms":
            x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            x = x * self.weight
        if self.bias is not None:
            x = x + self.bias
        return x


class Heads:
    """One layer's attention weights per head (float64): q, k, v (H, d_head, d_model), o (H, d_model, d_head). Each
    is a tensor or a function that reads it, called on first use: a measure of W_Q and W_K never reads W_V or W_O."""

    def __init__(self, q, k, v, o):
        self._parts = {"q": q, "k": k, "v": v, "o": o}

    def _part(self, name: str) -> torch.Tensor:
        part = self._parts[name]
        if callable(part):
            part = self._parts[name] = part()
        return part

    q = property(lambda self: self._part("q"))
    k = property(lambda self: self._part("k"))
    v = property(lambda self: self._part("v"))
    o = property(lambda self: self._part("o"))


@dataclass(frozen=True)
class Shapes:
    n_layers: int
    n_heads: int
    kv_heads: int
    d_head: int
    d_model: int
    vocab_size: int
    encoder: bool


class Layout:
    """The names of one architecture's tensors; `get(name)` reads one (float64)."""

    def __init__(
        self,
        config: dict,
        names: list[str],
        get: Callable[[str], torch.Tensor],
        get_rows: Callable[[str, Sequence[tuple[int, int]]], torch.Tensor] | None = None,
    ):
        self.config = config
        self.names = set(names)
        self._get = get
        self._get_rows = get_rows or (lambda name, spans: torch.cat([get(name)[a:b] for a, b in spans]))
        self.model_type = config.get("model_type")
        self.prefix = self._prefix()

    def get(self, name: str) -> torch.Tensor:
        return self._get(name).to(torch.float64)

    def rows(self, name: str, spans: Sequence[tuple[int, int]]) -> torch.Tensor:
        """Rows [a, b) of each span of a matrix, in order, stacked (float64): only those rows are read."""
        return self._get_rows(name, spans).to(torch.float64)

    def _prefix(self) -> str:
        for key in self.names:
            if key.endswith(self.EMBEDDING):
                return key[: -len(self.EMBEDDING)]
        raise WeightsError(f"{self.model_type}: no token embedding (*{self.EMBEDDING}) among the checkpoint's tensors")

    def has(self, name: str) -> bool:
        return name in self.names

    @property
    def shapes(self) -> Shapes:
        c = self.config
        d_model = c.get("hidden_size") or c.get("n_embd")
        n_heads = c.get("num_attention_heads") or c.get("n_head")
        return Shapes(
            n_layers=c.get("num_hidden_layers") or c.get("n_layer"),
            n_heads=n_heads,
            kv_heads=c.get("num_key_value_heads") or n_heads,
            d_head=c.get("head_dim") or d_model // n_heads,
            d_model=d_model,
            vocab_size=c["vocab_size"],
            encoder=self.ENCODER,
        )

    @property
    def head_saved(self) -> bool:
        """Whether the checkpoint holds the output head the logit lens reads (an encoder's MLM head: a BertModel is
        saved without one)."""
        return True

    def check_head(self) -> None:
        """MissingHead where the checkpoint was saved without its output head."""

    def embedding(self) -> torch.Tensor:
        return self.get(self.prefix + self.EMBEDDING)

    def tied(self) -> bool:
        """Whether the unembedding is the token embedding: no unembedding tensor saved, or one equal to it."""
        name = self._unembedding_name()
        return name is None or torch.equal(self._get(name), self._get(self.prefix + self.EMBEDDING))

    def unembedding(self) -> torch.Tensor:
        """(vocab, d_model): the output matrix the logits are read through."""
        name = self._unembedding_name()
        if name is None:
            if self.config.get("tie_word_embeddings", True) is False:
                raise WeightsError(
                    f"{self.model_type}: tie_word_embeddings is false but none of {self.UNEMBEDDING} is saved"
                )
            return self.embedding()
        return self.get(name)

    def lm_head(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The model's own map from a residual state (n, d_model) to logits (n, vocab): the final norm, then the
        unembedding (the logit lens reads every layer through it)."""
        norm, u = self.final_norm(), self.unembedding()
        return lambda h: norm(h.to(torch.float64)) @ u.T

    def _unembedding_name(self) -> str | None:
        return next((n for n in self.UNEMBEDDING if n in self.names), None)

    def _split_heads(self, w: torch.Tensor, heads: int) -> torch.Tensor:
        """(heads*d_head, d_model) rows grouped by head -> (heads, d_head, d_model)."""
        return w.reshape(heads, -1, w.shape[-1])

    def _expand(self, w: torch.Tensor) -> torch.Tensor:
        """Key/value heads repeated for the query heads that share them (grouped-query attention)."""
        s = self.shapes
        return w.repeat_interleave(s.n_heads // s.kv_heads, dim=0)

    def _out(self, w: torch.Tensor) -> torch.Tensor:
        """The output projection (d_model, heads*d_head) -> (heads, d_model, d_head)."""
        s = self.shapes
        return w.reshape(w.shape[0], s.n_heads, s.d_head).permute(1, 0, 2).contiguous()

    def _norm(self, kind: str, base: str | None, eps_key: str = "layer_norm_eps") -> Norm:
        eps = float(self.config.get(eps_key) or self.config.get("layer_norm_epsilon") or 1e-5)
        if base is None:
            return Norm(kind, eps=eps)
        bias = f"{base}.bias"
        return Norm(
            kind,
            self.get(f"{base}.weight"),
            self.get(bias) if self.has(bias) else None,
            eps,
        )


class Bert(Layout):
    ENCODER = True
    EMBEDDING = "embeddings.word_embeddings.weight"
    UNEMBEDDING = ("cls.predictions.decoder.weight",)

    def attention(self, layer: int) -> Heads:
        p, s = f"{self.prefix}encoder.layer.{layer}.attention.", self.shapes
        q, k, v = (
            lambda n=n: self._split_heads(self.get(f"{p}self.{n}.weight"), s.n_heads) for n in ("query", "key", "value")
        )
        return Heads(q, k, v, lambda: self._out(self.get(f"{p}output.dense.weight")))

    def attention_norm(self, layer: int) -> Norm:
        """Post-LN: the LayerNorm that last acted before the layer's attention (the embeddings' for layer 0)."""
        base = "embeddings.LayerNorm" if layer == 0 else f"encoder.layer.{layer - 1}.output.LayerNorm"
        return self._norm("layer", self.prefix + base)

    @property
    def head_saved(self) -> bool:
        return self.has("cls.predictions.transform.LayerNorm.weight")

    def check_head(self) -> None:
        if not self.head_saved:
            raise MissingHead(
                "bert: the checkpoint was saved without its MLM head (no cls.predictions.* among its tensors: a "
                "BertModel, e.g. a sentence-embedding model), so no states can be read through it"
            )

    def final_norm(self) -> Norm:
        """The MLM head's transform LayerNorm, right before its decoder."""
        self.check_head()
        return self._norm("layer", "cls.predictions.transform.LayerNorm")

    def lm_head(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The MLM head: dense, its activation, the transform LayerNorm, the decoder and its bias."""
        self.check_head()
        dense = self.get("cls.predictions.transform.dense.weight")
        dense_bias = self.get("cls.predictions.transform.dense.bias")
        norm, u = self.final_norm(), self.unembedding()
        name = next((n for n in ("cls.predictions.bias", "cls.predictions.decoder.bias") if self.has(n)), None)
        bias = self.get(name) if name is not None else torch.zeros(u.shape[0], dtype=torch.float64)
        act = self.config.get("hidden_act", "gelu")
        if act not in ACTIVATIONS:
            raise WeightsError(f"bert: the MLM head's activation {act!r} is not one of {sorted(ACTIVATIONS)}")
        return lambda h: norm(ACTIVATIONS[act](h.to(torch.float64) @ dense.T + dense_bias)) @ u.T + bias


ACTIVATIONS = {
    "gelu": torch.nn.functional.gelu,
    "gelu_new": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "relu": torch.relu,
}


class GPTNeoX(Layout):
    ENCODER = False
    EMBEDDING = "embed_in.weight"
    UNEMBEDDING = ("embed_out.weight", "lm_head.weight")

    def attention(self, layer: int) -> Heads:
        p = f"{self.prefix}layers.{layer}.attention."
        fused = f"{p}query_key_value.weight"  # per head, its q, k and v rows one after the other
        q, k, v = (self._fused_part(fused, part) for part in range(3))
        return Heads(q, k, v, lambda: self._out(self.get(f"{p}dense.weight")))

    def _fused_part(self, name: str, part: int) -> Callable[[], torch.Tensor]:
        """The reader of W_Q (part 0), W_K (1) or W_V (2) from the fused matrix: each head's block of rows alone."""
        s = self.shapes
        spans = [
            (h * 3 * s.d_head + part * s.d_head, h * 3 * s.d_head + (part + 1) * s.d_head) for h in range(s.n_heads)
        ]
        return lambda: self.rows(name, spans).reshape(s.n_heads, s.d_head, s.d_model)

    def attention_norm(self, layer: int) -> Norm:
        return self._norm("layer", f"{self.prefix}layers.{layer}.input_layernorm")

    def final_norm(self) -> Norm:
        return self._norm("layer", f"{self.prefix}final_layer_norm")


class Llama(Layout):
    ENCODER = False
    EMBEDDING = "embed_tokens.weight"
    UNEMBEDDING = ("lm_head.weight",)

    def attention(self, layer: int) -> Heads:
        p, s = f"{self.prefix}layers.{layer}.self_attn.", self.shapes
        return Heads(
            lambda: self._split_heads(self.get(f"{p}q_proj.weight"), s.n_heads),
            lambda: self._expand(self._split_heads(self.get(f"{p}k_proj.weight"), s.kv_heads)),
            lambda: self._expand(self._split_heads(self.get(f"{p}v_proj.weight"), s.kv_heads)),
            lambda: self._out(self.get(f"{p}o_proj.weight")),
        )

    def attention_norm(self, layer: int) -> Norm:
        return self._norm("rms", f"{self.prefix}layers.{layer}.input_layernorm", "rms_norm_eps")

    def final_norm(self) -> Norm:
        return self._norm("rms", f"{self.prefix}norm", "rms_norm_eps")


class Olmo(Llama):
    """OLMo (1): LayerNorms without parameters, before attention and at the end."""

    def attention_norm(self, layer: int) -> Norm:
        return self._norm("layer", None)

    def final_norm(self) -> Norm:
        return self._norm("layer", None)


class Olmo2(Llama):
    """OLMo 2: norms after the attention and the MLP (none before the attention: its embeddings are RMS-normalised
    without a gain here), and RMSNorms of the whole q and k projections, whose gains are folded into W_Q and W_K
    (their per-token scale is not a weight)."""

    def attention(self, layer: int) -> Heads:
        p, s = f"{self.prefix}layers.{layer}.self_attn.", self.shapes
        heads = super().attention(layer)
        return Heads(
            lambda: self._split_heads(
                self.get(f"{p}q_norm.weight")[:, None] * self.get(f"{p}q_proj.weight"), s.n_heads
            ),
            lambda: self._expand(
                self._split_heads(self.get(f"{p}k_norm.weight")[:, None] * self.get(f"{p}k_proj.weight"), s.kv_heads)
            ),
            lambda: heads.v,
            lambda: heads.o,
        )

    def attention_norm(self, layer: int) -> Norm:
        return self._norm("rms", None, "rms_norm_eps")


class GPT2(Layout):
    """GPT-2's Conv1D weights are (in, out): transposed here."""

    ENCODER = False
    EMBEDDING = "wte.weight"
    UNEMBEDDING = ("lm_head.weight",)

    def attention(self, layer: int) -> Heads:
        p, s = f"{self.prefix}h.{layer}.attn.", self.shapes
        q, k, v = (self._split_heads(w, s.n_heads) for w in self.get(f"{p}c_attn.weight").T.split(s.d_model, dim=0))
        return Heads(q, k, v, self._out(self.get(f"{p}c_proj.weight").T))

    def attention_norm(self, layer: int) -> Norm:
        return self._norm("layer", f"{self.prefix}h.{layer}.ln_1")

    def final_norm(self) -> Norm:
        return self._norm("layer", f"{self.prefix}ln_f")


LAYOUTS = {"bert": Bert, "gpt_neox": GPTNeoX, "llama": Llama, "olmo": Olmo, "olmo2": Olmo2, "gpt2": GPT2}


class UnsupportedLayout(Unmeasurable):
    """An architecture whose tensors no layout names: the weight measures and the logit lens record why, as their one
    row with a reason."""


class MissingHead(Unmeasurable):
    """A checkpoint saved without its output head (a BertModel, without cls.predictions.*): no logit lens, and no
    final norm (the MLM head's transform LayerNorm); the circuits read W_OV through the tied word embeddings."""


def layout_for(config: dict, names: list[str], get: Callable[[str], torch.Tensor], get_rows=None) -> Layout:
    model_type = config.get("model_type")
    if model_type not in LAYOUTS:
        raise UnsupportedLayout(
            f"weight measures read the tensors of {sorted(LAYOUTS)}; this checkpoint's model_type is {model_type!r}"
        )
    return LAYOUTS[model_type](config, names, get, get_rows)
