"""The Multi-Bootstrap's intervals drawn as bands (anisweep.plots.intervals): around the curves of the sweep figures,
the family comparison and the spectral phases, each band from the table's low to its high at the drawn steps, a
group of seeds' mean with its interval on the family figure, nothing where the tables hold no interval for what a
figure draws (the figure as without them)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from test_sweep_plots import drawn_figures, fake_checkpoint

from anisweep.measures.sample_bootstrap import SCHEMA
from anisweep.measures.sweep import aggregate
from anisweep.plots.intervals import BAND_GID, attach, read_intervals
from anisweep.plots.kit import pyplot
from anisweep.plots.sweep import plot_family, plot_model

STEPS = (0, 10, 100)


def interval_rows(family, model, metric, site, layers, steps=STEPS, group=None, seeds=1, level=0.95) -> list[dict]:
    """Interval rows as sample_bootstrap writes them, low and high made up and distinct for each row; a paired
    test row (against 'previous') beside each, which is no interval."""
    rows = []
    for layer in layers:
        for step in steps:
            centre = 0.3 + 0.1 * layer + step / 1000 + (0.05 if group else 0.0)
            row = {
                "group": group,
                "models": [f"{family}/{model}"] if model else [f"{family}/s{i}" for i in range(seeds)],
                "family": family,
                "model": model,
                "seed": 0 if model else None,
                "step": step,
                "tokens_seen": step * 100,
                "layer": layer,
                "site": site,
                "metric": metric,
                "estimate": centre,
                "low": centre - 0.01 * (layer + 1),
                "high": centre + 0.02 * (layer + 1) + step / 10_000,
                "level": level,
                "n_seeds": seeds,
                "n_units": 8,
                "samples": 50,
                "undefined": 0,
                "design": "seeds and units" if group else "units",
            }
            rows.append(row)
            rows.append(row | {"against": "previous", "ref_step": 0, "low": -9.0, "high": 9.0, "p": 0.5})
    return rows


def write_table(path, rows) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows, schema=SCHEMA).write_parquet(path)
    return str(path)


def bands_of(ax) -> list:
    return [c for c in ax.collections if c.get_gid() == BAND_GID]


def band_extent(collection) -> dict[float, tuple[float, float]]:
    """{x: (lowest, highest y)} of a fill_between band's outline."""
    extent = {}
    for path in collection.get_paths():
        for x, y in path.vertices:
            low, high = extent.get(float(x), (np.inf, -np.inf))
            extent[float(x)] = (min(low, float(y)), max(high, float(y)))
    return extent


def expected_extent(rows: list[dict], layer: int, x: str = "step") -> dict[float, tuple[float, float]]:
    return {
        float(r["step"] if x == "step" else r["tokens_seen"]): pytest.approx((r["low"], r["high"]))
        for r in rows
        if r["layer"] == layer and "against" not in r
    }


@pytest.fixture
def sweep(tmp_path):
    return aggregate([fake_checkpoint(tmp_path, step, str(step)) for step in STEPS])


def test_only_interval_rows_with_a_finite_low_and_high_are_read(tmp_path):
    rows = interval_rows("fam", "m", "isoscore", "resid", [0, 1])
    rows[0] |= {"low": float("nan"), "high": float("nan"), "undefined": 3}
    intervals = read_intervals([write_table(tmp_path / "b.parquet", rows)])
    assert intervals.height == len(rows) // 2 - 1
    assert intervals["low"].is_finite().all() and set(intervals["high"]) != {9.0}
    assert read_intervals([]) is None


def test_attach_gives_each_per_layer_row_its_own_interval_and_no_other_row_one(tmp_path, sweep):
    rows = interval_rows("fam", "m", "isoscore", "resid", [0, 1, 2]) + interval_rows(
        "fam", "other", "rankme", "resid", [0]
    )
    intervals = read_intervals([write_table(tmp_path / "b.parquet", rows)])
    with_bands = attach(sweep, intervals)
    assert with_bands.height == sweep.height
    banded = with_bands.filter(pl.col("low").is_not_null())
    assert set(banded["metric"]) == {"isoscore"} and set(banded["site"]) == {"resid"}
    assert banded["head"].null_count() == banded.height
    want = {(r["layer"], r["step"]): (r["low"], r["high"]) for r in rows if r["model"] == "m" and "against" not in r}
    got = {(r["layer"], r["step"]): (r["low"], r["high"]) for r in banded.iter_rows(named=True)}
    assert got == want
    assert set(banded["band"]) == {"95% interval, Multi-Bootstrap over sequences"}


def test_the_isotropy_figure_bands_the_curves_the_table_has_intervals_for(tmp_path, monkeypatch, sweep):
    rows = interval_rows("fam", "m", "isoscore", "resid", [0, 1, 2]) + interval_rows(
        "fam", "m", "top_eig_share", "final_ln_out", [2]
    )
    intervals = read_intervals([write_table(tmp_path / "b.parquet", rows)])
    figures = drawn_figures(monkeypatch)
    plot_model(sweep, tmp_path / "figures", intervals)
    panels = {ax.get_ylabel(): ax for ax in figures["isotropy.png"].axes if ax.get_ylabel()}
    iso = panels["IsoScore (1 = isotropic)"]
    assert len(bands_of(iso)) == 3
    for collection, layer in zip(bands_of(iso), range(3)):
        assert band_extent(collection) == expected_extent(rows, layer)
        line = next(line for line in iso.get_lines() if line.get_label() == f"layer {layer}")
        assert np.allclose(collection.get_facecolor()[0][:3], pyplot().matplotlib.colors.to_rgb(line.get_color()))
    assert all(not bands_of(ax) for label, ax in panels.items() if label != "IsoScore (1 = isotropic)")
    legend = next(ax.get_legend() for ax in figures["isotropy.png"].axes if ax.get_legend())
    assert "95% interval, Multi-Bootstrap over sequences" in [t.get_text() for t in legend.get_texts()]
    # the final LayerNorm figure: its after-LN top eigenvalue share alone (the fake sweep has a final_ln_out row
    # at each of three layers; the table's layer 2 alone is banded)
    final = {ax.get_ylabel(): ax for ax in figures["final_layernorm.png"].axes if ax.get_ylabel()}
    (band,) = [c for ax in final.values() for c in bands_of(ax)]
    assert band in bands_of(final["top eigenvalue's share of variance"])
    assert band_extent(band) == expected_extent(rows, 2)
    for name, fig in figures.items():
        if name not in ("isotropy.png", "final_layernorm.png"):
            assert not any(bands_of(ax) for ax in fig.axes), name


@pytest.mark.slow  # every model figure, twice
def test_a_figure_without_intervals_for_what_it_draws_is_drawn_as_without_any(tmp_path, sweep):
    """Intervals of another model and of a metric no figure draws change no pixel of any figure."""
    rows = interval_rows("fam", "other", "isoscore", "resid", [0, 1]) + interval_rows("fam", "m", "xyz", "resid", [0])
    intervals = read_intervals([write_table(tmp_path / "b.parquet", rows)])
    plain = plot_model(sweep, tmp_path / "plain")
    banded = plot_model(sweep, tmp_path / "banded", intervals)
    for a, b in zip(plain, banded):
        assert a.read_bytes() == b.read_bytes(), a.name


def test_the_family_figure_bands_each_model_and_draws_each_groups_mean_with_its_interval(tmp_path, monkeypatch):
    import anisweep.plots.sweep as plots

    sweeps = pl.concat(
        [aggregate([fake_checkpoint(tmp_path, s, f"{m}{s}", model=m) for s in STEPS]) for m in ("s0", "s1")]
    )
    sweeps = sweeps.filter((pl.col("layer") == 2) | ~pl.col("site").str.starts_with("final_ln"))  # one final layer
    model_rows = interval_rows("fam", "s0", "isoscore", "final_ln_in", [2])
    group_rows = interval_rows("fam", None, "isoscore", "final_ln_out", [2], group="both", seeds=2)
    other_family = interval_rows("other", None, "isoscore", "final_ln_out", [2], group="theirs", seeds=2)
    intervals = read_intervals(
        [write_table(tmp_path / f"{n}.parquet", r) for n, r in enumerate((model_rows, group_rows, other_family))]
    )
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig))
    plot_family(sweeps, tmp_path / "compare.png", intervals)
    panels = {ax.get_ylabel().split("\n")[0]: ax for ax in figures[0].axes if ax.get_visible() and ax.get_ylabel()}
    (band,) = bands_of(panels["IsoScore at final_ln_in"])
    assert band_extent(band) == expected_extent(model_rows, 2, x="tokens_seen")
    after = panels["IsoScore at final_ln_out"]
    (band,) = bands_of(after)
    assert band_extent(band) == expected_extent(group_rows, 2, x="tokens_seen")
    (mean,) = [line for line in after.get_lines() if line.get_linestyle() == ":"]
    estimates = [r["estimate"] for r in group_rows if "against" not in r]
    assert list(mean.get_xdata()) == [s * 100 for s in STEPS] and list(mean.get_ydata()) == pytest.approx(estimates)
    assert sum(len(bands_of(ax)) for ax in panels.values()) == 2
    texts = [t.get_text() for ax in figures[0].axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    texts += [t.get_text() for legend in figures[0].legends for t in legend.get_texts()]
    assert {"group both: mean of its 2 seeds", "95% interval, Multi-Bootstrap over seeds and sequences"} <= set(texts)
    assert "95% interval, Multi-Bootstrap over sequences" in texts


def test_the_phases_figure_bands_rankme_per_layer_and_the_models_own_curve(tmp_path, monkeypatch):
    from test_phase_figures import GRID
    from test_phase_figures import sweep as phase_sweep

    import anisweep.plots.phases as phases_module
    from anisweep.measures.phases import model_phases

    sweep = phase_sweep()
    layer_rows = interval_rows("toy", "toy-neox", "rankme", "resid", [0], steps=GRID)
    model_rows = interval_rows("toy", "toy-neox", "rankme", "final_ln_out", [2], steps=GRID)
    intervals = read_intervals([write_table(tmp_path / "b.parquet", layer_rows + model_rows)])
    figures = []
    monkeypatch.setattr(phases_module, "save_figure", lambda fig, path: figures.append(fig))
    phases_module.spectral_phases(sweep, model_phases(sweep), tmp_path / "p.png", intervals)
    banded = [(ax.get_ylabel(), c) for ax in figures[0].axes for c in bands_of(ax)]
    assert [label for label, _ in banded] == [phases_module.PANELS["rankme"]] * 2
    assert band_extent(banded[0][1]) == expected_extent(layer_rows, 0)
    assert band_extent(banded[1][1]) == expected_extent(model_rows, 2)


def test_intervals_with_a_head_column_go_to_their_own_head_and_the_per_layer_ones_to_the_layer(tmp_path, sweep):
    """A sum-built measure's per-head intervals (a `head` column, null for the per-layer ones): each per-head row
    gets its head's, each per-layer row the layer's; rows without a head column (the explorer's) the layer's."""
    layer_rows = interval_rows("fam", "m", "qk_cos", "qk_pre", [1])
    head_rows = [r | {"head": 1, "low": r["low"] - 5, "high": r["high"] + 5} for r in layer_rows]
    table = pl.DataFrame(layer_rows + head_rows, schema=SCHEMA | {"head": pl.Int64})
    table.write_parquet(tmp_path / "b.parquet")
    intervals = read_intervals([tmp_path / "b.parquet"])
    with_bands = attach(sweep, intervals).filter(pl.col("low").is_not_null())
    got = {(r["head"], r["step"]): (r["low"], r["high"]) for r in with_bands.iter_rows(named=True)}
    want = {(r.get("head"), r["step"]): (r["low"], r["high"]) for r in layer_rows + head_rows if "against" not in r}
    assert got == {key: want[key] for key in got} and set(got) == {(1, s) for s in STEPS}  # the sweep's per-head rows
    per_layer = sweep.filter(pl.col("head") == 1, pl.col("metric") == "qk_cos", pl.col("site") == "qk_pre")
    per_layer = per_layer.with_columns(head=pl.lit(None, pl.Int64), metric=pl.lit("qk_cos"))
    assert attach(per_layer, intervals).filter(pl.col("layer") == 1)["low"].to_list() == [
        want[(None, s)][0] for s in sorted(per_layer.filter(pl.col("layer") == 1)["step"])
    ]
    headless = attach(per_layer.drop("head"), intervals).filter(pl.col("layer") == 1)
    assert headless["low"].to_list() == [want[(None, s)][0] for s in sorted(headless["step"])]
