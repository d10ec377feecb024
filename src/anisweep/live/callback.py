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
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import nn

from anisweep.extract.model import ExtractSettings, LoadedModel
from anisweep.extract.recorder import ATTENTION_NAME, register_attention
from anisweep.extract.run import extract_info, timed_run, write_extract
from anisweep.extract.tables import tables
from anisweep.live.take import live_ident
from anisweep.tables import with_identity
from anisweep.tangent.checkpoint import analyse_model
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


def analyse_live(
    model: nn.Module,
    batch: dict,
    tokenizer,
    out_dir: str | Path,
    ident: dict,
    settings: ExtractSettings | None = None,
    gradients: GradientSettings | None = None,
) -> Path:
    """Write extract's tables, extract.json and (when `gradients.enabled`) gradients.parquet of the model as it
    is now into `out_dir`. `batch` is the evaluation batch (`input_ids`, `attention_mask`: e.g.
    anisweep.corpus.make_batch, as extract builds it); `ident` the identity columns (family, model, seed,
    step, tokens_seen)."""
    from anisweep.adapters import adapter_for

    settings = settings or ExtractSettings(device="cpu")
    gradients = gradients if gradients is not None else GradientSettings(enabled=True)
    out_dir = Path(out_dir)
    adapter = adapter_for(model.config)
    register_attention()
    with _training_state_kept(model):
        model.eval()
        model.set_attn_implementation(ATTENTION_NAME)
        loaded = LoadedModel(model, adapter.base_model(model), adapter, adapter.geometry(model.config))
        recorder, seconds = timed_run(loaded, batch, settings, progress=False)
        written = tables(recorder, loaded, ident)
        model.set_attn_implementation("sdpa")
        if gradients.enabled:
            table = analyse_model(model, adapter, batch, tokenizer, gradients, settings.batch_size, progress=False)
            written["gradients"] = with_identity(table, ident)
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
    """At the chosen global steps (after the optimizer step), `analyse_live` into
    `{results}/local/{run_name}/step{N}/`. The evaluation batch is built once from `texts` with the tokenizer."""

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
    ):
        from anisweep.corpus import make_batch

        self.steps = set(steps)
        self.tokenizer, self.run_name, self.results = tokenizer, run_name, Path(results)
        self.settings = settings or ExtractSettings(device="cpu")
        self.gradients = gradients
        self.tokens_per_step = tokens_per_step
        s = self.settings
        self.batch = make_batch(tokenizer, list(texts), s.n_sequences, s.seq_len, s.seed)
        self.written: list[Path] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step in self.steps and model is not None:
            ident = live_ident(self.run_name, state.global_step, self.tokens_per_step, getattr(args, "seed", None))
            out = self.results / "local" / self.run_name / f"step{state.global_step}"
            self.written.append(
                analyse_live(model, self.batch, self.tokenizer, out, ident, self.settings, self.gradients)
            )
        return control
