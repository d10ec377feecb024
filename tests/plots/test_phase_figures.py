"""spectral_phases.png: RankMe and alpha-ReQ per layer, the model's phases shaded over the steps phases.parquet names,
each layer's turns circled, and a curve without phases saying why."""

from __future__ import annotations

import numpy as np
import polars as pl

from anisweep.measures.phases import model_phases
from anisweep.plots import phases as figure
from anisweep.plots.kit import pyplot

GRID = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000]
RANKME = np.array([40.0, 33, 26, 20, 14, 22, 31, 40, 46, 41, 37, 35])


def sweep(n_steps: int = len(GRID)) -> pl.DataFrame:
    rows = []
    curves = {
        ("rankme", "resid"): lambda layer: RANKME + 3 * layer,
        ("rankme_cov", "resid"): lambda layer: RANKME * 0.8 + layer,
        ("alpha_req", "resid"): lambda layer: 3.0 - RANKME / 40 + 0.1 * layer,
        ("rankme", "final_ln_out"): lambda layer: RANKME * 1.1,
        ("rankme_cov", "final_ln_out"): lambda layer: RANKME,
        ("alpha_req", "final_ln_out"): lambda layer: 3.0 - RANKME / 40,
    }
    for (metric, site), curve in curves.items():
        for layer in range(3) if site == "resid" else [2]:
            for step, value in list(zip(GRID, curve(layer)))[:n_steps]:
                rows.append(
                    {
                        "family": "toy",
                        "model": "toy-neox",
                        "seed": 0,
                        "step": step,
                        "tokens_seen": step * 4096,
                        "layer": layer,
                        "head": None,
                        "site": site,
                        "metric": metric,
                        "value": float(value),
                        "status": "ok",
                    }
                )
    return pl.DataFrame(rows)


def test_the_models_phases_are_shaded_over_their_steps():
    table = model_phases(sweep()).filter((pl.col("metric") == "rankme") & (pl.col("scope") == "model"))
    fig, ax = pyplot().subplots()
    figure.shade_phases(ax, table)
    spans = [(patch.get_x(), patch.get_x() + patch.get_width(), patch.get_label()) for patch in ax.patches]
    pyplot().close(fig)
    assert spans == [(0, 8, "warm-up collapse"), (8, 128, "entropy-seeking"), (128, 1000, "compression-seeking")]


def test_each_layers_turns_are_circled():
    data = sweep()
    table = model_phases(data).filter((pl.col("metric") == "rankme") & (pl.col("scope") == "layer"))
    rows = data.filter((pl.col("metric") == "rankme") & (pl.col("site") == "resid"))
    fig, ax = pyplot().subplots()
    figure.mark_turns(ax, rows, table.filter(pl.col("site") == "resid"))
    (points,) = ax.collections
    pyplot().close(fig)
    assert sorted(map(tuple, points.get_offsets().tolist())) == sorted(
        (step, RANKME[GRID.index(step)] + 3 * layer) for layer in range(3) for step in (8, 128)
    )


def test_the_figure_is_drawn_and_says_why_a_curve_has_no_phase(tmp_path):
    data = sweep()
    path = tmp_path / "spectral_phases.png"
    figure.spectral_phases(data, model_phases(data), path)
    assert path.stat().st_size > 0
    short = sweep(n_steps=3)
    table = model_phases(short)
    assert table.filter(pl.col("scope") == "model")["reason"].str.starts_with("not enough steps").all()
    figure.spectral_phases(short, table, tmp_path / "short.png")
    assert (tmp_path / "short.png").stat().st_size > 0
    assert figure.phases_note(table.filter(pl.col("metric") == "rankme")).startswith("not enough steps: 3 ")


def test_the_figure_says_the_phases_are_descriptive(tmp_path, monkeypatch):
    """The rule tests no turn against noise (a curve of pure noise gets phases too): the figure says so."""
    drawn = {}
    monkeypatch.setattr(figure, "save_figure", lambda fig, path: drawn.setdefault(path.name, fig))
    data = sweep()
    figure.spectral_phases(data, model_phases(data), tmp_path / "spectral_phases.png")
    title = drawn["spectral_phases.png"].get_suptitle()
    pyplot().close(drawn["spectral_phases.png"])
    assert "the phases are descriptive" in title and "no turn tested against noise" in title
