"""A weight measure of one checkpoint, from its weights alone: where the tensors come from (a local or toy folder
read in place, a Hub repository's in the copy of the run's fetch, else by range reads of its safetensors), and the
tables it writes (metric rows, measure = its name; the built-in `circuits` also its top token pairs,
weight_pairs.parquet)."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl

from anisweep.checkpoints.base import Checkpoint
from anisweep.measures.registry import WEIGHT_SITE, Measure, MeasureError, checkpoint_name, measure_frame, taken
from anisweep.tables import IDENTITY, unmeasured_row, with_identity
from anisweep.weights.checkpoint import CheckpointWeights
from anisweep.weights.source import LocalSource, Unmeasurable

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json")
PAIR_SCHEMA = {
    "layer": pl.Int64,
    "head": pl.Int64,
    "kind": pl.String,
    "rank": pl.Int64,
    "score": pl.Float64,
    "src_id": pl.Int64,
    "dst_id": pl.Int64,
    "src_token": pl.String,
    "dst_token": pl.String,
}


def identity(ckpt: Checkpoint) -> dict:
    return {key: getattr(ckpt, key) for key in IDENTITY}


def open_weights(ckpt: Checkpoint, allowed=None, fetched: str | Path | None = None) -> CheckpointWeights:
    """The checkpoint's weights: a Hub repository's in the copy its fetch shared (`fetched`, in the run that
    downloaded them: anisweep.weights.fetched), else by range reads (anisweep.weights.remote); a folder's in place."""
    if ckpt.is_hub:
        from anisweep.weights.fetched import fetched_source
        from anisweep.weights.remote import hub_source

        source, tokenizer = fetched_source(fetched) or hub_source(ckpt)
    else:
        folder = Path(ckpt.path or "")
        source = LocalSource(folder)
        tokenizer = ckpt.tokenizer or next(
            (p for p in (folder, folder.parent) if any((p / f).is_file() for f in TOKENIZER_FILES)), None
        )
    return CheckpointWeights(source, allowed, tokenizer, identity(ckpt))


def run_weight_measure(
    measure: Measure, ckpt: Checkpoint, weights: CheckpointWeights | None = None, fetched: str | Path | None = None
) -> pl.DataFrame:
    """The measure's rows of the checkpoint, any failure a MeasureError naming the measure and the checkpoint. Where
    what it reads is not in the checkpoint (an architecture no layout names, a model saved without its head), its
    one row says why (anisweep.tables.unmeasured_row), said in the log too."""
    ident = identity(ckpt)
    where = f"measure {measure.name!r} ({measure.entry}) at {checkpoint_name(ident)}"
    try:
        rows = _rows(measure, weights if weights is not None else open_weights(ckpt, measure.tensors, fetched), where)
    except Unmeasurable as error:
        print(f"weights: {where}: {error}: its row says why", file=sys.stderr)
        rows = [unmeasured_row(measure.name, WEIGHT_SITE, str(error))]
    return measure_frame(measure, ident, rows)


def _rows(measure: Measure, weights: CheckpointWeights, where: str):
    try:
        return taken(measure.target(weights))
    except Unmeasurable:
        raise
    except MeasureError as error:
        raise MeasureError(f"{where}: {error}") from error
    except Exception as error:
        raise MeasureError(f"{where} failed: {type(error).__name__}: {error}") from error


def pair_frame(ident: dict, pairs: list[dict]) -> pl.DataFrame:
    """weight_pairs.parquet: each head's top token pairs (kind `qk`: query -> key by score; `ov`: input -> the
    output token it promotes, by logit) with the identity columns."""
    df = pl.DataFrame(pairs, schema=PAIR_SCHEMA)
    return with_identity(df, ident)
