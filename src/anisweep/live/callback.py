"""The per-checkpoint analysis of a model while it trains: extract's tables and the gradient tables of the
model in memory, at chosen steps, into the layout a sweep of saved checkpoints writes
(`{results}/local/{run}/step{N}/`), so that the same metrics, sweep and figures apply.

`analyse_live` is the plain function for a hand-written loop; `AnisweepCallback` calls it from a
transformers Trainer. Neither touches the optimizer, the parameters' .grad or the training RNG: the model runs
in eval mode (given back in the mode it had), the torch RNG states (CPU and CUDA) are saved and restored, and
the attention implementation is switched to the recording one for extract and back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from anisweep.extract.model import ExtractSettings, LoadedModel
from anisweep.extract.recorder import ATTENTION_NAME, register_attention
from anisweep.extract.run import extract_info, timed_run, write_extract
from anisweep.extract.tables import tables
from anisweep.live.report import calling_handler, checkpoint_scalars, log_through
from anisweep.live.take import live_ident
from anisweep.tangent.checkpoint import pass_tables_of
from anisweep.tangent.settings import GradientSettings


@contextlib.contextmanager
def _training_state_kept(model: nn.Module):
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    was_training = model.training
    attention = model.config._attn_implementation
    try:
        yield
    finally:
        model.set_attn_implementation(attention)
        model.train(was_training)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def check_live_model(model: nn.Module, settings: ExtractSettings, where: str) -> None:
    """The checks the workflow runs on a saved checkpoint's config.json (checkpoints.preflight), on the live
    model's config: its positions against seq_len, its width against the hidden-state sample."""
    from anisweep.checkpoints.preflight import check_model_config

    s = settings
    given = f"ExtractSettings(n_sequences={s.n_sequences}, seq_len={s.seq_len}, sample_tokens={s.sample_tokens})"
    check_model_config(model.config.to_dict(), settings, f"{where} analysed live with {given}")


def analyse_live(
    model: nn.Module,
    batch: dict,
    tokenizer,
    out_dir: str | Path,
    ident: dict,
    settings: ExtractSettings | None = None,
    gradients: GradientSettings | None = None,
    corpus_counts: np.ndarray | None = None,
) -> Path:
    """Write extract's tables, extract.json and (when `gradients.enabled`) the backward pass's tables
    (gradient_sums, gradient_sample: anisweep.tangent.pass_tables, from which the workflow computes
    gradients.parquet) of the model as it is now into `out_dir`. `batch` is the evaluation batch (`input_ids`,
    `attention_mask`: e.g. anisweep.corpus.make_batch, as extract builds it); `ident` the identity columns
    (family, model, seed, step, tokens_seen); `corpus_counts` the training corpus's count per token id, for the
    gradient analysis's frequency strata (the batch's own counts when None). A model the batch or the settings
    do not fit (preflight's checks) is a PreflightError, before anything runs."""
    from anisweep.adapters import adapter_for

    # the batch is what runs: its shape is the settings' n_sequences x seq_len, checked and in extract.json
    n_sequences, seq_len = batch["input_ids"].shape
    settings = settings or ExtractSettings(device="cpu")
    settings = dataclasses.replace(settings, n_sequences=int(n_sequences), seq_len=int(seq_len))
    check_live_model(model, settings, f"{ident.get('family')}/{ident.get('model')}/step{ident.get('step')}")
    gradients = gradients if gradients is not None else GradientSettings(enabled=True)
    out_dir = Path(out_dir)
    adapter = adapter_for(model.config)
    register_attention()
    with _training_state_kept(model):
        model.eval()
        model.set_attn_implementation(ATTENTION_NAME)
        loaded = LoadedModel(model, adapter.base_model(model), adapter, adapter.geometry(model.config))
        recorder, seconds = timed_run(loaded, batch, settings, progress=False)
        written = tables(recorder, loaded, ident, tokenizer, settings.sample_precision)
        model.set_attn_implementation("sdpa")
        if gradients.enabled:
            written |= pass_tables_of(
                model, adapter, batch, tokenizer, gradients, settings.batch_size, ident, False, corpus_counts
            )
    # extract's extract.json, the checkpoint being the identity of the live model
    info = extract_info({**ident, "live": True}, settings, next(model.parameters()).device, batch, recorder, seconds)
    write_extract(out_dir, written, info)
    return out_dir


def _trainer_callback_base():
    try:
        from transformers import TrainerCallback
    except ImportError:  # pragma: no cover - transformers is a dependency
        return object
    return TrainerCallback


class AnisweepCallback(_trainer_callback_base()):
    """At the chosen global steps, `analyse_live` into `{results}/local/{run_name}/step{N}/`: the step training
    begins at (step 0, before any optimizer step) in on_train_begin, the others after their optimizer step. The
    evaluation batch is built once from `texts` with the tokenizer (a PreflightError there when the tokenizer cannot
    read the texts: more unknown tokens than settings.max_unknown_token_share); preflight's checks of the model's
    config run at on_train_begin, before any step. Chosen steps a resumed training has passed, and steps it never
    reached, are warned about (once each).

    With `report` (the default) each analysed step's scalar summaries (anisweep.measures.logged: avg_cos per layer,
    attention entropy, sink mass, rogue and massive shares, IsoScore after the final norm), computed from the
    tables it wrote, go through the Trainer's logging as its loss does, named `geometry/<metric>/<site>/layer_<n>`
    at the step's global_step: every `report_to` integration records them."""

    def __init__(
        self,
        steps: Iterable[int],
        texts: Sequence[str],
        tokenizer,
        run_name: str,
        results: str | Path = "results",
        settings: ExtractSettings | None = None,
        gradients: GradientSettings | None = None,
        tokens_per_step: int | None = None,
        report: bool = True,
    ):
        from anisweep.checkpoints.preflight import check_unknown_tokens
        from anisweep.corpus import make_batch

        self.steps = set(steps)
        self.tokenizer, self.run_name, self.results = tokenizer, run_name, Path(results)
        self.settings = settings or ExtractSettings(device="cpu")
        self.gradients = gradients
        self.tokens_per_step = tokens_per_step
        self.report = report
        self.unreported_warned = False
        s = self.settings
        self.batch = make_batch(tokenizer, list(texts), s.n_sequences, s.seq_len, s.seed)
        source = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
        check_unknown_tokens(tokenizer, self.batch, list(texts), s.max_unknown_token_share, source, f"local/{run_name}")
        self.written: list[Path] = []
        self.pending = set(self.steps)  # the chosen steps this training has neither analysed nor passed

    def _out(self, step: int) -> Path:
        return self.results / "local" / self.run_name / f"step{step}"

    def _analyse(self, args, state, control, step: int, model):
        """The step's analysis when it is pending; the control the Trainer goes on with."""
        if step not in self.pending or model is None:
            return control
        ident = live_ident(self.run_name, step, self.tokens_per_step, getattr(args, "seed", None))
        out = analyse_live(model, self.batch, self.tokenizer, self._out(step), ident, self.settings, self.gradients)
        self.written.append(out)
        self.pending.discard(step)
        return self._report(args, state, control, out) if self.report else control

    def _report(self, args, state, control, out: Path):
        handler = calling_handler()
        if handler is None:
            if not self.unreported_warned:
                warnings.warn(
                    f"AnisweepCallback({self.run_name!r}): not called by a transformers Trainer's callback handler, "
                    "so its summaries go to no logger (the Parquet is written); call it from Trainer.train(), or "
                    "pass report=False",
                    stacklevel=3,
                )
                self.unreported_warned = True
            return control
        return log_through(handler, args, state, control, checkpoint_scalars(out))

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        step = state.global_step  # 0, or the checkpoint's step when the training resumes from one
        if model is not None:
            check_live_model(model, self.settings, f"local/{self.run_name}")
        self.pending = {s for s in self.steps if s >= step}
        passed = sorted(self.steps - self.pending)
        if passed:
            warnings.warn(
                f"AnisweepCallback({self.run_name!r}): the training resumes at step {step}, past the chosen "
                f"steps {passed}; they are not analysed in this run",
                stacklevel=2,
            )
        if step and (self._out(step) / "extract.json").is_file():
            self.pending.discard(step)  # analysed by the run that saved the checkpoint
        return self._analyse(args, state, control, step, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        return self._analyse(args, state, control, state.global_step, model)

    def on_train_end(self, args, state, control, **kwargs):
        if self.pending:
            warnings.warn(
                f"AnisweepCallback({self.run_name!r}): the training ended at step {state.global_step} without "
                f"reaching the chosen steps {sorted(self.pending)}; nothing was written for them",
                stacklevel=2,
            )
        return control
