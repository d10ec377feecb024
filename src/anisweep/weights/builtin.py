"""The built-in weight measures `circuits` (anisweep.measures.circuits) and `weight_matrices`
(anisweep.measures.matrices) of one checkpoint, as its job writes them, the weights read once for both: the metric
rows and the circuits' top token pairs, or, where the checkpoint's tensors cannot be read so (an image or audio model,
an encoder-decoder), each measure's one row that says why (anisweep.tables.unmeasured_row) and no pairs."""

from __future__ import annotations

import sys

import polars as pl

from anisweep.checkpoints.base import Checkpoint
from anisweep.measures.circuits import PROBE_TOKENS, SITE, circuit_tables, circuits
from anisweep.measures.matrices import matrix_rows, weight_matrices
from anisweep.measures.registry import measure_frame, measure_of
from anisweep.tables import unmeasured_row
from anisweep.weights.run import identity, open_weights
from anisweep.weights.source import Unmeasurable

MEASURE = measure_of(circuits, "anisweep.measures.circuits:circuits", builtin=True)
MATRICES = measure_of(weight_matrices, "anisweep.measures.matrices:weight_matrices", builtin=True)


def builtin_weight_tables(
    ckpt: Checkpoint, probe_tokens: int = PROBE_TOKENS, fetched=None
) -> tuple[pl.DataFrame, list[dict]]:
    """(weights.parquet: the rows of both built-in weight measures, pair rows of the circuits) of the checkpoint,
    its weights read from `fetched` where fetch shared a copy with this job."""
    ident = identity(ckpt)
    try:
        weights = open_weights(ckpt, MEASURE.tensors, fetched)
    except Unmeasurable as error:
        print(f"weights: {ckpt.key}: {error}: each built-in measure writes the row that says so", file=sys.stderr)
        frames = [measure_frame(m, ident, [unmeasured_row(m.name, SITE, str(error))]) for m in (MEASURE, MATRICES)]
        return pl.concat(frames), []
    frames, pairs = [], []
    runs = ((MEASURE, lambda: circuit_tables(weights, probe_tokens)), (MATRICES, lambda: (matrix_rows(weights), [])))
    for measure, run in runs:
        try:
            rows, found = run()
        except Unmeasurable as error:
            print(f"weights: {ckpt.key}: {error}: {measure.name} writes the row that says so", file=sys.stderr)
            rows, found = [unmeasured_row(measure.name, SITE, str(error))], []
        frames.append(measure_frame(measure, ident, rows))
        pairs += found
    print(f"weights: read {len(weights.read)} tensors, {weights.source.bytes_read} bytes", file=sys.stderr)
    return pl.concat(frames), pairs
