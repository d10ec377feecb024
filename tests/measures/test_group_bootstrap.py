"""anisweep.measures.group_bootstrap: one group of seeds against another at the steps they share, on synthetic
checkpoint folders: the table against bootstrap.compare on the same measures and draws, the replicates against the
measures of the drawn seeds' drawn sequences, the estimates against each group's own table, the two designs, and the
refusals."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from test_sample_bootstrap import N_SEQUENCES, tokens, write_checkpoint

from anisweep.measures import bootstrap
from anisweep.measures import group_bootstrap as gb
from anisweep.measures import sample_bootstrap as sb

STEPS = (0, 8)
MEASURES = ("isoscore", "top_eig_share", "rankme")  # defined on these 6-dimensional clouds (alpha_req needs 22)
SETTINGS = sb.Settings(samples=120, measures=MEASURES, seed=3)
from test_sample_bootstrap import DIRECT  # noqa: E402  (each measure as metrics computes it)


def group(root, name: str, n_seeds: int, scale: float, first_seed: int = 0) -> list[list]:
    """A group's checkpoint folders, seed by seed: each seed's vectors its own draw, every dimension scaled by
    `scale` ** i (more anisotropic as `scale` grows) and a little more at the later step."""
    return [
        [write_checkpoint(root / f"{name}-{i}" / f"step{s}", f"{name}-{i}", s, scale + 0.05 * s, seed=i) for s in STEPS]
        for i in range(first_seed, first_seed + n_seeds)
    ]


@pytest.fixture
def groups(tmp_path) -> dict[str, list[list]]:
    return {"a": group(tmp_path, "a", 3, 1.0), "b": group(tmp_path, "b", 3, 1.6, first_seed=10)}


def capture(monkeypatch, module, name: str) -> list:
    """Wrap module.name to record the arguments of each call."""
    seen, original = [], getattr(module, name)

    def wrapped(*args, **kw):
        seen.append(args)
        return original(*args, **kw)

    monkeypatch.setattr(module, name, wrapped)
    return seen


def loop_order() -> list[tuple[str, int, str, int]]:
    """(metric, layer, site, step) in the order comparison_table computes them: step by step, site by site."""
    return [(m, layer, site, step) for step in STEPS for layer, site in ((0, "resid"), (1, "resid")) for m in MEASURES]


@pytest.mark.parametrize("design", ["paired", "unpaired"])
def test_each_row_is_bootstrap_compare_on_the_same_measures(groups, design, monkeypatch):
    """The replicate differences, and the interval and p-value made of them, equal bootstrap.compare's on the same
    seeds' measures with the same seed, exactly; the estimates are the groups' mean metrics values."""
    rows = capture(monkeypatch, gb, "_difference_row")
    table = gb.comparison_table(groups["a"], groups["b"], design=design, settings=SETTINGS, name="ab")
    assert table.height == len(loop_order()) == len(rows) and set(table["design"]) == {design}
    table_deltas = {key: args[1] for key, args in zip(loop_order(), rows)}
    compared = capture(monkeypatch, bootstrap, "difference")
    for step_index, step in enumerate(STEPS):
        sides = [[sb.read_checkpoint(seed[step_index], MEASURES) for seed in groups[g]] for g in ("a", "b")]
        for r in table.filter(pl.col("step") == step).iter_rows(named=True):
            key = (r["metric"], r["layer"], r["site"])
            # labelled by position, the same on both sides, as a paired compare requires
            labels = [str(i) for i in range(len(sides[0]))]
            base, other = (sb.sampled_measure(cps, labels, (*key, None)) for cps in sides)
            got = bootstrap.compare(
                base, other, design=design, level=SETTINGS.level, samples=SETTINGS.samples, seed=SETTINGS.seed
            )
            _, _, got_base, got_other, *_ = compared[-1]
            deltas = table_deltas[(*key, step)]
            assert np.array_equal(got_other - got_base, deltas, equal_nan=True)
            assert (r["low"], r["high"], r["p"]) == (got.low, got.high, got.p)
            assert (r["n_seeds_base"], r["n_seeds_other"], r["n_units"], r["samples"]) == (3, 3, N_SEQUENCES, 120)
            assert r["undefined"] == got.undefined == int(np.isnan(deltas).sum()) == 0
            # compare's estimate is the moments' full-sample value: metrics' value up to rounding
            assert r["estimate"] == pytest.approx(got.difference, **tolerance(r["metric"]))
            assert r["base_estimate"] == np.mean([c.exact[key] for c in sides[0]])
            assert r["other_estimate"] == np.mean([c.exact[key] for c in sides[1]])
            assert r["estimate"] == r["other_estimate"] - r["base_estimate"]


def tolerance(metric: str) -> dict:
    """IsoScore's replicates are of float32 products (anisweep.measures.unit_products: its participation ratio to
    2e-5), the others' of float64 moments."""
    return {"rel": 2e-5, "abs": 2e-6} if metric == "isoscore" else {"rel": 1e-9, "abs": 1e-12}


@pytest.mark.parametrize("design", ["paired", "unpaired"])
def test_a_replicate_is_the_drawn_seeds_measures_of_the_drawn_sequences(groups, design, monkeypatch):
    """Replicate r: the mean over the other's drawn seeds minus the mean over the base's of the measure computed from
    the vectors of the drawn sequences (the same sequences on both sides; paired: the same seed positions too)."""
    rows = capture(monkeypatch, gb, "_difference_row")
    table = gb.comparison_table(groups["a"], groups["b"], design=design, settings=SETTINGS)
    (block, *_) = bootstrap.draws(N_SEQUENCES, 3, 3, design=design, samples=SETTINGS.samples, seed=SETTINGS.seed)
    assert np.array_equal(block.base, block.other) == (design == "paired")
    # the units every table of this seed draws: a model's, a group's, a comparison's
    (alone, *_) = bootstrap.draws(N_SEQUENCES, 1, samples=SETTINGS.samples, seed=SETTINGS.seed)
    assert np.array_equal(block.units, alone.units)
    metric, layer, site, step = loop_order()[0]
    deltas = rows[0][1]
    assert table.filter(pl.col("metric") == metric, pl.col("layer") == layer, pl.col("step") == step).height == 1
    sides = [[sb.read_checkpoint(seed[0], MEASURES) for seed in groups[g]] for g in ("a", "b")]
    for r in range(5):
        means = []
        for cps, drawn in ((sides[0], block.base[r]), (sides[1], block.other[r])):
            values = []
            for s in drawn:
                sample = cps[s].sites[(layer, site)]
                values.append(DIRECT[metric](sample.x[bootstrap.rows_of_units(sample.unit, block.units[r])]))
            means.append(np.mean(values))
        assert deltas[r] == pytest.approx(means[1] - means[0], **tolerance(metric))


def test_the_estimates_are_each_groups_own_tables(groups):
    table = gb.comparison_table(groups["a"], groups["b"], settings=SETTINGS, name="ab", base_group="a", other_group="b")
    own = {g: sb.bootstrap_table(groups[g], SETTINGS, group=g).filter(pl.col("against").is_null()) for g in ("a", "b")}
    keys = ("metric", "layer", "site", "step")
    for g, column in (("a", "base_estimate"), ("b", "other_estimate")):
        joined = table.join(own[g].select(*keys, "estimate"), on=keys, how="left")
        assert joined["estimate_right"].null_count() == 0
        assert (joined[column] == joined["estimate_right"]).all()
    first = table.row(0, named=True)
    assert (first["comparison"], first["base_group"], first["other_group"], first["against"]) == (
        "ab",
        "a",
        "b",
        "group",
    )
    assert first["base_models"] == [f"toy/a-{i}" for i in range(3)]
    assert first["other_models"] == [f"toy/b-{i}" for i in range(10, 13)]
    assert (first["family"], first["model"], first["seed"]) == ("toy", None, None)
    assert table["tokens_seen"].to_list() == [s * 10 for s in table["step"]] == table["other_tokens_seen"].to_list()
    # b's more anisotropic clouds: a lower IsoScore in every replicate
    isoscore = table.filter(pl.col("metric") == "isoscore")
    assert (isoscore["estimate"] < 0).all() and (isoscore["high"] < 0).all()
    assert (isoscore["p"] == 2 / SETTINGS.samples).all()


def test_a_group_against_itself(groups):
    """Paired, every replicate draws the same seeds on both sides: no difference at all. Unpaired, the seeds are
    drawn apart: the same estimate, but an interval as wide as the spread between seeds."""
    paired = gb.comparison_table(groups["a"], groups["a"], design="paired", settings=SETTINGS)
    assert (paired["estimate"] == 0).all() and (paired["low"] == 0).all() and (paired["high"] == 0).all()
    assert (paired["p"] == 1).all()
    unpaired = gb.comparison_table(groups["a"], groups["a"], design="unpaired", settings=SETTINGS)
    assert (unpaired["estimate"] == 0).all()
    assert (unpaired["low"] < 0).all() and (unpaired["high"] > 0).all()


def test_groups_that_cannot_be_compared_are_refused(tmp_path, groups):
    two = group(tmp_path, "c", 2, 1.0)
    with pytest.raises(sb.BootstrapInputError, match="a paired design pairs seed i of the base with seed i"):
        gb.comparison_table(groups["a"], two, design="paired", settings=SETTINGS)
    assert gb.comparison_table(groups["a"], two, settings=SETTINGS)["n_seeds_other"][0] == 2  # unpaired: fine
    with pytest.raises(sb.BootstrapInputError, match="every seed of both groups needs the same steps"):
        gb.comparison_table(groups["a"], [seed[:1] for seed in groups["b"]], settings=SETTINGS)
    shifted = [[seed[1], seed[0]] for seed in groups["b"]]
    with pytest.raises(sb.BootstrapInputError, match="of step 0 are compared with the other's of step 8"):
        gb.comparison_table(groups["a"], shifted, settings=SETTINGS)
    other_sample = [[write_checkpoint(tmp_path / "d" / f"step{s}", "d", s, sample=tokens(seed=5)) for s in STEPS]]
    with pytest.raises(sb.BootstrapInputError, match="were not measured on one evaluation sample"):
        gb.comparison_table(groups["a"], other_sample, settings=SETTINGS)
    with pytest.raises(sb.BootstrapInputError, match="design 'matched'"):
        gb.comparison_table(groups["a"], groups["b"], design="matched", settings=SETTINGS)
