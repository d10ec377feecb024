"""A measure's figure: the default one draws what the sweep holds (per layer, heads averaged, ok rows only); a
measure's own figure function gets exactly its rows."""

from __future__ import annotations

import polars as pl
import pytest

import anisweep.plots.measures as plots
from anisweep.measures.registry import Measure, MeasureError
from anisweep.measures.sweep import SWEEP_SCHEMA
from anisweep.plots.kit import pyplot


def sweep() -> pl.DataFrame:
    """Per-head rows of `mine` (head h, layer l, step s: value l + h + s / 100), a NaN row, and a built-in row."""
    rows = []
    for step in (0, 10, 100):
        base = {"family": "fam", "model": "m", "seed": 0, "step": step, "tokens_seen": step * 10}
        for layer in (0, 1):
            for head in (0, 1, 2):
                value = layer + head + step / 100
                rows.append({**base, "layer": layer, "head": head, "site": "attention_output", "metric": "norm"})
                rows[-1] |= {"value": value, "measure": "mine", "status": "ok"}
        rows.append({**base, "layer": 0, "site": "resid", "metric": "bad", "value": float("nan")})
        rows[-1] |= {"measure": "mine", "status": "nan"}
        rows.append(
            {**base, "layer": 0, "site": "resid", "metric": "avg_cos", "value": 0.5, "measure": "stream_geometry"}
        )
        rows[-1] |= {"status": "ok"}
    return pl.DataFrame(rows, schema=SWEEP_SCHEMA)


def test_default_figure_draws_the_mean_over_heads_per_layer(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig))
    measure = Measure("mine", "stream", lambda: None, sites=("attention_output",), entry="x:Mine")
    plots.plot_measure(measure, sweep(), tmp_path / "measure_mine.png")
    panels = [ax for ax in figures[0].axes if ax.get_visible() and ax.get_lines()]
    assert len(panels) == 1  # `bad` is NaN, status nan: not drawn; avg_cos is another measure's
    assert panels[0].get_ylabel() == "norm\n(mean over heads)" and panels[0].get_title() == "attention_output"
    lines = {line.get_label(): list(line.get_ydata()) for line in panels[0].get_lines()}
    assert lines == {"layer 0": pytest.approx([1.0, 1.1, 2.0]), "layer 1": pytest.approx([2.0, 2.1, 3.0])}
    pyplot().close(figures[0])


def test_a_measures_own_figure_gets_its_ok_rows(tmp_path):
    seen = {}

    def draw(rows, path):
        seen["rows"] = rows
        path.write_bytes(b"png")

    measure = Measure("mine", "table", lambda t: [], tables=("hidden",), figure=draw, entry="x:mine")
    plots.plot_measure(measure, sweep(), tmp_path / "own.png")
    assert set(seen["rows"]["measure"]) == {"mine"} and set(seen["rows"]["status"]) == {"ok"}
    assert seen["rows"].height == 3 * 2 * 3
    lazy = Measure("lazy", "table", lambda t: [], tables=("hidden",), figure=lambda rows, path: None, entry="x:lazy")
    with pytest.raises(MeasureError, match="'lazy' \\(x:lazy\\): its figure function wrote no"):
        plots.plot_measure(lazy, sweep(), tmp_path / "lazy.png")
