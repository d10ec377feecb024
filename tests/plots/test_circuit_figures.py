"""The figures of the built-in weight measure `circuits` over training (anisweep.plots.circuits), from a made-up
sweep."""

from __future__ import annotations

import polars as pl
import pytest

import anisweep.plots.circuits as circuits
from anisweep.plots.kit import pyplot


def circuit_sweep(steps=(0, 10, 100), layers=2, heads=2, probe=50) -> pl.DataFrame:
    ident = {"family": "fam", "model": "m", "seed": 0, "tokens_seen": None, "status": "ok", "measure": "circuits"}
    rows = []
    for step in steps:
        rows.append(ident | {"step": step, "layer": None, "head": None, "metric": "probe_tokens", "value": probe})
        for layer in range(layers):
            for head in range(heads):
                for metric in (*circuits.QK_PANELS, *circuits.OV_PANELS):
                    value = 0.1 * head + step / 1000
                    rows.append(ident | {"step": step, "layer": layer, "head": head, "metric": metric, "value": value})
    return pl.DataFrame(rows, infer_schema_length=None)


@pytest.fixture
def drawn(monkeypatch) -> dict:
    figures = {}
    monkeypatch.setattr(circuits, "save_figure", lambda fig, path: figures.update({path.name: fig}))
    yield figures
    pyplot().close("all")


def test_every_reference_line_of_the_qk_figure_is_in_its_legend(drawn, tmp_path):
    """Issue 43: the dotted line at 0.5 in the rank row of qk_circuits.png had no label (the legend was the first
    row's only). The legend now holds every row's reference line, each once, with the heads."""
    circuits.heads_over_training(circuit_sweep(), tmp_path / "qk_circuits.png", circuits.QK_PANELS, "QK")
    fig = drawn["qk_circuits.png"]
    legends = fig.legends or [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    (legend,) = legends
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == ["head 0", "head 1", "chance (1 / probe tokens)", "chance rank (0.5: keys in random order)"]
    ranks = [ax for ax in fig.axes if ax.get_ylabel() == circuits.QK_PANELS["qk_self_rank"]]
    (line,) = [line for line in ranks[0].get_lines() if line.get_label().startswith("chance rank")]
    assert list(line.get_ydata()) == [0.5, 0.5]
