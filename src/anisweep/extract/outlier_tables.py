"""extract's tables of the few tokens and keys that stand out, from a Recorder's accumulators: the tokens with the
largest activations at each hidden site (massive.parquet), the attention each key position receives per head
(sinks.parquet) and the keys that receive the most (sink_keys.parquet). Each token is named by its sequence and
position in the evaluation batch, its id where the Recorder holds the batch's ids (`token_ids`), and its kind:
`first` (its sequence's first valid token), `delimiter` (a special token of the model's config or of its tokenizer,
or a token whose text is punctuation or whitespace only, where the tokenizer loads from the model's folder) or
`other`. The tokenizer's special tokens count because a config often names none of them: BERT's config.json has no
sep_token_id, and [SEP], the sink of Clark et al. (2019), would be `other`; its unknown and mask tokens do not count
(unless they are also its bos, eos, sep, cls or pad token, as GPT-NeoX's <|endoftext|> is all of them)."""

from __future__ import annotations

import unicodedata
from functools import cache
from pathlib import Path

import polars as pl
import torch

from anisweep.tables import EXTRACT_SCHEMAS

#: The config's special token ids taken as delimiters (document separators, sequence boundaries).
SPECIAL_TOKEN_KEYS = ("bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id", "pad_token_id")
KINDS = ("first", "delimiter", "other")


class TokenKinds:
    """Token ids and kinds of (seq, position) pairs of the evaluation batch: of `token_ids`' sequence, or of another
    of T positions whose ids `other_ids` holds under T (Whisper's decoder tokens)."""

    def __init__(self, token_ids: torch.Tensor | None, config=None, tokenizer=None, other_ids=None):
        self.token_ids = token_ids
        self.other_ids = other_ids or {}
        self.special = set()
        for key in SPECIAL_TOKEN_KEYS:
            value = getattr(config, key, None)
            for token in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(token, int):
                    self.special.add(token)
        self.special |= tokenizer_delimiters(tokenizer)
        self.tokenizer = tokenizer

    def token_id(self, seq: int, position: int, length: int | None = None) -> int | None:
        """The id at (seq, position) of the sequence of `length` positions (None: `token_ids`' own)."""
        ids = self.token_ids
        if length is not None and (ids is None or length != ids.shape[1]):
            ids = self.other_ids.get(length)
        if ids is None or seq >= ids.shape[0] or position >= ids.shape[1]:
            return None
        token = int(ids[seq, position])
        return token if token >= 0 else None  # -1: a patch, frame or cell, no token (adapters' positions)

    def text(self, token_id: int | None) -> str | None:
        if token_id is None or self.tokenizer is None:
            return None
        try:
            return self.tokenizer.decode([token_id])
        except Exception:  # a tokenizer that cannot decode the id: no text, the kind from the config alone
            return None

    def kind(self, first: bool, token_id: int | None, text: str | None) -> str:
        if first:
            return "first"
        if token_id in self.special or (text is not None and is_delimiter_text(text)):
            return "delimiter"
        return "other"

    def describe(self, seq: int, position: int, first: bool, length: int | None = None) -> dict:
        token_id = self.token_id(seq, position, length)
        text = self.text(token_id)
        return {"token_id": token_id, "token": text, "kind": self.kind(first, token_id, text)}


def tokenizer_delimiters(tokenizer) -> set[int]:
    """The ids of `tokenizer`'s special tokens (all_special_ids: [CLS], [SEP], [PAD], Whisper's task tokens, ...)
    but its unknown and mask tokens, unless one is also its bos, eos, sep, cls or pad token."""
    if tokenizer is None:
        return set()
    named = {getattr(tokenizer, key, None) for key in SPECIAL_TOKEN_KEYS}
    not_delimiters = {getattr(tokenizer, "unk_token_id", None), getattr(tokenizer, "mask_token_id", None)} - named
    special = set(getattr(tokenizer, "all_special_ids", None) or ())
    return {int(token) for token in special - not_delimiters if isinstance(token, int)}


def is_delimiter_text(text: str) -> bool:
    """Punctuation or whitespace only ("." "\\n" "," ";" ...); an empty decoding is not a delimiter."""
    return bool(text) and all(ch.isspace() or unicodedata.category(ch).startswith("P") for ch in text)


@cache
def _tokenizer_at(folder: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    for place in (Path(folder), Path(folder).parent):
        try:  # remote code only where the checkpoint's entry allows it, as for the model
            return AutoTokenizer.from_pretrained(place, trust_remote_code=trust_remote_code)
        except Exception:  # no tokenizer files here (weights-only folders): try the run folder, then give up
            continue
    return None


def token_kinds(recorder, model, trust_remote_code: bool = False, tokenizer=None) -> TokenKinds:
    """The kinds of the Recorder's batch, with the model's config and the tokenizer given or, where one loads
    from the model's folder (or its parent, a run folder), that one."""
    token_ids = getattr(recorder, "token_ids", None)
    folder = getattr(model, "name_or_path", "") or ""
    readable = folder and Path(folder).is_dir() and token_ids is not None
    if tokenizer is None and readable:
        tokenizer = _tokenizer_at(str(folder), trust_remote_code)
    other_ids = getattr(recorder, "grid_token_ids", None)
    return TokenKinds(token_ids, getattr(model, "config", None), tokenizer, other_ids)


def massive_table(recorder, kinds: TokenKinds) -> pl.DataFrame:
    """Per hidden site (layer, site), its TOP_K tokens by their largest |component|, largest first (`rank` 0):
    value = max_j |x_j|, dim = its j."""
    rows = []
    for (layer, site), stats in sorted(recorder.vectors.items()):
        top = stats.top_tokens()
        length = getattr(recorder, "site_lengths", {}).get((layer, site))  # a site on a sequence of its own
        for rank, (value, seq, position, dim, first) in enumerate(
            zip(top["value"], top["seq"], top["position"], top["dim"], top["first"])
        ):
            rows.append(
                {
                    "layer": layer,
                    "site": site,
                    "rank": rank,
                    "seq": seq,
                    "position": position,
                    **kinds.describe(seq, position, bool(first), length),
                    "dim": dim,
                    "value": value,
                }
            )
    return pl.DataFrame(rows, schema=EXTRACT_SCHEMAS["massive"])


def sinks_table(recorder) -> pl.DataFrame:
    """Per layer and head: the valid query rows, the attention on each sequence's first valid key summed over them,
    and per key position the attention received summed over rows and sequences (`received`) and the number of
    sequences whose key there is valid (`key_count`); per sequence, its first valid key's importance (the attention
    it receives summed over the sequence's valid rows over their number, `first_importance`)."""
    rows = []
    for layer, stats in sorted(recorder.sinks.items()):
        first = stats.first.cpu().tolist()
        received = stats.received.cpu().tolist()
        counts = stats.key_counts.cpu().tolist()
        importance = stats.first_importances().tolist()
        for head in range(stats.n_heads):
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "n_rows": stats.n_rows,
                    "n_seqs": stats.n_seqs,
                    "first_received": first[head],
                    "received": received[head],
                    "key_count": counts,
                    "first_importance": importance[head],
                }
            )
    return pl.DataFrame(rows, schema=EXTRACT_SCHEMAS["sinks"])


def sink_keys_table(recorder, kinds: TokenKinds) -> pl.DataFrame:
    """Per layer and head, the TOP_K keys of the batch that receive the most attention (column sum over the valid
    query rows of their sequence), most first: `received`, and `share` = received / the sequence's valid rows."""
    rows = []
    for layer, stats in sorted(recorder.sinks.items()):
        top = stats.top_keys()
        length = int(stats.key_counts.numel())  # the layer's key positions (Whisper's decoder: its own tokens)
        for head in range(stats.n_heads):
            for rank, (received, n_rows, seq, position, first) in enumerate(
                zip(*(top[name][head] for name in ("received", "rows", "seq", "position", "first")))
            ):
                rows.append(
                    {
                        "layer": layer,
                        "head": head,
                        "rank": rank,
                        "seq": seq,
                        "position": position,
                        **kinds.describe(seq, position, bool(first), length),
                        "received": received,
                        "share": received / n_rows if n_rows else None,
                    }
                )
    return pl.DataFrame(rows, schema=EXTRACT_SCHEMAS["sink_keys"])
