"""The gradient analysis's model side: the backward pass of a model in memory (a checkpoint in extract's job, or
a model being trained) as its tables (anisweep.tangent.pass_tables), and `analyse_model`, the pass and every
share at once (anisweep.tangent.analysis), for a model in a notebook.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from torch import nn

from anisweep.tangent.analysis import analyse
from anisweep.tangent.backward import gradient_pass
from anisweep.tangent.batch import lm_batch, read_token_counts
from anisweep.tangent.settings import GradientSettings

if TYPE_CHECKING:
    from collections.abc import Callable

    from anisweep.adapters import Adapter
    from anisweep.extract.model import LoadedModel


def analyse_model(
    model: nn.Module,
    adapter: Adapter,
    batch: dict,
    tokenizer,
    settings: GradientSettings,
    batch_size: int,
    progress: bool = True,
    fixed: dict | None = None,
    bases_out: dict | None = None,
    corpus_counts: np.ndarray | None = None,
) -> pl.DataFrame:
    """The gradient pass and every share, of a model in memory (a checkpoint, or a model being trained).
    `fixed` and `bases_out` as in `analyse`."""
    geometry_ = adapter.geometry(model.config)
    masking = {"probability": settings.mlm_probability, "seed": settings.seed}
    vocab = model.get_output_embeddings().weight.shape[0]
    lm = lm_batch(batch, geometry_.causal, tokenizer, vocab_size=vocab, corpus_counts=corpus_counts, **masking)
    result = gradient_pass(model, adapter, geometry_.d_model, geometry_.n_layers, lm, settings, batch_size, progress)
    return analyse(result, settings, geometry_.d_model, progress, fixed=fixed, bases_out=bases_out)


def pass_tables_of(
    model: nn.Module,
    adapter: Adapter,
    batch: dict,
    tokenizer,
    settings: GradientSettings,
    batch_size: int,
    ident: dict,
    progress: bool = True,
    corpus_counts: np.ndarray | None = None,
) -> dict[str, pl.DataFrame]:
    """The backward pass of a model in memory as its tables (anisweep.tangent.pass_tables), with identity columns;
    with `gradients.embedding_change` also embedding_rows, the kept token-embedding rows. `corpus_counts`: the
    training corpus's count per token id, for the strata (anisweep.tangent.batch.frequency_strata)."""
    from anisweep.tables import with_identity
    from anisweep.tangent import embedding_change
    from anisweep.tangent.pass_tables import pass_tables

    if model.get_output_embeddings() is None:
        raise ValueError(
            f"gradients: the model is a {type(model).__name__}, without an LM head: the gradient of the LM loss needs "
            "the checkpoint's LM class (e.g. BertForMaskedLM, GPTNeoXForCausalLM); leave its steps out of "
            "gradients.steps or set gradients.enabled: false"
        )
    geometry_ = adapter.geometry(model.config)
    masking = {"probability": settings.mlm_probability, "seed": settings.seed}
    vocab = model.get_output_embeddings().weight.shape[0]
    lm = lm_batch(batch, geometry_.causal, tokenizer, vocab_size=vocab, corpus_counts=corpus_counts, **masking)
    result = gradient_pass(model, adapter, geometry_.d_model, geometry_.n_layers, lm, settings, batch_size, progress)
    print(f"gradients: backward pass {result.seconds:.2f} s", file=sys.stderr)
    tables = pass_tables(result)
    if settings.embedding_change:
        kept = embedding_change.sample_ids(
            lm.token_ids, lm.valid, settings.embedding_tokens, settings.seed, lm.corpus_counts, lm.special_ids
        )
        weights = model.get_input_embeddings().weight.detach().float().cpu().numpy()
        tables["embedding_rows"] = embedding_change.embedding_rows(weights, kept)
    return {name: with_identity(table, ident) for name, table in tables.items()}


def pass_tables_for(
    manifest: dict, gradients: GradientSettings, batch_size: int, progress: bool = True
) -> Callable[[LoadedModel, dict, dict], dict[str, pl.DataFrame]]:
    """extract's `more_tables` for a checkpoint of a sweep with the gradient analysis on: the pass's tables where
    gradients.steps covers the checkpoint, the same tables without rows where it does not. Its `needs_lm_head`
    tells extract that a checkpoint lacking its LM head is an error there, before anything runs."""
    from anisweep.checkpoints import preflight
    from anisweep.tables import with_identity
    from anisweep.tangent.embedding_change import EMBEDDING_SCHEMA
    from anisweep.tangent.pass_tables import empty_pass_tables

    covered = gradients.steps is None or manifest["step"] in gradients.steps

    def more_tables(loaded: LoadedModel, batch: dict, ident: dict) -> dict[str, pl.DataFrame]:
        if not covered:
            empty = empty_pass_tables()
            if gradients.embedding_change:
                empty["embedding_rows"] = pl.DataFrame(schema=EMBEDDING_SCHEMA)
            return {name: with_identity(table, ident) for name, table in empty.items()}
        where = f"{manifest['family']}/{manifest['model']}/step{manifest['step']}"
        tokenizer = preflight.load_tokenizer(manifest.get("tokenizer_path"), manifest["path"], where)
        loaded.model.set_attn_implementation("sdpa")
        counts = read_token_counts(manifest["path"])
        return pass_tables_of(
            loaded.model, loaded.adapter, batch, tokenizer, gradients, batch_size, ident, progress, counts
        )

    more_tables.needs_lm_head = covered  # the loss runs through the head: it must be the checkpoint's own
    return more_tables
