"""Evaluation text -> fixed token batches.

Three sources of text (:func:`load_texts`):

* ``{"source": "builtin"}``: the English documentation shipped inside CPython
  (``pydoc_data.topics``), split into paragraphs. Needs no network; about 0.46 M characters,
  65 k words, with Zipfian word frequencies (exponent ~1.05 over the top 1000 ranks).
* ``{"source": "text", "paths": [...]}``: local UTF-8 files, split into paragraphs.
* ``{"source": "hf_dataset", "name": ..., "config": ..., "split": ..., "column": "text"}``:
  a Hugging Face dataset (the ``datasets`` package is imported only here).

Images and audio (``{"source": "images" | "audio", "paths": [...]}``, or an ``hf_dataset`` with ``modality``) are
read by anisweep.media; :func:`read_corpus` reads either kind of corpus file back.

:func:`make_batch` turns documents into a fixed ``(n_sequences, seq_len)`` batch: the documents
(in a seeded order) are tokenized lazily into one stream separated by the tokenizer's eos (or sep)
token, and ``n_sequences`` non-overlapping windows are cut from it at seeded random offsets, each
wrapped in the tokenizer's own special tokens (``[CLS] ... [SEP]`` for BERT, nothing for GPT-NeoX).
"""

from __future__ import annotations

import collections
import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from anisweep.corpus_files import TEXT_SPLITS, read_text_file

__all__ = [
    "builtin_text",
    "load_texts",
    "split_paragraphs",
    "make_batch",
    "unknown_token_share",
    "read_texts",
    "read_corpus",
    "write_texts",
    "special_affixes",
    "separator_id",
    "tokenize_stream",
    "zipf_exponent",
    "corpus_stats",
]

SOURCES = ("builtin", "text", "hf_dataset", "images", "audio")

# reStructuredText heading underlines ("******", "======", "------") carry no language.
_UNDERLINE = re.compile(r"^\s*([*=\-~^#+\"'`.:])\1{2,}\s*$")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_WORD = re.compile(r"[^\W\d_]+")


def split_paragraphs(text: str) -> list[str]:
    """Split a text into paragraphs at blank lines; drop heading underlines and empty paragraphs."""
    out = []
    for para in _PARAGRAPH_BREAK.split(text):
        lines = [line.rstrip() for line in para.splitlines() if not _UNDERLINE.match(line)]
        para = "\n".join(lines).strip("\n")
        if para.strip():
            out.append(para)
    return out


@functools.lru_cache(maxsize=1)
def _builtin_paragraphs() -> tuple[str, ...]:
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:  # some distributions strip it (e.g. python3-minimal)
        raise RuntimeError(
            "the builtin corpus needs CPython's `pydoc_data` module (pydoc_data.topics), which this "
            "Python installation lacks; install the full Python standard library, or use a "
            "'text' or 'hf_dataset' corpus source instead"
        ) from exc
    docs: list[str] = []
    for key in sorted(topics):
        docs.extend(split_paragraphs(topics[key]))
    return tuple(docs)


def builtin_text() -> list[str]:
    """The English documentation bundled with CPython (``pydoc_data.topics``), as paragraphs.

    Topics are taken in sorted key order, so the list is deterministic for a given Python version
    (about 2,500 paragraphs, 0.46 M characters and 65 k words on Python 3.11).
    """
    return list(_builtin_paragraphs())


def load_texts(source: Mapping[str, Any]) -> list[str]:
    """Load the documents of an evaluation corpus described by ``source``.

    * ``{"source": "builtin"}``
    * ``{"source": "text", "paths": [...], "split": "paragraph" | "line" | "file"}`` (UTF-8; the
      default splits each file into paragraphs at blank lines)
    * ``{"source": "hf_dataset", "name": ..., "config": None, "split": "train", "column": "text"}``
    """
    if not isinstance(source, Mapping):
        raise TypeError(f"corpus source must be a mapping like {{'source': 'builtin'}}, got {source!r}")
    kind = source.get("source", "builtin")
    if kind == "builtin":
        return builtin_text()
    if kind == "text":
        paths = source.get("paths")
        if isinstance(paths, (str, Path)):
            paths = [paths]
        if not paths:
            raise ValueError("corpus source 'text' needs a non-empty 'paths' list of UTF-8 files")
        mode = source.get("split", "paragraph")
        docs: list[str] = []
        for path in paths:
            text = read_text_file(path)
            if mode == "paragraph":
                docs.extend(split_paragraphs(text))
            elif mode == "line":
                docs.extend(line for line in text.splitlines() if line.strip())
            elif mode == "file":
                if text.strip():
                    docs.append(text)
            else:
                raise ValueError(f"corpus 'split' must be one of {', '.join(TEXT_SPLITS)}, got {mode!r}")
        return docs
    if kind == "hf_dataset":
        try:
            import datasets
        except ImportError as exc:
            raise ImportError(
                "corpus source 'hf_dataset' needs the Hugging Face `datasets` package: pip install datasets"
            ) from exc
        name = source.get("name")
        if not name:
            raise ValueError("corpus source 'hf_dataset' needs a dataset 'name' (e.g. 'Salesforce/wikitext')")
        column = source.get("column", "text")
        from anisweep.media import load_dataset_or_explain  # a gated dataset's refusal says what to do

        ds = load_dataset_or_explain(datasets, name, source.get("config"), source.get("split", "train"))
        if column not in ds.column_names:
            raise ValueError(f"dataset {name!r} has no column {column!r}; columns: {ds.column_names}")
        return [t for t in ds[column] if isinstance(t, str) and t.strip()]
    raise ValueError(f"unknown corpus source {kind!r}; expected one of {', '.join(SOURCES)}")


def write_texts(texts: Sequence[str], path: str | Path) -> None:
    """The documents of a corpus as one Parquet column, written atomically."""
    import polars as pl

    from anisweep.tables import write_atomic

    write_atomic(pl.DataFrame({"text": list(texts)}, schema={"text": pl.String}), path)


def read_texts(path: str | Path) -> list[str]:
    from anisweep.tables import read_parquet

    return read_parquet(path)["text"].to_list()


def read_corpus(path: str | Path):
    """The corpus step's file: the documents of a text corpus, or an image or audio corpus (anisweep.media)."""
    from anisweep.media import read_media
    from anisweep.tables import read_parquet

    frame = read_parquet(path)
    return frame["text"].to_list() if "text" in frame.columns else read_media(frame)


# --------------------------------------------------------------------------- tokenization


def special_affixes(tokenizer) -> tuple[list[int], list[int]]:
    """The special-token ids a tokenizer puts before and after ONE sequence.

    BERT: ``([cls], [sep])``; GPT-NeoX (Pythia): ``([], [])``. Uses
    ``build_inputs_with_special_tokens`` where the tokenizer has it (Python tokenizers), else
    compares an encoding with and without special tokens (fast tokenizers in transformers 5).
    """
    build = getattr(tokenizer, "build_inputs_with_special_tokens", None)
    if callable(build):
        sentinel = -987654321
        full = list(build([sentinel]))
        if full.count(sentinel) == 1:
            i = full.index(sentinel)
            return full[:i], full[i + 1 :]
    probe = "The quick brown fox, 42 times."
    plain = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    full = list(tokenizer(probe, add_special_tokens=True)["input_ids"])
    n = len(plain)
    for i in range(len(full) - n + 1):
        if full[i : i + n] == plain:
            prefix, suffix = full[:i], full[i + n :]
            expected = tokenizer.num_special_tokens_to_add(pair=False)
            if len(prefix) + len(suffix) != expected:
                raise RuntimeError(
                    f"tokenizer adds {expected} special tokens but {len(prefix) + len(suffix)} were found "
                    f"around the probe text; cannot build windows for {type(tokenizer).__name__}"
                )
            return prefix, suffix
    raise RuntimeError(f"cannot locate the text inside the special-token template of {type(tokenizer).__name__}")


def separator_id(tokenizer) -> int | None:
    """The token placed between documents in the stream: eos if the tokenizer has one, else sep."""
    for attr in ("eos_token_id", "sep_token_id"):
        tid = getattr(tokenizer, attr, None)
        if tid is not None:
            return int(tid)
    return None


def tokenize_stream(
    tokenizer,
    texts: Iterable[str],
    max_tokens: int | None = None,
    *,
    chunk_size: int = 64,
    separators: list[int] | None = None,
) -> list[int]:
    """Tokenize documents (no special tokens) into one stream separated by :func:`separator_id`.

    With ``max_tokens``, documents are tokenized only until that many tokens are collected and the
    stream is cut to exactly ``max_tokens``, so the result does not depend on ``chunk_size``.
    ``separators``, when given, receives the stream positions of the separators.
    """
    sep = separator_id(tokenizer)
    stream: list[int] = []
    chunk: list[str] = []

    def flush() -> None:
        encoded = tokenizer(chunk, add_special_tokens=False, verbose=False)["input_ids"]
        for ids in encoded:
            if not ids:
                continue
            if stream and sep is not None:
                if separators is not None:
                    separators.append(len(stream))
                stream.append(sep)
            stream.extend(ids)
        chunk.clear()

    for text in texts:
        if not text or not text.strip():
            continue
        chunk.append(text)
        if len(chunk) >= chunk_size:
            flush()
            if max_tokens is not None and len(stream) >= max_tokens:
                break
    else:
        if chunk:
            flush()
    if max_tokens is not None and len(stream) > max_tokens:
        del stream[max_tokens:]
    return stream


def make_batch(
    tokenizer,
    texts: Sequence[str],
    n_sequences: int,
    seq_len: int,
    seed: int,
    *,
    margin: float = 2.0,
    shuffle_documents: bool = True,
) -> dict:
    """A fixed evaluation batch: ``input_ids`` and ``attention_mask``, int64, ``(n_sequences, seq_len)``, and
    ``unknown_mask``, bool, True where the tokenizer's unknown token stands for text it could not read (never a
    separator or special token that shares its id, as ``<|endoftext|>`` does in byte-level BPE tokenizers).

    Documents are visited in a seeded order (``shuffle_documents``) and tokenized lazily until
    ``margin`` times the needed content tokens are collected (the rest of a large corpus is never
    tokenized); ``n_sequences`` non-overlapping windows of ``seq_len - n_special`` tokens are taken
    at seeded random offsets (uniform over all non-overlapping placements) and wrapped in the
    tokenizer's special tokens. Every position is a real token: the attention mask is all ones.
    The same tokenizer, texts and seed always give the same batch. A tokenizer with a mask token adds
    ``mask_token_id`` and ``special_ids`` (mask_token_of), which the model never takes.
    """
    if int(n_sequences) < 1:
        raise ValueError(f"n_sequences must be >= 1, got {n_sequences}")
    if margin < 1.0:
        raise ValueError(f"margin must be >= 1, got {margin}")
    n_sequences, seq_len = int(n_sequences), int(seq_len)
    prefix, suffix = special_affixes(tokenizer)
    n_special = len(prefix) + len(suffix)
    content_len = seq_len - n_special
    if content_len < 1:
        raise ValueError(f"seq_len={seq_len} leaves no room for text: the tokenizer adds {n_special} special tokens")
    needed = n_sequences * content_len
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(texts)) if shuffle_documents else np.arange(len(texts))
    target = max(needed, int(math.ceil(needed * margin)))
    separators: list[int] = []
    stream = tokenize_stream(tokenizer, (texts[i] for i in order), max_tokens=target, separators=separators)
    if len(stream) < needed:
        special = f" plus {n_special} special tokens each" if n_special else ""
        raise ValueError(
            f"evaluation corpus too short: it has {len(stream)} tokens ({len(texts)} documents), but "
            f"n_sequences x seq_len = {n_sequences} x {seq_len} needs {needed} text tokens "
            f"({n_sequences} x {content_len}{special}); lower n_sequences or seq_len, or add text"
        )
    # Stars and bars: n sorted draws from the slack give uniformly random non-overlapping windows.
    slack = len(stream) - needed
    starts = np.sort(rng.integers(0, slack + 1, size=n_sequences)) + np.arange(n_sequences) * content_len
    tokens = torch.tensor(stream, dtype=torch.int64)
    idx = torch.from_numpy(starts.astype(np.int64))[:, None] + torch.arange(content_len)[None, :]
    body = tokens[idx]
    unknown = _unknown_in(tokenizer, tokens, separators)[idx]
    parts = []
    if prefix:
        parts.append(torch.tensor(prefix, dtype=torch.int64).expand(n_sequences, -1))
    parts.append(body)
    if suffix:
        parts.append(torch.tensor(suffix, dtype=torch.int64).expand(n_sequences, -1))
    input_ids = torch.cat(parts, dim=1).contiguous()
    unknown_mask = torch.zeros_like(input_ids, dtype=torch.bool)
    unknown_mask[:, len(prefix) : len(prefix) + content_len] = unknown
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "unknown_mask": unknown_mask}
    return batch | mask_token_of(tokenizer)


def mask_token_of(tokenizer) -> dict:
    """`mask_token_id` and `special_ids` of a tokenizer with a mask token (an MLM's: extract's masked pass,
    anisweep.extract.masked), else nothing."""
    mask = getattr(tokenizer, "mask_token_id", None)
    if mask is None:
        return {}
    return {"mask_token_id": int(mask), "special_ids": tuple(int(i) for i in tokenizer.all_special_ids)}


def _unknown_in(tokenizer, tokens: torch.Tensor, separators: list[int]) -> torch.Tensor:
    """Where the token stream holds the unknown token, separators excluded."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return torch.zeros_like(tokens, dtype=torch.bool)
    unknown = tokens == int(unk)
    unknown[[p for p in separators if p < len(tokens)]] = False
    return unknown


def unknown_token_share(batch: Mapping[str, torch.Tensor]) -> float | None:
    """The share of the batch's valid tokens that are the tokenizer's unknown token (:func:`make_batch`'s
    ``unknown_mask``); None for a batch without that mask."""
    if "unknown_mask" not in batch:
        return None
    valid = batch["attention_mask"].bool()
    n_valid = int(valid.sum())
    return int((batch["unknown_mask"] & valid).sum()) / n_valid if n_valid else 0.0


# --------------------------------------------------------------------------- corpus statistics


def _word_counts(texts: Iterable[str]) -> collections.Counter:
    counts: collections.Counter = collections.Counter()
    for text in texts:
        counts.update(_WORD.findall(text.lower()))
    return counts


def zipf_exponent(texts: Iterable[str], max_rank: int = 1000, min_rank: int = 1) -> float:
    """Least-squares slope ``s`` of ``log f = c - s log r`` over word ranks ``min_rank..max_rank``.

    Words are lower-cased runs of letters. Natural language gives ``s`` close to 1.
    """
    freqs = np.array(sorted(_word_counts(texts).values(), reverse=True), dtype=np.float64)
    hi = min(max_rank, len(freqs))
    if hi - min_rank + 1 < 3:
        raise ValueError("too few distinct words to fit a Zipf exponent")
    ranks = np.arange(min_rank, hi + 1, dtype=np.float64)
    slope = np.polyfit(np.log(ranks), np.log(freqs[min_rank - 1 : hi]), 1)[0]
    return float(-slope)


def corpus_stats(texts: Sequence[str], max_rank: int = 1000) -> dict[str, float | int]:
    """Documents, characters, words, distinct words and Zipf exponent of a corpus."""
    counts = _word_counts(texts)
    return {
        "documents": len(texts),
        "characters": sum(len(t) for t in texts),
        "words": int(sum(counts.values())),
        "distinct_words": len(counts),
        "zipf_exponent": zipf_exponent(texts, max_rank=max_rank),
    }
