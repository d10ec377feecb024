"""The logit lens of one checkpoint (anisweep.measures.logit_lens) from extract's sampled residual states (an
encoder's: its states at masked tokens, anisweep.extract.masked), the evaluation batch rebuilt from the corpus and
the tokenizer (its targets), and the checkpoint's own head read from its weights: `logit_lens.parquet`, metric rows
with measure `logit_lens`. Where the lens cannot be read (a model saved without its head, an encoder whose
tokenizer has no mask token, an architecture no layout names) its one row says why (anisweep.tables.unmeasured_row)
and the job succeeds: the checkpoint's metrics stand."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import polars as pl

from anisweep.measures.logit_lens import lens_rows, targets_of
from anisweep.tables import metric_rows, read_parquet, unmeasured_row, vectors
from anisweep.weights.layout import Layout
from anisweep.weights.source import Unmeasurable

MEASURE = "logit_lens"
SITE = "resid"


def lens_from_hidden(
    hidden: pl.DataFrame,
    input_ids,
    attention_mask,
    layout: Layout,
    masked: pl.DataFrame | None = None,
    mask_token: bool = True,
) -> list[dict]:
    """The lens rows from the batch extract ran on and its states: a decoder's from hidden.parquet's `resid` rows,
    an encoder's from masked_resid.parquet (its masked pass: the target is the token masked; `mask_token`: whether
    the tokenizer has one). Unmeasurable where the states or the head are not there."""
    layout.check_head()
    if layout.ENCODER:
        if masked is None or masked.height == 0:
            raise Unmeasurable(no_masked_states(mask_token))
        states, tokens = _states(masked.sort("layer", "seq", "position"))
    else:
        resid = hidden.filter(pl.col("site") == SITE).sort("layer", "seq", "position")
        if resid.height == 0:
            raise Unmeasurable("hidden.parquet has no `resid` rows: no sampled residual states to read")
        states, tokens = _states(resid)
    seq, position = tokens["seq"].to_numpy(), tokens["position"].to_numpy()
    ids, mask = np.asarray(input_ids), np.asarray(attention_mask)
    rebuilt = ids[seq, position]
    if not np.array_equal(rebuilt, tokens["token_id"].to_numpy()):
        wrong = int((rebuilt != tokens["token_id"].to_numpy()).sum())
        raise Unmeasurable(
            f"the evaluation batch rebuilt from the corpus and the tokenizer differs from the one extract ran on at "
            f"{wrong} sampled tokens: the code that builds it or the tokenizer changed since extract ran (a change "
            "of the corpus or the extract settings reruns extract itself); `snakemake --forcerun extract` runs the "
            "model again on today's batch"
        )
    targets = targets_of(ids, mask, seq, position, layout.ENCODER)
    return lens_rows(states, targets, layout.lm_head())


def no_masked_states(mask_token: bool) -> str:
    """Why an encoder's masked_resid.parquet has no rows."""
    if not mask_token:
        return (
            "the tokenizer has no mask token: an encoder's logit lens reads its states at masked tokens (against the "
            "token masked), which extract's masked pass keeps only with a mask token to put there"
        )
    return "extract's masked pass kept no states (masked_resid.parquet has no rows: no text token to mask)"


def _states(rows: pl.DataFrame) -> tuple[dict[int, np.ndarray], pl.DataFrame]:
    """({layer: (n, d) float64}, the n tokens' seq, position, token_id) from rows sorted by layer, seq, position."""
    states, tokens = {}, None
    for (layer,), group in rows.group_by("layer", maintain_order=True):
        states[int(layer)] = vectors(group["vector"]).astype(np.float64)
        if tokens is None:
            tokens = group.select("seq", "position", "token_id")
    return states, tokens


def logit_lens_table(extract_dir: str | Path, weights, settings, texts) -> pl.DataFrame:
    """The checkpoint's lens rows (METRIC_SCHEMA) from its extract folder and `weights` (CheckpointWeights: its
    source's folder holds config.json, and its tokenizer rebuilds the batch); where the lens cannot be read, the
    one row that says why."""
    from anisweep.checkpoints.preflight import evaluation_batch

    ident = weights.identity
    where = f"{ident['family']}/{ident['model']}/step{ident['step']}"
    try:
        weights.layout.check_head()  # before the tokenizer loads
        batch = evaluation_batch(weights.source.folder, weights.tokenizer_path, settings, texts, where)
        hidden = read_parquet(Path(extract_dir) / "hidden.parquet")
        masked = read_parquet(Path(extract_dir) / "masked_resid.parquet") if weights.layout.ENCODER else None
        rows = lens_from_hidden(
            hidden, batch["input_ids"], batch["attention_mask"], weights.layout, masked, "mask_token_id" in batch
        )
    except Unmeasurable as error:
        return lens_not_measured(ident, where, error)
    return metric_rows(ident, rows, MEASURE)


def lens_not_measured(ident: dict, where: str, error: Unmeasurable) -> pl.DataFrame:
    """The lens's one row of a checkpoint it cannot read, with the reason (said in the job's log too)."""
    print(f"logit lens: {where}: {error}: its row says why", file=sys.stderr)
    return metric_rows(ident, [unmeasured_row(MEASURE, SITE, str(error))], MEASURE)
