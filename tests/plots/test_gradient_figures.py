"""The gradient figures (anisweep.plots.gradients) from a synthetic gradients_sweep table: what each draws and says.

Issue 28: the per-stratum figure read enrichment from z (which also scales with each stratum's control spread);
it now draws the share against chance k / d, z only as each point's significance. The fixed-subspace figures
name the window the subspaces were fitted on.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from anisweep.plots import gradients as gp

STEPS = (0, 16, 64, 1000)
SITES = ((0, "resid"), (2, "final_ln_out"))
RANK, D = 4, 16


def sweep_table(window: str | None = "steps 16, 32, 64", fits=("checkpoint", "fixed")) -> pl.DataFrame:
    """A gradients_sweep table: shares per fit, subspace, stratum (the frequent stratum's share the highest, its
    z the lowest: a large control spread), isotropy rows, and embedding-change rows."""
    rows = []
    shares = {"frequent": 0.70, "middle": 0.60, "rare": 0.50, "all": 0.62}
    zs = {"frequent": 3.0, "middle": 12.0, "rare": 20.0, "all": 15.0}
    ident = {"family": "toy", "model": "m", "seed": 0}
    for step in STEPS:
        base = {**ident, "step": step, "tokens_seen": step * 128}
        for layer, site in SITES:
            for fit in fits:
                for subspace in ("seminmf", "pca", "random"):
                    for stratum in shares:
                        for measure in ("energy_share", "anisotropy_share"):
                            value = shares[stratum] * (1 if fit == "checkpoint" else 0.8) if step else 0.26
                            z = zs[stratum] if step else 1.0
                            if subspace == "random":
                                value, z = 0.25, 0.0
                            rows.append(
                                {
                                    **base,
                                    "layer": layer,
                                    "site": site,
                                    "stratum": stratum,
                                    "subspace": subspace,
                                    "fit": fit,
                                    "rank": RANK,
                                    "measure": measure,
                                    "value": value,
                                    "control_mean": 0.25,
                                    "control_sd": 0.02,
                                    "z": z,
                                    "chance": RANK / D,
                                    "n_tokens": 100,
                                    "window": window if fit == "fixed" else None,
                                }
                            )
            for stratum in shares:
                for measure in ("act_avg_cos", "act_isoscore", "grad_avg_cos"):
                    rows.append(
                        {**base, "layer": layer, "site": site, "stratum": stratum, "measure": measure, "value": 0.3}
                    )
        if step:
            for fit in fits:
                for subspace in ("seminmf", "pca"):
                    for stratum in shares:
                        rows.append(
                            {
                                **base,
                                "layer": 0,
                                "site": "resid",
                                "stratum": stratum,
                                "subspace": subspace,
                                "fit": fit,
                                "rank": RANK,
                                "measure": "embedding_change_share",
                                "value": 0.4,
                                "control_mean": 0.25,
                                "control_sd": 0.03,
                                "z": 5.0,
                                "chance": RANK / D,
                                "step_from": STEPS[STEPS.index(step) - 1],
                                "window": window if fit == "fixed" else None,
                            }
                        )
            for stratum in shares:
                rows.append(
                    {
                        **base,
                        "layer": 0,
                        "site": "resid",
                        "stratum": stratum,
                        "subspace": "random",
                        "rank": RANK,
                        "measure": "embedding_change_share",
                        "value": 0.25,
                        "control_mean": 0.25,
                        "control_sd": 0.03,
                        "z": 0.0,
                        "chance": RANK / D,
                        "step_from": STEPS[STEPS.index(step) - 1],
                    }
                )
    table = pl.DataFrame(rows, infer_schema_length=None)
    return table if window is not None else table.drop("window")


@pytest.fixture
def drawn(monkeypatch):
    """The figures drawn, by file name, instead of saved."""
    figures = {}

    def keep(fig, path):
        figures[path.name] = fig

    monkeypatch.setattr(gp, "save_figure", keep)
    yield figures
    plt = gp.pyplot()
    for fig in figures.values():
        plt.close(fig)


def test_the_strata_figure_reads_enrichment_from_the_share_against_chance(drawn, tmp_path):
    sweep = sweep_table()
    gp.strata_figure(sweep, tmp_path / "gradients_strata.png")
    fig = drawn["gradients_strata.png"]
    axes = [ax for ax in fig.axes if ax.get_ylabel() or ax.get_title()]  # not the tokens-seen twins
    energy = next(ax for ax in axes if ax.get_ylabel() == "gradient energy share")
    lines = {line.get_label(): line for line in energy.get_lines()}
    # the lines are the per-checkpoint semi-NMF shares, not z: the frequent stratum on top
    for stratum, share in (("frequent", 0.70), ("middle", 0.60), ("rare", 0.50)):
        np.testing.assert_allclose(lines[stratum].get_ydata(), [0.26, share, share, share])
        assert max(lines[stratum].get_ydata()) < 1
    chance = [line for line in energy.get_lines() if line.get_linestyle() == ":"]
    assert chance and chance[0].get_ydata()[0] == pytest.approx(RANK / D)
    # z only as significance: step 0 (z = 1) open, the others filled
    open_, filled = 0, 0
    for collection in energy.collections:
        points, face = len(collection.get_offsets()), collection.get_facecolors()[0]
        if np.allclose(face[:3], 1):
            open_ += points
        else:
            filled += points
    assert open_ == 3 and filled == 9  # 3 strata x (1 open step + 3 filled steps)
    title = fig.get_suptitle()
    assert "chance k / d" in title and "fitted per checkpoint" in title and "z >= 2" in title
    assert not any("z vs random" in ax.get_ylabel() for ax in axes)


def test_the_fixed_figures_name_their_fit_window(drawn, tmp_path):
    sweep = sweep_table()
    gp.fixed_figure(sweep, tmp_path / "gradients_fixed.png")
    gp.embedding_figure(sweep, tmp_path / "embedding_change.png")
    assert "fitted once on the pooled activations of steps 16, 32, 64" in drawn["gradients_fixed.png"].get_suptitle()
    assert "steps 16, 32, 64" in drawn["embedding_change.png"].get_suptitle()
    assert gp.fit_window(sweep) == "steps 16, 32, 64"
    older = sweep_table(window=None)  # a table from before the bases named their window
    assert gp.fit_window(older) is None
    gp.fixed_figure(older, tmp_path / "older.png")
    assert "gradients.fit_window" in drawn["older.png"].get_suptitle()


def test_with_fixed_subspaces_only_the_figures_draw_the_fixed_fit(drawn, tmp_path):
    sweep = sweep_table(fits=("fixed",))
    gp.shares_figure(sweep, tmp_path / "gradients.png")
    gp.strata_figure(sweep, tmp_path / "gradients_strata.png")
    assert "held fixed, fitted once on the pooled activations of steps 16" in drawn["gradients.png"].get_suptitle()
    labels = {line.get_label() for ax in drawn["gradients.png"].axes for line in ax.get_lines()}
    assert {"seminmf", "pca"} <= labels
    energy = next(ax for ax in drawn["gradients_strata.png"].axes if ax.get_ylabel() == "gradient energy share")
    frequent = next(line for line in energy.get_lines() if line.get_label() == "frequent")
    np.testing.assert_allclose(frequent.get_ydata(), [0.26, 0.56, 0.56, 0.56])


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_every_gradient_figure_is_written(tmp_path):
    names = gp.gradient_figures({"subspaces": "both", "embedding_change": True})
    written = gp.plot_gradients(sweep_table(), tmp_path, names)
    assert [p.name for p in written] == names and all(p.stat().st_size > 0 for p in written)


def test_the_gradient_figures_use_the_log_step_axis_of_every_other_figure(drawn, tmp_path):
    """Issue 25 item 11: steps 0, 16, 64, 1000 on a linear axis squeezed three of four points left."""
    sweep = sweep_table()
    gp.shares_figure(sweep, tmp_path / "gradients.png")
    gp.strata_figure(sweep, tmp_path / "gradients_strata.png")
    for name in ("gradients.png", "gradients_strata.png"):
        panels = [ax for ax in drawn[name].axes if ax.get_xlabel() == "optimizer step"]
        assert panels and all(ax.get_xscale() == "symlog" for ax in panels), name
    labels = {ax.get_ylabel() for ax in drawn["gradients_strata.png"].axes}
    assert "activations: mean pairwise cosine" in labels and not any("avg_cos" in label for label in labels)
