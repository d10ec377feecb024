"""Godey et al. 2024 Section 3's figures across models: each model at its last analysed step, a decoder's layers
after its encoder's, every figure written from synthetic sweeps."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from anisweep.measures import geometry
from anisweep.plots import survey


def model_rows(family, model, steps, n_layers, d, bad_step=None) -> list[dict]:
    rng = np.random.default_rng(len(model))
    rows = []
    for step in steps:
        status = "nonfinite" if step == bad_step else "ok"
        base = {"family": family, "model": model, "seed": 0, "step": step, "tokens_seen": None, "status": status}
        for layer in range(n_layers + 1):
            cos = float(rng.uniform(0.1, 0.9))
            values = {"avg_cos": cos, "avg_cos_pairs": cos + 0.01, "avg_cos_pairs_se": 0.02, "dim": d}
            for metric, value in values.items():
                rows.append(base | {"layer": layer, "head": None, "site": "resid", "metric": metric, "value": value})
        for test in ("spearman", "pearson"):
            for suffix, p in (("_p", 0.03), ("_p_ttest", 0.2)):
                rows.append(
                    base
                    | {
                        "layer": None,
                        "head": None,
                        "site": "resid",
                        "metric": f"drift_avg_cos_{test}{suffix}",
                        "value": p,
                    }
                )
    return rows


def sweeps() -> pl.DataFrame:
    rows = model_rows("hub", "bert-base-uncased", [0, 100, 200], 4, 32, bad_step=200)
    rows += model_rows("hub", "t5-base", [7], 7, 16)  # encoder and decoder layers numbered straight through
    return pl.DataFrame(rows, infer_schema_length=None)


def test_each_model_at_its_last_analysed_step():
    last = survey.last_steps(sweeps())
    assert dict(last.group_by("model").agg(pl.col("step").unique()).rows()) == {
        "bert-base-uncased": [100],
        "t5-base": [7],
    }


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_every_survey_figure_is_written(tmp_path):
    survey.plot_survey(sweeps(), tmp_path)
    for name in survey.FIGURES:
        assert (tmp_path / name).stat().st_size > 10_000, name


def test_the_isotropic_curve_is_the_exact_quantile():
    assert geometry.isotropic_cos_quantile(768) < geometry.isotropic_cos_quantile(16) < 0.5


@pytest.fixture
def drawn(monkeypatch) -> dict:
    """The survey's figures, by file name, instead of saved."""
    figures = {}
    monkeypatch.setattr(survey, "save_figure", lambda fig, path: figures.update({path.name: fig}))
    yield figures
    for fig in figures.values():
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_each_layer_sits_at_its_own_width(drawn, tmp_path):
    """Issue 43: a CNN's stage of width 8 was drawn at the model's widest width (32), against the isotropic level
    of d = 32, so narrow stages looked anisotropic. Each layer now sits at its own width, and the diamonds are the
    means of the layers of one width."""
    widths, cos = [8, 8, 16, 32], [0.54, 0.5, 0.3, 0.2]
    rows = [
        {"family": "hub", "model": "resnet", "seed": 0, "step": 0, "tokens_seen": None, "status": "ok"}
        | {"layer": layer, "head": None, "site": "resid", "metric": metric, "value": value}
        for layer, (d, c) in enumerate(zip(widths, cos))
        for metric, value in (("dim", float(d)), ("avg_cos", c))
    ]
    survey.plot_isotropic(pl.DataFrame(rows), tmp_path / "survey_isotropic.png")
    ax = drawn["survey_isotropic.png"].axes[0]
    points = next(line for line in ax.get_lines() if line.get_marker() == "o")
    assert sorted(zip(points.get_xdata(), points.get_ydata())) == sorted(zip(widths, cos))
    diamonds = next(line for line in ax.get_lines() if line.get_marker() == "D")
    assert list(diamonds.get_xdata()) == [8, 16, 32]
    assert list(diamonds.get_ydata()) == pytest.approx([0.52, 0.3, 0.2])
    assert geometry.isotropic_cos_quantile(8) > 0.54  # at its own width, the stage is within isotropic reach


def test_the_layer_axis_says_what_layer_0_is_for_every_model_and_marks_a_decoder(drawn, tmp_path):
    """Issue 43: the x label said "0 = embeddings", which CANINE's molecule convolution (or a CNN's stem) is not,
    and T5's line did not show where its decoder starts. Layer 0 is now named by what it is for every model (the
    stream entering the first block), and a dashed line in the model's colour marks its first decoder layer: after
    the encoder's last layer, the layer of its `decoder_embed` site (docs/adapters.md)."""
    rows = model_rows("hub", "canine-s", [0], 4, 32) + model_rows("hub", "t5-base", [7], 7, 16)
    t5 = {"family": "hub", "model": "t5-base", "seed": 0, "step": 7, "tokens_seen": None, "status": "ok"}
    rows.append(t5 | {"layer": 3, "head": None, "site": "decoder_embed", "metric": "avg_cos", "value": 0.4})
    survey.plot_layers(pl.DataFrame(rows, infer_schema_length=None), tmp_path / "survey_layers.png")
    fig = drawn["survey_layers.png"]
    ax = next(a for a in fig.axes if a.get_lines())
    assert "embeddings" not in ax.get_xlabel() and "0: the stream entering the first block" in ax.get_xlabel()
    marks = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [(m.get_label(), list(m.get_xdata())) for m in marks] == [("t5-base: decoder from layer 4", [3.5, 3.5])]
    t5_line = next(line for line in ax.get_lines() if line.get_label() == "t5-base (step 7)")
    assert marks[0].get_color() == t5_line.get_color()
    legend = fig.legends[0] if fig.legends else ax.get_legend()
    assert "t5-base: decoder from layer 4" in [t.get_text() for t in legend.get_texts()]
