"""Sweep aggregation (duplicates and missing checkpoints flagged) and the figures drawn from it."""

from __future__ import annotations

import json

import matplotlib
import numpy as np
import polars as pl
import pytest

from anisweep.measures.sweep import aggregate, analysed
from anisweep.plots.families import PANELS, panel_rows, plot_families
from anisweep.plots.kit import MIN_TICK_LABEL_SIZE, log_spaced, pyplot, save_figure
from anisweep.plots.sweep import MODEL_FIGURES, plot_family, plot_model
from anisweep.tables import ATTENTION_STATISTICS, metric_rows, write_atomic

matplotlib.use("Agg")


def fake_checkpoint(root, step, sha, tokens_per_step=100, model="m", family="fam"):
    """A metrics.parquet and extract.json as extract/metrics write them, with made-up values."""
    ident = {"family": family, "model": model, "seed": 0, "step": step, "tokens_seen": step * tokens_per_step}
    rows = []
    for layer in range(3):
        for metric in (
            "avg_cos",
            "drift_norm",
            "drift_ratio",
            "centred_avg_cos",
            "isoscore",
            "top_eig_share",
            "norm_cv",
        ):
            rows.append({"layer": layer, "site": "resid", "metric": metric, "value": 0.1 * layer + step / 1000})
        for site in ("final_ln_in", "final_ln_out", "ln_attn_in", "ln_attn_out"):
            for metric in ("avg_cos", "drift_ratio", "centred_avg_cos", "isoscore", "top_eig_share", "norm_cv"):
                rows.append({"layer": layer, "site": site, "metric": metric, "value": 0.2 + step / 2000})
        for head in range(2):
            for site in ("qk_pre", "qk_post"):
                for metric in ("qk_cos", "qk_mean_score", "qk_mean_dot"):
                    rows.append({"layer": layer, "head": head, "site": site, "metric": metric, "value": 0.5 - head})
            rows.append({"layer": layer, "head": head, "site": "attention", "metric": "entropy_mean", "value": 1.0})
        for metric in ATTENTION_STATISTICS:
            rows.append({"layer": layer, "site": "attention", "metric": metric, "value": 0.5 + layer / 10})
        for site in ("qk_pre", "qk_post"):
            rows.append({"layer": layer, "site": site, "metric": "qk_cos_abs_mean", "value": 0.3})
            rows.append({"layer": layer, "site": site, "metric": "qk_cos_concat", "value": 0.2 * layer})
    for metric in ("gain_mean", "gain_std", "bias_norm", "bias_drift_share"):
        rows.append({"layer": 2, "site": "final_ln", "metric": metric, "value": 1.0})
    for site in ("embed_in", "embed_out"):
        rows += [
            {"site": site, "metric": "partition_isotropy", "value": 0.5},
            {"site": site, "metric": "partition_isotropy_centred", "value": 0.9},
            {"site": site, "metric": "partition_isotropy_mm", "value": 0.7},
            {"site": site, "metric": "partition_isotropy_mm_centred", "value": 0.95},
        ]
    for name in ("spearman_r", "pearson_r", "spearman_p", "pearson_p"):
        rows.append({"site": "resid", "metric": f"drift_avg_cos_{name}", "value": 0.8})
    rows += outlier_rows(step)
    folder = root / family / model / f"step{step}"
    write_atomic(metric_rows(ident, rows), folder / "metrics.parquet")
    (folder / "extract.json").write_text(json.dumps({"checkpoint": {"step": step, "weights_sha256": sha}}))
    return folder / "metrics.parquet"


def test_duplicate_weights_are_flagged_not_analysed(tmp_path):
    paths = [fake_checkpoint(tmp_path, step, sha) for step, sha in [(0, "a"), (1, "z"), (2, "b"), (512, "z")]]
    with pytest.warns(UserWarning, match="step 1 has byte-identical weights to step 512"):
        sweep = aggregate(paths, final_step=512)
    status = dict(sweep.select("step", "status").unique().iter_rows())
    assert status == {0: "ok", 1: "duplicate", 2: "ok", 512: "ok"}
    assert sweep.filter(pl.col("step") == 1)["duplicate_of_step"].unique().to_list() == [512]
    assert 1 not in analysed(sweep)["step"].to_list()


def test_a_duplicate_group_without_the_final_step_is_flagged_whole(tmp_path):
    paths = [fake_checkpoint(tmp_path, step, sha) for step, sha in [(0, "a"), (100, "z"), (200, "z"), (300, "b")]]
    with pytest.warns(UserWarning, match="byte-identical"):
        sweep = aggregate(paths, final_step=143000)
    status = dict(sweep.select("step", "status").unique().iter_rows())
    assert status == {0: "ok", 100: "duplicate", 200: "duplicate", 300: "ok"}
    assert dict(
        sweep.filter(pl.col("status") == "duplicate").select("step", "duplicate_of_step").unique().iter_rows()
    ) == {100: 200, 200: 100}


def test_checkpoints_without_metrics_are_listed_unfinished(tmp_path):
    paths = [fake_checkpoint(tmp_path, step, str(step)) for step in (0, 4)]
    with pytest.warns(UserWarning, match=r"steps \[2\]"):
        sweep = aggregate(paths + [tmp_path / "m" / "step2" / "metrics.parquet"], expected_steps=[0, 2, 4])
    unfinished = sweep.filter(pl.col("status") == "unfinished")
    assert unfinished["step"].to_list() == [2] and unfinished["metric"].is_null().all()
    assert unfinished["model"].to_list() == ["m"]


def test_log_spaced_detection():
    assert log_spaced([0, 1, 2, 4, 8, 16, 128, 143000])
    assert log_spaced([0, 16, 64, 1000])  # the gradient steps: linear squeezed three of four points left (issue 25)
    assert log_spaced([0, 10, 1000])
    assert not log_spaced([0, 1000, 2000, 3000, 4000])
    assert not log_spaced(range(1000, 144000, 1000))  # evenly spaced, however wide
    assert not log_spaced([0, 100])


def outlier_rows(step: int) -> list[dict]:
    """Made-up rows of the rogue-dimension, massive-activation, attention-sink and LayerNorm-outlier measures."""
    rows = []
    for layer in range(3):
        for site in ("resid", "final_ln_in", "final_ln_out"):
            values = {"rogue_top1_share": 0.2 + step / 1000, "rogue_top3_share": 0.5, "rogue_top10_share": 0.9}
            values |= {"rogue_dims_90": 10, "avg_cos_standardised": 0.01, "avg_cos_sample": 0.3, "massive_ratio": 50}
            values |= {"massive_max": 5.0, "massive_dim_1": 3 + (step > 0), "massive_top_first_share": 0.5}
            values |= {"massive_top_delimiter_share": 0.25, "rogue_dim_1": 10 * layer + step % 7}
            rows += [{"layer": layer, "site": site, "metric": m, "value": v} for m, v in values.items()]
        for head in range(2):
            for metric in ("sink_first_mass", "sink_row_max_mass"):
                rows.append({"layer": layer, "head": head, "site": "attention", "metric": metric, "value": 0.4})
        for metric in ("ln_gain_outliers", "ln_bias_outliers", "ln_outliers_in_rogue"):
            rows.append({"layer": layer + 1, "site": "ln_attn", "metric": metric, "value": 1.0})
    return rows


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize(
    "steps",
    [pytest.param([0, 1, 2, 4, 64, 512], marks=pytest.mark.slow), [0, 100, 200, 300]],
    ids=["log-grid", "linear-grid"],
)
def test_every_model_figure_is_drawn(tmp_path, steps):
    sweep = aggregate([fake_checkpoint(tmp_path, step, str(step)) for step in steps])
    paths = plot_model(sweep, tmp_path / "figures")
    assert sorted(p.name for p in paths) == sorted(MODEL_FIGURES)
    for path in paths:
        assert path.stat().st_size > 10_000
    assert not list((tmp_path / "figures").glob(".*tmp*"))


@pytest.mark.parametrize("without_tokens", [[], ["b"], ["a", "b"]])
def test_comparison_figures_put_every_model_on_one_unit(tmp_path, monkeypatch, without_tokens):
    """Tokens seen on the x axis when every model has them; otherwise optimizer steps for all, labelled so (a
    local run without tokens_per_step used to be drawn by step under a "tokens seen" label)."""
    import anisweep.plots.families as families
    import anisweep.plots.sweep as plots

    parts = [aggregate([fake_checkpoint(tmp_path, s, f"{m}{s}", model=m) for s in (0, 10, 100)]) for m in "ab"]
    sweeps = pl.concat(parts).with_columns(
        pl.when(pl.col("model").is_in(without_tokens)).then(None).otherwise(pl.col("tokens_seen")).alias("tokens_seen")
    )
    unit = ("optimizer step", [0, 10, 100]) if without_tokens else ("tokens seen", [0, 1000, 10000])
    figures = []
    for module, draw in ((plots, plot_family), (families, plot_families)):
        monkeypatch.setattr(module, "save_figure", lambda fig, path: figures.append(fig))
        draw(sweeps, tmp_path / "compare.png")
        drawn = [ax for ax in figures[-1].axes if ax.get_visible() and ax.get_lines()]
        assert drawn and {ax.get_xlabel() for ax in drawn} == {unit[0]}
        assert {int(x) for ax in drawn for line in ax.get_lines() for x in line.get_xdata()} == set(unit[1])
        pyplot().close(figures[-1])


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_families_figure_compares_one_site_per_panel(tmp_path):
    """Each panel's rows come from the one site it names (final_ln_in differs from final_ln_out in the fake
    values below), per-layer values are averaged over layers, duplicates are left out."""
    pythia = aggregate([fake_checkpoint(tmp_path, s, f"p{s}", family="pythia", model="p") for s in (0, 10, 100)])
    olmo = aggregate([fake_checkpoint(tmp_path, s, f"o{s}", family="olmo", model="o") for s in (0, 10, 100)])
    sweeps = pl.concat([pythia, olmo]).with_columns(
        pl.when(pl.col("site") == "final_ln_in").then(pl.col("value") + 10).otherwise(pl.col("value")).alias("value")
    )
    before = panel_rows(sweeps, "final_ln_in", "avg_cos")
    after = panel_rows(sweeps, "final_ln_out", "avg_cos")
    assert before.height == after.height == 6
    assert (before["value"] - after["value"]).to_list() == pytest.approx([10.0] * 6)
    entropy = panel_rows(sweeps, "attention", "entropy_norm_mean").filter(pl.col("step") == 10)
    assert entropy["value"].to_list() == pytest.approx([0.6, 0.6])  # mean of 0.5, 0.6, 0.7 over the three layers
    assert {site for _, site, _ in PANELS} <= set(sweeps["site"].unique()) | {"qk_pre"}
    plot_families(sweeps, tmp_path / "compare_families.png")
    assert (tmp_path / "compare_families.png").stat().st_size > 10_000


def test_family_figure_compares_the_same_named_site_and_rotary_variant(tmp_path, monkeypatch):
    import anisweep.plots.sweep as plots

    neox = aggregate([fake_checkpoint(tmp_path, s, f"a{s}", model="neox") for s in (0, 10, 100)])
    bert = aggregate([fake_checkpoint(tmp_path, s, f"b{s}", model="bert") for s in (0, 10, 100)])
    bert = bert.filter(pl.col("site") != "qk_post")  # no rotary
    sweeps = pl.concat([neox, bert])
    # distinct values per site and model, so a panel showing the wrong one is caught
    code = {"final_ln_in": 1.0, "final_ln_out": 2.0, "resid": 3.0, "qk_pre": 4.0, "qk_post": 5.0}
    site_code = pl.DataFrame({"site": list(code), "code": list(code.values())})
    sweeps = (
        sweeps.join(site_code, on="site", how="left")
        .with_columns(
            (pl.col("code").fill_null(0.0) + pl.when(pl.col("model") == "bert").then(0.5).otherwise(0.0)).alias("value")
        )
        .drop("code")
    )
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig))
    plot_family(sweeps, tmp_path / "compare.png")
    panels = {ax.get_ylabel(): ax for ax in figures[0].axes if ax.get_visible() and ax.get_ylabel()}
    for metric in ("mean pairwise cosine", "IsoScore"):
        for site in ("final_ln_in", "final_ln_out"):
            ax = next(a for label, a in panels.items() if label.startswith(f"{metric} at {site}"))
            lines = {line.get_label(): set(line.get_ydata()) for line in ax.get_lines()}
            assert lines == {"neox": {code[site]}, "bert": {code[site] + 0.5}}
    ax = next(a for label, a in panels.items() if label.startswith("|qk cos|"))
    lines = {line.get_label(): (set(line.get_ydata()), line.get_linestyle()) for line in ax.get_lines()}
    assert lines == {
        "neox qk_pre": ({4.0}, "-"),
        "neox qk_post": ({5.0}, "--"),
        "bert qk_pre": ({4.5}, "-"),
    }
    ax = next(a for label, a in panels.items() if label.startswith("cos of the means concatenated"))
    lines = {line.get_label(): (set(line.get_ydata()), line.get_linestyle()) for line in ax.get_lines()}
    assert lines == {"neox qk_pre": ({4.0}, "-"), "neox qk_post": ({5.0}, "--"), "bert qk_pre": ({4.5}, "-")}


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_drift_figure_shows_p_against_005_and_qk_figures_show_each_metric(tmp_path, monkeypatch):
    import anisweep.plots.kit as kit
    import anisweep.plots.sweep as plots

    sweep = aggregate([fake_checkpoint(tmp_path, s, str(s)) for s in (0, 10, 100)])
    p_of = {"drift_avg_cos_spearman_p": 0.3, "drift_avg_cos_pearson_p": 0.01}
    sweep = sweep.with_columns(pl.col("metric").replace_strict(p_of, default=None, return_dtype=pl.Float64).alias("p"))
    sweep = sweep.with_columns(pl.coalesce("p", "value").alias("value")).drop("p")
    figures = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig))
    monkeypatch.setattr(kit, "save_figure", lambda fig, path: figures.append(fig))
    plots.drift_vs_anisotropy(sweep, tmp_path / "d.png")
    ax = next(a for a in figures[0].axes if a.get_ylabel().startswith("two-sided permutation p"))
    assert ax.get_yscale() == "log"
    lines = {line.get_label(): set(line.get_ydata()) for line in ax.get_lines()}
    assert lines == {"spearman": {0.3}, "pearson": {0.01}, "p = 0.05": {0.05}}
    plots.qk_mean_dot(sweep, tmp_path / "q.png")
    labels = [a.get_ylabel() for a in figures[1].axes if a.get_ylabel()]
    assert labels == ["<mean q, mean k>", "<mean q, mean k> / sqrt(d_head)"] * 2  # pre-rotary rows, then post
    plots.qk_cos_concat(sweep, tmp_path / "c.png")
    concat = [a for a in figures[2].axes if a.get_ylabel()]
    assert [a.get_title() for a in concat] == ["pre-rotary", "post-rotary"]
    assert {
        line.get_label(): tuple(line.get_ydata()) for line in concat[0].get_lines() if "layer" in line.get_label()
    } == {f"layer {layer}": (0.2 * layer,) * 3 for layer in range(3)}


def drawn_figures(monkeypatch) -> dict:
    """The figures the sweep plotters draw, by file name, instead of saved."""
    import anisweep.plots.kit as kit
    import anisweep.plots.sweep as plots

    figures = {}

    def keep(fig, path):
        figures[path.name] = fig

    monkeypatch.setattr(plots, "save_figure", keep)
    monkeypatch.setattr(kit, "save_figure", keep)
    return figures


def with_head_scores(sweep: pl.DataFrame, scores: dict) -> pl.DataFrame:
    """`sweep` with per-head score_mean / score_std rows (population) of the score samples `scores[layer][head]`,
    the same at every step."""
    ident = sweep.filter(pl.col("metric") == "score_std").select(
        "family", "model", "seed", "step", "tokens_seen", "layer", "status"
    )
    extra = []
    for layer, heads in scores.items():
        for head, values in enumerate(heads):
            for metric, value in (("score_mean", float(np.mean(values))), ("score_std", float(np.std(values)))):
                extra.append({"layer": layer, "head": head, "site": "attention", "metric": metric, "value": value})
    rows = ident.unique().join(pl.DataFrame(extra), on="layer")
    return pl.concat([sweep, rows], how="diagonal_relaxed")


def test_attention_softmax_draws_the_score_std_pooled_over_heads(tmp_path, monkeypatch):
    """Issue 25 item 10: the per-layer score_std row is the mean of the heads' stds; the figure draws the std of
    all the layer's scores together (its caption's claim), from the per-head rows."""
    from anisweep.plots.sweep import attention_softmax, pooled_score_std

    rng = np.random.default_rng(0)
    scores = {layer: [rng.normal(loc, scale, 500) for loc, scale in ((0.0, 1.0), (0.5, 2.0))] for layer in range(3)}
    sweep = with_head_scores(aggregate([fake_checkpoint(tmp_path, s, str(s)) for s in (0, 10, 100)]), scores)
    pooled = pooled_score_std(sweep).filter(pl.col("step") == 10).sort("layer")
    expected = [float(np.std(np.concatenate(scores[layer]))) for layer in range(3)]
    assert pooled["value"].to_list() == pytest.approx(expected, rel=1e-12)
    mean_of_stds = [float(np.mean([np.std(h) for h in scores[layer]])) for layer in range(3)]
    assert all(p > m for p, m in zip(expected, mean_of_stds))  # the two differ: the figure must say which
    figures = drawn_figures(monkeypatch)
    attention_softmax(sweep, tmp_path / "attention_softmax.png")
    ax = next(a for a in figures["attention_softmax.png"].axes if a.get_ylabel().startswith("score std"))
    assert ax.get_ylabel() == "score std, pooled over heads and pairs"
    lines = {line.get_label(): line.get_ydata() for line in ax.get_lines()}
    assert [lines[f"layer {layer}"][1] for layer in range(3)] == pytest.approx(expected)
    # without per-head rows: the per-layer row, labelled as what it is
    attention_softmax(sweep.filter(pl.col("head").is_null()), tmp_path / "older.png")
    labels = [a.get_ylabel() for a in figures["older.png"].axes]
    assert "score std: mean of the heads' stds" in labels


def test_the_pooled_score_std_does_not_cancel_where_a_bias_lifts_every_score(tmp_path):
    """Heads whose scores sit near 1e4 with a spread of 0.01 to 0.02: the heads' means spread about their own mean,
    not mean_h m_h^2 - (mean_h m_h)^2 (off by ~3e-6 there)."""
    from anisweep.plots.sweep import pooled_score_std

    rng = np.random.default_rng(1)
    scores = {0: [rng.normal(1e4 + shift, scale, 500) for shift, scale in ((0.0, 0.01), (0.03, 0.02))]}
    sweep = with_head_scores(aggregate([fake_checkpoint(tmp_path, s, str(s)) for s in (0, 10)]), scores)
    pooled = pooled_score_std(sweep).filter((pl.col("step") == 10) & (pl.col("layer") == 0))
    assert pooled["value"].item() == pytest.approx(float(np.std(np.concatenate(scores[0]))), rel=1e-9)


def test_the_sign_free_partition_isotropy_is_primary_and_the_other_labelled_solver_dependent(tmp_path, monkeypatch):
    """Issue 25 item 7: Machina & Mercer's one-sign I(W) depends on the eigensolver's signs."""
    from anisweep.plots.sweep import layernorm_params

    sweep = aggregate([fake_checkpoint(tmp_path, s, str(s)) for s in (0, 10, 100)])
    figures = drawn_figures(monkeypatch)
    layernorm_params(sweep, tmp_path / "layernorm_params.png")
    ax = next(a for a in figures["layernorm_params.png"].axes if a.get_ylabel() == "partition isotropy I(W)")
    lines = {line.get_label(): line for line in ax.get_lines()}
    for site in ("embed_in", "embed_out"):
        for label, value in (("sign-free", 0.5), ("centred, sign-free", 0.9)):
            primary = lines[f"{site}, {label}"]
            assert set(primary.get_ydata()) == {value} and primary.get_marker() == "."
        for label, value in (("one-sign (M&M)", 0.7), ("centred one-sign (M&M)", 0.95)):
            other = lines[f"{site}, {label}, solver-dependent"]
            assert set(other.get_ydata()) == {value}
            assert other.get_linewidth() < primary.get_linewidth() and other.get_alpha() < 1


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_figures_label_axes_in_words_and_keep_legends_off_the_data(tmp_path, monkeypatch):
    """Issue 25 item 11: no raw metric name as an axis label; every legend of these figures sits in a panel
    without data (a spare one of the grid) or outside the panels."""
    import anisweep.plots.sweep as plots

    sweep = analysed(aggregate([fake_checkpoint(tmp_path, s, str(s)) for s in (0, 10, 100)]))
    figures = drawn_figures(monkeypatch)
    for name in ("isotropy.png", "final_layernorm.png", "attention_softmax.png", "layernorm_params.png"):
        plots.PLOTTERS[name](sweep, tmp_path / name)
    for name in ("qk_alignment.png", "qk_cos_concat.png", "norms.png", "attention_entropy.png"):
        plots.PLOTTERS[name](sweep, tmp_path / name)
    for name in ("rogue_dimensions.png", "avg_cos_standardised.png", "massive_activations.png"):
        plots.PLOTTERS[name](sweep, tmp_path / name)  # issue 38's figures with a legend
    raw = set(plots.ISOTROPY_METRICS)
    for name, fig in figures.items():
        labels = {ax.get_ylabel() for ax in fig.axes} | {ax.get_title() for ax in fig.axes}
        assert not labels & raw, name
        legends = [ax for ax in fig.axes if ax.get_legend() is not None]
        for ax in legends:
            assert not ax.axison and not ax.get_lines(), f"{name}: a legend over a data panel"
        assert legends or fig.legends, f"{name}: no legend"
    isotropy = figures["isotropy.png"]
    assert [a.get_ylabel() for a in isotropy.axes if a.get_ylabel() and a.axison][:3] == [
        "mean pairwise cosine",
        "mean pairwise cosine, centred",
        "drift ratio ||mean x|| / mean ||x||",
    ]


def test_saved_figures_have_readable_tick_labels(tmp_path):
    """Issue 25 item 11: save_figure lifts every tick label below MIN_TICK_LABEL_SIZE (spectra and q/k SVD
    figures set 6 pt), on every axis of the figure."""
    import anisweep.plots.kit as kit

    fig, axes = kit.panel_grid(3, 3)
    axes[0].plot([1, 10, 100], [1, 2, 3])
    axes[0].set_xscale("log")
    axes[0].tick_params(which="both", labelsize=6)
    axes[1].plot([0, 1], [0, 1])
    axes[1].tick_params(axis="y", labelsize=12)
    axes[2].imshow(np.zeros((2, 2)))
    axes[2].set_yticks([0, 1], labels=["a", "b"], fontsize=6)  # as the heatmaps label their rows
    seen = {}
    original = kit.readable_ticks

    def check(fig, *args):
        original(fig, *args)
        seen["sizes"] = [
            (ax, axis, label.get_fontsize())
            for ax in fig.axes
            for axis in (ax.xaxis, ax.yaxis)
            for label in axis.get_ticklabels(which="both")
        ]

    kit.readable_ticks = check
    try:
        save_figure(fig, tmp_path / "f.png")
    finally:
        kit.readable_ticks = original
    assert seen["sizes"] and min(size for _, _, size in seen["sizes"]) >= MIN_TICK_LABEL_SIZE
    assert max(size for ax, axis, size in seen["sizes"] if axis is axes[1].yaxis) == 12  # larger ones are kept


def test_a_figure_its_layout_fits_is_drawn_once(tmp_path, monkeypatch):
    """save_figure draws a constrained-layout figure once, where savefig drew it twice (once to lay it out, once
    to render it; bbox_inches="tight" measured it a third time), and the PNG is that drawing at 110 dpi."""
    from matplotlib.figure import Figure
    from PIL import Image

    import anisweep.plots.kit as kit

    draws = []
    original = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda self, renderer: draws.append(1) or original(self, renderer))
    fig, axes = kit.panel_grid(2, 2)
    for ax in axes:
        ax.plot([0, 1], [0, 1], label="line")
    kit.legend_beside(fig, axes)
    fig.suptitle("title")
    save_figure(fig, tmp_path / "f.png")
    assert len(draws) == 1
    assert Image.open(tmp_path / "f.png").size == (round(3.4 * 2 * 110), round(2.8 * 110))


def test_a_figure_wider_than_its_canvas_is_saved_whole(tmp_path):
    """Constrained layout fits the panels, not a suptitle's width: one wider than the figure widens the PNG
    (cropped to what the figure draws) rather than losing its ends."""
    from PIL import Image

    import anisweep.plots.kit as kit

    fig, axes = kit.panel_grid(1, 1)
    axes[0].plot([0, 1], [0, 1])
    fig.suptitle("a suptitle far wider than the one panel of its figure, " * 3)
    save_figure(fig, tmp_path / "f.png")
    width, _ = Image.open(tmp_path / "f.png").size
    assert width > 2 * 3.4 * 110


def test_tokens_seen_are_above_the_top_row_of_panels_only(tmp_path, monkeypatch):
    """Every panel of a grid shares its step axis: the tokens seen sit above the top row (a second axis over
    each lower panel repeated it, a third of the figure's axes to lay out and draw)."""
    import anisweep.plots.sweep as plots

    sweep = analysed(aggregate([fake_checkpoint(tmp_path, s, str(s)) for s in (0, 64, 512, 1000)]))
    figures = drawn_figures(monkeypatch)
    plots.isotropy(sweep, tmp_path / "isotropy.png")  # five panels on a 2 x 3 grid
    fig = figures["isotropy.png"]
    panels = [ax for ax in fig.axes if ax.get_xlabel() == "optimizer step"]
    tokens = [ax for ax in fig.axes if ax.get_xlabel() == "tokens seen"]
    assert len(panels) == 5
    assert sorted(ax.get_position().y0 for ax in tokens) == sorted(
        ax.get_position().y0 for ax in panels if ax.get_subplotspec().is_first_row()
    )
    assert len(tokens) == 3
    pyplot().close("all")


def test_the_isotropy_band_is_the_spread_of_isotropic_cosines_without_scipy(tmp_path, monkeypatch):
    """The isotropy figure's band is 0 +- geometry.isotropic_cos_spread(d); drawing it imports no scipy (geometry
    imports scipy.stats: a second of CPU in each figure job that drew the band)."""
    import subprocess
    import sys

    import anisweep.plots.sweep as plots
    from anisweep.measures.geometry import isotropic_cos_spread

    sweep = analysed(aggregate([fake_checkpoint(tmp_path, s, str(s)) for s in (0, 64, 512, 1000)]))
    dim = sweep.filter((pl.col("metric") == "avg_cos") & (pl.col("layer") == 0))
    sweep = pl.concat([sweep, dim.with_columns(metric=pl.lit("dim"), value=pl.lit(64.0))])
    figures = drawn_figures(monkeypatch)
    plots.isotropy(sweep, tmp_path / "isotropy.png")
    band = next(p for p in figures["isotropy.png"].axes[0].patches if p.get_label().startswith("isotropic"))
    low, high = band.get_path().transformed(band.get_patch_transform()).get_extents().intervaly
    assert (low, high) == pytest.approx((-isotropic_cos_spread(64), isotropic_cos_spread(64)))
    pyplot().close("all")
    sweep.write_parquet(tmp_path / "sweep.parquet")
    code = (
        "import sys; import polars as pl; from pathlib import Path; from anisweep.plots.sweep import isotropy; "
        f"isotropy(pl.read_parquet({str(tmp_path / 'sweep.parquet')!r}), Path({str(tmp_path / 'i.png')!r})); "
        "assert 'scipy' not in sys.modules, 'scipy imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def tick_gaps(ax) -> tuple[float, float]:
    """(display distance from 0 to the next labelled tick, the smallest distance between two labelled powers of
    ten) on the x axis of `ax`."""
    ticks = sorted(t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1])
    x = [ax.transData.transform((t, 0))[0] for t in ticks]
    decades = [b - a for a, b in zip(x[1:], x[2:])]
    return x[1] - x[0], min(decades) if decades else float("inf")


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
def test_step_zero_keeps_its_distance_from_the_next_tick(tmp_path, monkeypatch):
    """Issue 43: on a symlog step axis whose linear part ends at 64, 10 sat a sixth of a decade from 0, their labels
    on top of each other. Every labelled tick is now at least half a decade's width from 0, on the steps below and
    the tokens seen above, in the per-model figures and in the comparison across models (by tokens seen)."""
    import anisweep.plots.sweep as plots

    sweep = analysed(aggregate([fake_checkpoint(tmp_path, s, str(s)) for s in (0, 64, 512, 1000)]))
    figures = drawn_figures(monkeypatch)
    plots.isotropy(sweep, tmp_path / "isotropy.png")
    plots.plot_family(pl.concat([sweep, sweep.with_columns(model=pl.lit("n"))]), tmp_path / "compare.png")
    axes = [ax for fig in figures.values() for ax in fig.axes if ax.get_visible() and ax.get_xscale() == "symlog"]
    assert len(axes) >= 10 and {ax.get_xlabel() for ax in axes} >= {"optimizer step", "tokens seen"}
    for ax in axes:
        ax.figure.canvas.draw()
        first, decade = tick_gaps(ax)
        assert first >= 0.5 * decade - 1e-6, (ax.get_xlabel(), ax.get_xticks())
        labels = [t.get_window_extent() for t in ax.get_xticklabels() if t.get_text()]
        assert all(a.x1 < b.x0 for a, b in zip(labels, labels[1:])), ax.get_xlabel()
    pyplot().close("all")


def test_the_step_axis_is_labelled_in_plain_numbers_and_figures_share_one_mathtext_parser(tmp_path, monkeypatch):
    """The step axis reads 0, 1, 10, 100, 1k as the tokens-seen axis above it does (matplotlib's own labels are
    mathtext powers of ten); the log axes that keep mathtext parse each label once per process, not per figure."""
    import anisweep.plots.kit as kit

    sweep = analysed(aggregate([fake_checkpoint(tmp_path, s, str(s)) for s in (0, 1, 2, 64, 1000)]))
    fig, ax = pyplot().subplots()
    ax.plot([0, 1000], [1, 2])
    kit.step_axis(ax, sweep)
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "10", "100", "1k"]
    pyplot().close(fig)

    renderers = []
    draw = kit.pyplot().Figure.draw
    monkeypatch.setattr(kit.pyplot().Figure, "draw", lambda fig, r: renderers.append(r) or draw(fig, r))
    for name in ("a.png", "b.png"):
        fig, axes = kit.panel_grid(1, 1)
        axes[0].semilogy([1, 2], [1e-3, 1e3])
        save_figure(fig, tmp_path / name)
    parsers = {id(r.mathtext_parser) for r in renderers}
    assert len(renderers) >= 2 and parsers == {id(kit._mathtext_parser())}


def test_cached_font_height_metrics_lay_out_texts_as_matplotlib_does():
    """save_figure hands the renderer the font height metrics once per font (kit.share_font_caches), where
    matplotlib's Text reads them from the font's tables for every text it measures: every text, one line or
    several, of any size, must land on the same pixels either way."""
    import anisweep.plots.kit as kit

    def extents(share: bool) -> list:
        fig = pyplot().figure(dpi=kit.FIGURE_DPI)
        texts = [
            fig.text(0.1, 0.1 * i, text, fontsize=size)
            for i, (text, size) in enumerate(
                [("1k", 8), ("layer 0\nhead 1", 9), ("tokens seen", 10), ("$10^{3}$", 12), ("Äg", 14)]
            )
        ]
        renderer = fig.canvas.get_renderer()
        if share:
            kit.share_font_caches(renderer)
        boxes = [t.get_window_extent(renderer).bounds for t in texts]
        pyplot().close(fig)
        return boxes

    assert extents(share=True) == extents(share=False)
    renderer = pyplot().figure(dpi=kit.FIGURE_DPI).canvas.get_renderer()
    kit.share_font_caches(renderer)
    assert all(
        isinstance(value, float)
        for value in renderer._get_font_height_metrics(matplotlib.font_manager.FontProperties())
    )
    pyplot().close("all")


def test_symlog_ticks_are_0_and_the_powers_of_ten_half_a_decade_from_it():
    from anisweep.plots.kit import symlog_ticks

    assert symlog_ticks(1, 1150) == [0, 1, 10, 100, 1000]
    assert symlog_ticks(16, 1150) == [0, 10, 100, 1000]  # 10 at 10/16 of a decade from 0
    assert symlog_ticks(64, 1150) == [0, 100, 1000]  # not 10, at 10/64
    assert symlog_ticks(6400, 115000) == [0, 10_000, 100_000]


def test_rogue_dimensions_figure_names_the_rogue_dimension(tmp_path, monkeypatch):
    """Issue 43: rogue_dimensions.png drew the shares of the top dimensions and never said which dimension is the
    rogue one. The legend names each residual layer's top dimension at the last step (rogue_dim_1: 10 * layer +
    step % 7 in the fake rows, 2, 12, 22 at step 100), the final-norm panels theirs."""
    import anisweep.plots.outliers as outliers

    sweep = analysed(aggregate([fake_checkpoint(tmp_path, s, str(s)) for s in (0, 10, 100)]))
    figures = {}
    monkeypatch.setattr(outliers, "save_figure", lambda fig, path: figures.update({path.name: fig}))
    outliers.rogue_dimensions(sweep, tmp_path / "rogue_dimensions.png")
    fig = figures["rogue_dimensions.png"]
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts[:3] == ["layer 0: dim 2", "layer 1: dim 12", "layer 2: dim 22"]
    titles = [ax.get_title() for ax in fig.axes if ax.get_title().startswith(("before", "after"))]
    assert titles == [f"{where} final norm, top 1 / 3 / 10\ntop: dim 22" for where in ("before", "after")]
    pyplot().close(fig)


def test_layernorm_outliers_shows_every_norm_even_where_their_counts_are_equal(tmp_path, monkeypatch):
    """Issue 43: a line per norm, nine norms with the same counts drawn on top of each other, showed one. The
    figure is a heat map per count, a row per norm and layer and a column per checkpoint, the count written in each
    cell; a norm without a bias has a blank row in the bias panel."""
    import anisweep.plots.outliers as outliers

    norms = [(site, layer) for layer in (1, 2, 3, 4) for site in ("ln_attn", "ln_mlp")] + [("final_ln", 4)]
    ident = {"family": "fam", "model": "m", "seed": 0, "tokens_seen": None, "head": None, "status": "ok"}
    rows = [
        ident | {"step": step, "layer": layer, "site": site, "metric": metric, "value": value}
        for step in (0, 10, 100)
        for site, layer in norms
        for metric, value in (("ln_gain_outliers", 2.0), ("ln_bias_outliers", 0.0), ("ln_outliers_in_rogue", 1.0))
        if not (site == "final_ln" and metric == "ln_bias_outliers")  # no bias: no row (measures.ln_outliers)
    ]
    figures = {}
    monkeypatch.setattr(outliers, "save_figure", lambda fig, path: figures.update({path.name: fig}))
    outliers.layernorm_outliers(pl.DataFrame(rows), tmp_path / "layernorm_outliers.png")
    panels = [ax for ax in figures["layernorm_outliers.png"].axes if ax.get_images()]
    assert [ax.get_title().split()[0] for ax in panels] == ["gain", "bias", "outlier"]
    names = ["ln_attn 1", "ln_mlp 1", "ln_attn 2", "ln_mlp 2", "ln_attn 3", "ln_mlp 3", "ln_attn 4", "ln_mlp 4"]
    for ax, value in zip(panels, (2.0, 0.0, 1.0)):
        grid = np.asarray(ax.get_images()[0].get_array().filled(np.nan))
        assert grid.shape == (9, 3)
        assert [t.get_text() for t in ax.get_yticklabels()] == [*names, "final_ln 4"]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "10", "100"]
        expected = np.full((9, 3), value)
        if value == 0.0:
            expected[-1] = np.nan  # the final norm has no bias
        np.testing.assert_array_equal(grid, expected)
        assert sorted(t.get_text() for t in ax.texts) == [f"{value:.0f}"] * int(np.isfinite(expected).sum())
    pyplot().close("all")
