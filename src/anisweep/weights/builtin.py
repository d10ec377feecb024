"""The built-in weight measure `circuits` (anisweep.measures.circuits) of one checkpoint, as its job writes it: the
metric rows and top token pairs, or, where the checkpoint's tensors cannot be read so (an image or audio model, an
encoder-decoder), the one row that says why (anisweep.tables.unmeasured_row) and no pairs."""

from __future__ import annotations

import sys

from anisweep.checkpoints.base import Checkpoint
from anisweep.measures.circuits import PROBE_TOKENS, SITE, circuit_tables, circuits
from anisweep.measures.registry import measure_of
from anisweep.tables import unmeasured_row
from anisweep.weights.run import open_weights
from anisweep.weights.source import Unmeasurable

MEASURE = measure_of(circuits, "anisweep.measures.circuits:circuits", builtin=True)


def circuits_of(ckpt: Checkpoint, probe_tokens: int = PROBE_TOKENS, fetched=None) -> tuple[list[dict], list[dict]]:
    """(metric rows, pair rows) of the checkpoint; the one row that says why, and no pairs, where its tensors
    cannot be read so."""
    try:
        weights = open_weights(ckpt, MEASURE.tensors, fetched)
        rows, pairs = circuit_tables(weights, probe_tokens)
    except Unmeasurable as error:
        print(f"weights: {ckpt.key}: {error}: circuits writes the row that says so", file=sys.stderr)
        return [unmeasured_row(MEASURE.name, SITE, str(error))], []
    print(f"weights: read {len(weights.read)} tensors, {weights.source.bytes_read} bytes", file=sys.stderr)
    return rows, pairs
