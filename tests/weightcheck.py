"""The metric rows of the weight measures `circuits` and `weight_matrices` and of the logit lens for a tiny saved
GPT-NeoX LM, as metrics.parquet joins them, and the rows they write where they cannot read a checkpoint (a BERT
saved without its head, an encoder-decoder): for tests that need every metric the pipeline writes (test_glossary.py)."""

from __future__ import annotations

import polars as pl
from transformers import BertForMaskedLM, GPTNeoXForCausalLM, T5ForConditionalGeneration

from anisweep.checkpoints.base import Checkpoint
from anisweep.measures.circuits import circuit_tables
from anisweep.measures.matrices import matrix_rows
from anisweep.tables import metric_rows
from anisweep.weights.builtin import builtin_weight_tables
from anisweep.weights.lens import lens_from_hidden, lens_not_measured
from anisweep.weights.run import open_weights
from anisweep.weights.source import Unmeasurable

from conftest import bert_config, neox_config, padded_batch, run_extract, saved, t5_config

IDENT = {"family": "test", "model": "m", "seed": 0, "step": 3, "tokens_seen": 30}


def weight_metrics(folder) -> pl.DataFrame:
    path = saved(folder, GPTNeoXForCausalLM, neox_config(), "lm")
    weights = open_weights(Checkpoint(**IDENT, path=str(path)))
    rows, _ = circuit_tables(weights)
    batch = padded_batch()
    tables, _ = run_extract(path, batch)
    lens = lens_from_hidden(tables["hidden"], batch["input_ids"], batch["attention_mask"], weights.layout)
    return pl.concat(
        [
            metric_rows(IDENT, rows, "circuits"),
            metric_rows(IDENT, matrix_rows(weights), "weight_matrices"),
            metric_rows(IDENT, lens, "logit_lens"),
            *unreadable_metrics(folder),
        ]
    )


def unreadable_metrics(folder) -> list[pl.DataFrame]:
    """A BERT saved without its MLM head: its circuits (`head_saved` 0) and the logit lens's row that says why; an
    encoder-decoder's built-in weight measures: each one's row that says why."""
    BertForMaskedLM.from_pretrained(saved(folder, BertForMaskedLM, bert_config(), "bert")).bert.save_pretrained(
        folder / "headless"
    )
    headless = open_weights(Checkpoint(**IDENT, path=str(folder / "headless")))
    try:
        lens_from_hidden(pl.DataFrame(), [], [], headless.layout)
    except Unmeasurable as error:
        lens = lens_not_measured(IDENT, "test/m/step3", error)
    t5 = Checkpoint(**IDENT, path=str(saved(folder, T5ForConditionalGeneration, t5_config(), "t5")))
    return [
        metric_rows(IDENT, circuit_tables(headless)[0], "circuits"),
        lens,
        builtin_weight_tables(t5)[0],
    ]
