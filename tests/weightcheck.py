"""The metric rows of the weight measure `circuits` and of the logit lens for a tiny saved GPT-NeoX LM, as
metrics.parquet joins them: for tests that need every metric the pipeline writes (test_glossary.py)."""

from __future__ import annotations

import polars as pl
from transformers import GPTNeoXForCausalLM

from anisweep.checkpoints.base import Checkpoint
from anisweep.measures.circuits import circuit_tables
from anisweep.tables import metric_rows
from anisweep.weights.lens import lens_from_hidden
from anisweep.weights.run import open_weights

from conftest import neox_config, padded_batch, run_extract, saved

IDENT = {"family": "test", "model": "m", "seed": 0, "step": 3, "tokens_seen": 30}


def weight_metrics(folder) -> pl.DataFrame:
    path = saved(folder, GPTNeoXForCausalLM, neox_config(), "lm")
    weights = open_weights(Checkpoint(**IDENT, path=str(path)))
    rows, _ = circuit_tables(weights)
    batch = padded_batch()
    tables, _ = run_extract(path, batch)
    lens = lens_from_hidden(tables["hidden"], batch["input_ids"], batch["attention_mask"], weights.layout)
    return pl.concat([metric_rows(IDENT, rows, "circuits"), metric_rows(IDENT, lens, "logit_lens")])
