"""A figure whose measure could not run on a model's checkpoints says why, from the rows that say so (metric = the
measure's name, with a `reason`: anisweep.tables.unmeasured_row), never that weights.enabled is false."""

from __future__ import annotations

import polars as pl

import anisweep.plots.circuits as circuit_plots
import anisweep.plots.measures as measure_plots
from anisweep.measures.registry import Measure
from anisweep.measures.sweep import SWEEP_SCHEMA
from anisweep.tables import unmeasured_row

HEADLESS = "bert: the checkpoint was saved without its MLM head (no cls.predictions.* among its tensors: ...)"


def said_rows(measure: str, site: str, reason: str, steps=(0, 64, 1000)) -> pl.DataFrame:
    rows = [
        {"family": "local", "model": "run", "seed": 0, "step": step, "measure": measure, "status": "nan"}
        | unmeasured_row(measure, site, reason)
        for step in steps
    ]
    return pl.DataFrame(rows, schema=SWEEP_SCHEMA)


def capture(monkeypatch, module) -> dict:
    said = {}
    monkeypatch.setattr(module, "not_measured", lambda sweep, path, what, why: said.update({what: why}))
    return said


def test_the_logit_lens_figure_of_a_model_without_its_head_says_why(tmp_path, monkeypatch):
    said = capture(monkeypatch, circuit_plots)
    circuit_plots.plot_logit_lens(said_rows("logit_lens", "resid", HEADLESS), tmp_path / "logit_lens.png")
    assert said == {"logit lens": f"steps 0, 64, 1000: {HEADLESS}"}


def test_the_circuit_figures_of_an_architecture_without_a_layout_say_why(tmp_path, monkeypatch):
    said = capture(monkeypatch, circuit_plots)
    why = "weight measures read the tensors of [...]; this checkpoint's model_type is 't5'"
    circuit_plots.plot_circuits(said_rows("circuits", "weights", why, (5,)), [], *(tmp_path / n for n in "abc"))
    assert set(said.values()) == {f"step 5: {why}"} and len(said) == 3


def test_a_user_weight_measure_that_could_not_run_says_why_in_its_figure(tmp_path, monkeypatch):
    said = capture(monkeypatch, measure_plots)
    measure = Measure("qk_norm", "weight", lambda w: None, tensors=("attention",), entry="x:qk_norm")
    sweep = pl.concat([said_rows("qk_norm", "weights", HEADLESS, (0,)), said_rows("qk_norm", "weights", "other", (8,))])
    measure_plots.plot_measure(measure, sweep, tmp_path / "measure_qk_norm.png")
    assert said == {"measure qk_norm": f"step 0: {HEADLESS}\nstep 8: other"}
