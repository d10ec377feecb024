"""The scalar summaries of a step the callback analysed, sent through the Trainer's own logging: the Trainer's
callback handler gets them as `Trainer.log` gives it the loss (its `on_log`, and the state's log_history), so every
`report_to` integration (TensorBoard, Weights & Biases, MLflow, ...) records them on the loss's step axis.

The summaries are computed from the tables the step's analysis wrote (no second forward pass), by the built-in
measures that compute them for metrics.parquet; their names: anisweep.measures.logged.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import polars as pl

from anisweep.measures.logged import LOGGED_MEASURES, logged_scalars


def checkpoint_scalars(folder: str | Path) -> dict[str, float]:
    """{`geometry/<metric>/<site>/layer_<n>`: value} of the checkpoint whose extract tables are in `folder`."""
    from anisweep.measures.metrics import builtin_measures
    from anisweep.measures.registry import CheckpointTables, measure_frame

    tables = CheckpointTables(folder)
    ident = tables.identity
    frames = [measure_frame(m, ident, m.target(tables)) for m in builtin_measures() if m.name in LOGGED_MEASURES]
    return logged_scalars(pl.concat(frames))


def calling_handler(depth: int = 6):
    """The transformers CallbackHandler whose event is running (a callback is given no handle on the Trainer), or
    None when none is among the `depth` callers."""
    from transformers.trainer_callback import CallbackHandler

    frame = inspect.currentframe()
    try:
        for _ in range(depth):
            frame = frame.f_back if frame is not None else None
            if frame is None:
                return None
            caller = frame.f_locals.get("self")
            if isinstance(caller, CallbackHandler):
                return caller
        return None
    finally:
        del frame


def log_through(handler, args, state, control, scalars: dict[str, float]):
    """What Trainer.log does with a dict of values: into the state's log_history, then every callback's on_log.

    The handler's on_log clears `control.should_log`, the flag by which the Trainer, after on_step_end, logs its
    loss, grad_norm and learning_rate; it is given back as it was, so that the Trainer logs (or not) at this step
    what it would have without these values, and its loss stays the mean of the steps since its last log."""
    logs = dict(scalars)
    state.log_history.append({**logs, "step": state.global_step})
    should_log = control.should_log
    control = handler.on_log(args, state, control, logs)
    control.should_log = should_log
    return control
