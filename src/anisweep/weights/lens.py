"""The logit lens of one checkpoint (anisweep.measures.logit_lens) from extract's sampled residual states (an
encoder's: its states at masked tokens, anisweep.extract.masked), the evaluation batch rebuilt from the corpus and
the tokenizer (its targets), and the checkpoint's own head read from its weights: `logit_lens.parquet`, metric rows
with measure `logit_lens`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from anisweep.measures.logit_lens import lens_rows, targets_of
from anisweep.tables import metric_rows, read_parquet
from anisweep.weights.layout import Layout
from anisweep.weights.source import WeightsError

MEASURE = "logit_lens"


def lens_from_hidden(
    hidden: pl.DataFrame, input_ids, attention_mask, layout: Layout, masked: pl.DataFrame | None = None
) -> list[dict]:
    """The lens rows from the batch extract ran on and its states: a decoder's from hidden.parquet's `resid` rows,
    an encoder's from masked_resid.parquet (its masked pass: the target is the token masked)."""
    if layout.ENCODER:
        if masked is None or masked.height == 0:
            raise WeightsError(
                "masked_resid.parquet has no rows: an encoder's logit lens reads the states at masked tokens, which "
                "extract keeps where the tokenizer has a mask token (rerun extract, or the tokenizer has none)"
            )
        states, tokens = _states(masked.sort("layer", "seq", "position"))
    else:
        resid = hidden.filter(pl.col("site") == "resid").sort("layer", "seq", "position")
        if resid.height == 0:
            raise WeightsError("hidden.parquet has no `resid` rows: the logit lens reads the sampled residual stream")
        states, tokens = _states(resid)
    seq, position = tokens["seq"].to_numpy(), tokens["position"].to_numpy()
    ids, mask = np.asarray(input_ids), np.asarray(attention_mask)
    rebuilt = ids[seq, position]
    if not np.array_equal(rebuilt, tokens["token_id"].to_numpy()):
        wrong = int((rebuilt != tokens["token_id"].to_numpy()).sum())
        raise WeightsError(
            f"the evaluation batch rebuilt from the corpus differs from extract's at {wrong} sampled tokens: rerun "
            "extract (the corpus or the extract settings changed since)"
        )
    targets = targets_of(ids, mask, seq, position, layout.ENCODER)
    return lens_rows(states, targets, layout.lm_head())


def _states(rows: pl.DataFrame) -> tuple[dict[int, np.ndarray], pl.DataFrame]:
    """({layer: (n, d) float64}, the n tokens' seq, position, token_id) from rows sorted by layer, seq, position."""
    states, tokens = {}, None
    for (layer,), group in rows.group_by("layer", maintain_order=True):
        states[int(layer)] = np.stack(group["vector"].to_list()).astype(np.float64)
        if tokens is None:
            tokens = group.select("seq", "position", "token_id")
    return states, tokens


def logit_lens_table(extract_dir: str | Path, weights, settings, texts) -> pl.DataFrame:
    """The checkpoint's lens rows (METRIC_SCHEMA) from its extract folder and `weights` (CheckpointWeights: its
    source's folder holds config.json, and its tokenizer rebuilds the batch)."""
    from anisweep.checkpoints.preflight import evaluation_batch

    ident = weights.identity
    where = f"{ident['family']}/{ident['model']}/step{ident['step']}"
    batch = evaluation_batch(weights.source.folder, weights.tokenizer_path, settings, texts, where)
    hidden = read_parquet(Path(extract_dir) / "hidden.parquet")
    masked = read_parquet(Path(extract_dir) / "masked_resid.parquet") if weights.layout.ENCODER else None
    rows = lens_from_hidden(hidden, batch["input_ids"], batch["attention_mask"], weights.layout, masked)
    return metric_rows(ident, rows, MEASURE)
