"""What a weight measure gets: one checkpoint's weights by role, read on first use, never a forward pass.

`CheckpointWeights(source, allowed)` answers `shapes` (layers, heads, d_head, d_model, vocabulary, encoder or
not), `config` (its config.json), `tokens(ids)` (the tokenizer's strings), `head_saved` (False for a BERT saved
without its MLM head), and the tensors of the roles a measure declares (anisweep.weights.layout.ROLES):
`embedding()`, `unembedding()` (an encoder's MLM decoder; `tied` says whether it is the embedding), `final_norm()`,
`attention(layer)` (W_Q, W_K, W_V, W_O per head) and `attention_norm(layer)`. A role the measure did not declare is
a MeasureError; `read` lists the tensors read. What the checkpoint lacks (`final_norm()` of a model saved without
its head) is anisweep.weights.source.Unmeasurable: the measure's one row then says why.
"""

from __future__ import annotations

import re
from functools import cached_property

import torch

from anisweep.measures.registry import MeasureError
from anisweep.weights.layout import ROLES, Heads, Layout, Norm, Shapes, layout_for

PER_LAYER = re.compile(r"\.\d+\.")  # a tensor of one layer: `...layers.3.attention...`


class CheckpointWeights:
    def __init__(self, source, allowed=None, tokenizer_path=None, identity: dict | None = None):
        self.source = source
        self.allowed = None if allowed is None else frozenset(allowed)
        self.tokenizer_path = tokenizer_path
        self.identity = dict(identity or {})
        self.read: list[str] = []
        self._kept: dict[str, torch.Tensor] = {}
        self.layout: Layout = layout_for(source.config, source.names(), self._get, self._get_rows)

    def _get(self, name: str) -> torch.Tensor:
        """One tensor from the source; those outside the layers (embeddings, final norm) kept once read, since several
        roles read them (a layer's tensors are read once per layer)."""
        if name in self._kept:
            return self._kept[name]
        if name not in self.read:
            self.read.append(name)
        tensor = self.source.get(name)
        if not PER_LAYER.search(name):
            self._kept[name] = tensor
        return tensor

    def _get_rows(self, name: str, spans) -> torch.Tensor:
        """Rows of one matrix (a fused QKV's heads), read alone where the source can."""
        if name in self._kept:
            return torch.cat([self._kept[name][a:b] for a, b in spans])
        if name not in self.read:
            self.read.append(name)
        if hasattr(self.source, "get_rows"):
            return self.source.get_rows(name, spans)
        tensor = self.source.get(name)
        return torch.cat([tensor[a:b] for a, b in spans])

    def _allow(self, role: str) -> None:
        if self.allowed is not None and role not in self.allowed:
            raise MeasureError(f"reads {role!r} but declares tensors={sorted(self.allowed)}: add it there")

    @property
    def config(self) -> dict:
        return self.source.config

    @property
    def shapes(self) -> Shapes:
        return self.layout.shapes

    def embedding(self) -> torch.Tensor:
        self._allow("embedding")
        return self.layout.embedding()

    def unembedding(self) -> torch.Tensor:
        self._allow("unembedding")
        return self.layout.unembedding()

    @property
    def head_saved(self) -> bool:
        """Whether the checkpoint holds its output head (a BertModel is saved without its MLM head: `final_norm()`
        then raises anisweep.weights.layout.MissingHead, `unembedding()` is the tied word embeddings)."""
        return self.layout.head_saved

    @cached_property
    def tied(self) -> bool:
        self._allow("unembedding")
        return self.layout.tied()

    def final_norm(self) -> Norm:
        self._allow("final_norm")
        return self.layout.final_norm()

    def attention(self, layer: int) -> Heads:
        self._allow("attention")
        return self.layout.attention(layer)

    def attention_norm(self, layer: int) -> Norm:
        self._allow("attention_norm")
        return self.layout.attention_norm(layer)

    @cached_property
    def _tokenizer(self):
        if self.tokenizer_path is None:
            return None
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.tokenizer_path))

    def tokens(self, ids) -> list[str]:
        """The tokenizer's string of each id (`#id` where the checkpoint has no tokenizer or the id is beyond it)."""
        ids = [int(i) for i in ids]
        if self._tokenizer is None:
            return [f"#{i}" for i in ids]
        size = len(self._tokenizer)
        strings = self._tokenizer.convert_ids_to_tokens([i if i < size else 0 for i in ids])
        return [s if i < size and s is not None else f"#{i}" for i, s in zip(ids, strings, strict=True)]


def check_roles(roles) -> list[str]:
    """The roles a weight measure declares that are not ROLES."""
    return [r for r in roles if r not in ROLES]
