"""Which of a checkpoint's files to fetch and load: config.json, the tokenizer's or processor's files, and ONE weight
format (safetensors preferred, ``pytorch_model*.bin`` only without them) with its shard index. Fetch, the weight
hashes and the audit of a grid all choose the same files from here, and find here the shards a checkpoint lacks:
``from_pretrained`` loads every file its shard index names, so a branch holding fewer cannot be loaded."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

CONFIG_FILES = ("config.json",)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    # an image or audio model's processor (AutoImageProcessor / AutoFeatureExtractor / AutoProcessor): fetched with
    # the tokenizer, before the weights, so that the preflight makes the evaluation batch with it (anisweep.media)
    "preprocessor_config.json",
    "processor_config.json",
)
_SAFETENSORS = re.compile(r"[^/]+\.safetensors")
_SAFETENSORS_INDEX = "model.safetensors.index.json"
_BIN = re.compile(r"pytorch_model(?:-\d+-of-\d+)?\.bin")
_BIN_INDEX = "pytorch_model.bin.index.json"
_SHARD = re.compile(r"(.+)-(\d+)-of-(\d+)(\.safetensors|\.bin)")


def select_files(repo_files: Iterable[str]) -> tuple[list[str], list[str]]:
    """From a repo's file list, the files to download and, among them, the weight files.

    Returns ``(wanted, weights)``: config + tokenizer files + one weight format (safetensors preferred,
    ``pytorch_model*.bin`` only when there are no safetensors) + its index. Top-level files only.
    Raises ValueError when the repo has no config.json or no loadable weights.
    """
    top = sorted({f for f in repo_files if "/" not in f})
    weights = [f for f in top if _SAFETENSORS.fullmatch(f)]
    index = _SAFETENSORS_INDEX
    if not weights:
        weights = [f for f in top if _BIN.fullmatch(f)]
        index = _BIN_INDEX
    if not weights:
        raise ValueError(f"no *.safetensors or pytorch_model*.bin weights among its files: {', '.join(top) or 'none'}")
    if "config.json" not in top:
        raise ValueError(f"no config.json among its files: {', '.join(top)}")
    wanted = [f for f in top if f in CONFIG_FILES or f in TOKENIZER_FILES or f == index] + weights
    return sorted(set(wanted)), weights


def weight_files_in(folder: Path) -> list[str]:
    """The weight files ``from_pretrained`` loads from a local folder (same preference as :func:`select_files`)."""
    names = [p.name for p in folder.iterdir() if p.is_file()]
    return select_files(names)[1]


def index_of(weights: Sequence[str]) -> str:
    """The name of the shard index of a checkpoint's weight files (as :func:`select_files` chose them)."""
    return _SAFETENSORS_INDEX if weights[0].endswith(".safetensors") else _BIN_INDEX


def absent_shards(weights: Iterable[str], indexed: Iterable[str] | None = None) -> list[str]:
    """The weight files ``from_pretrained`` would look for that ``weights`` lacks: those the shard index names
    (``indexed``: the files of its ``weight_map``); without the index, those a shard's name announces
    (``model-00001-of-00003.safetensors``: three). The index goes first: a branch may keep stale shards of an
    earlier sharding beside the ones its index names."""
    have = set(weights)
    if indexed is not None:
        return sorted(set(indexed) - have)
    announced = set()
    for name in have:
        if m := _SHARD.fullmatch(name):
            prefix, number, total, suffix = m.groups()
            announced |= {f"{prefix}-{i:0{len(number)}d}-of-{total}{suffix}" for i in range(1, int(total) + 1)}
    return sorted(announced - have)


def lacking(absent: Sequence[str], index: str | None) -> str:
    """How an error says that a branch lacks ``absent`` weight files, named by its shard ``index`` (None: by its
    shards' names)."""
    named = f"its shard index {index} names" if index else "its shards' names announce"
    return f"{named} {', '.join(absent)}, which the branch does not hold"


def absent_in_folder(weights: Sequence[str], folder: Path | None) -> str | None:
    """:func:`lacking` for a checkpoint that holds ``weights``, by the shard index in ``folder`` where it is there
    and readable, else by the shards' names; None when nothing is absent."""
    index = index_of(weights)
    try:
        indexed = set(json.loads((folder / index).read_text())["weight_map"].values()) if folder else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # no index, or one from_pretrained rejects too
        indexed = None
    absent = absent_shards(weights, indexed)
    return lacking(absent, index if indexed is not None else None) if absent else None
