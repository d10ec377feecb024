"""anisweep.measures.bootstrap against google-research/language's Multi-Bootstrap (vendored in
multibootstrap_reference/) on the same per-seed, per-example matrices, driven by the same draws (the reference's
RandomState stream replayed) and by independent draws at large B; the reweighting of sum-built measures; the
designs and the refusals; and the coverage of the 95% intervals on synthetic data with a known truth."""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from anisweep.measures import bootstrap as bs
from anisweep.measures.geometry import isoscore

REFERENCE = Path(__file__).parent / "multibootstrap_reference"


@pytest.fixture(scope="module")
def reference():
    sys.path.insert(0, str(REFERENCE))
    try:
        yield importlib.import_module("multibootstrap")
    finally:
        sys.path.remove(str(REFERENCE))


def quiet(fn, *args, **kw):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kw)


# --------------------------------------------------------------------------- the same matrices, three measures
# Each is (reference score_fn, labels, base preds, other preds, anisweep measure of preds): accuracy (the paper's own
# metric, integer sums), a ratio of real sums (entropy per token: preds a sequence's entropy sum, labels its token
# count, shared by every seed as the corpus is) and a median (no sums determine it: sample-built).


def accuracy_case(rng, seeds=5, n=120):
    labels = rng.integers(0, 3, size=n)
    base = np.where(rng.random((seeds, n)) < 0.7, labels, (labels + 1) % 3)
    other = np.where(rng.random((seeds, n)) < 0.75, labels, (labels + 1) % 3)

    def measure(preds):
        correct = (preds == labels).astype(float)
        return bs.SumBuilt(np.stack([correct, np.ones_like(correct)], axis=2), lambda s: s[..., 0] / s[..., 1])

    return (lambda y_true, y_pred: np.mean(y_true == y_pred)), labels, base, other, measure


def entropy_case(rng, seeds=5, n=120):
    tokens = 1 + rng.poisson(15, size=n)
    seed_shift = rng.normal(0, 0.1, size=(seeds, 1))
    base = rng.gamma(2.0 * tokens, 1.0, size=(seeds, n)) + seed_shift * tokens
    other = base + rng.normal(0.05, 0.3, size=(seeds, n)) * tokens

    def measure(preds):
        per_unit = np.stack([preds, np.broadcast_to(tokens, preds.shape)], axis=2)
        return bs.SumBuilt(per_unit, lambda s: s[..., 0] / s[..., 1])

    return (lambda y_true, y_pred: np.sum(y_pred) / np.sum(y_true)), tokens, base, other, measure


def median_case(rng, seeds=5, n=120):
    base = rng.normal(size=(seeds, n)) + rng.normal(0, 0.2, size=(seeds, 1))
    other = base + rng.normal(0.1, 0.5, size=(seeds, n))

    def measure(preds):
        return bs.SampleBuilt(len(preds), preds.shape[1], bs.one_at_a_time(lambda s, units: np.median(preds[s, units])))

    return (lambda y_true, y_pred: np.median(y_pred)), np.zeros(base.shape[1]), base, other, measure


CASES = {"accuracy": accuracy_case, "entropy": entropy_case, "median": median_case}
EXACT = {"accuracy": True, "entropy": False, "median": True}  # integer sums and a sample measure: bit for bit


def run_info(seeds_base, seeds_other):
    return pd.DataFrame(
        {"seed": [*range(seeds_base), *range(seeds_other)], "intervention": [False] * seeds_base + [True] * seeds_other}
    )


def reference_draws(n_units, seeds_base, seeds_other, design, samples, seed):
    """The draws the reference makes from RandomState(seed), in its order, as anisweep Draws (one block)."""
    rng = np.random.RandomState(seed)
    common = list(set(range(seeds_base)).intersection(range(seeds_other)))
    units, base, other = [], [], []
    for _ in range(samples):
        if design == "paired":
            b = rng.choice(common, size=len(common), replace=True)
            o = b
        else:
            b = rng.choice(list(range(seeds_base)), size=seeds_base, replace=True)
            o = rng.choice(list(range(seeds_other)), size=seeds_other, replace=True)
        units.append(rng.choice(n_units, size=n_units, replace=True))
        base.append(b)
        other.append(o)
    return [bs.Draws(np.array(units), np.array(base), np.array(other))]


def assert_same(mine, theirs, exact):
    if exact:
        np.testing.assert_array_equal(mine, theirs)
    else:
        # float64 sums added in another order; a difference near 0 keeps their absolute error, not its relative one
        np.testing.assert_allclose(mine, theirs, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("case", sorted(CASES))
def test_point_estimates_equal_the_reference_score_on_unresampled_data(reference, case):
    score_fn, labels, base, other, measure = CASES[case](np.random.default_rng(0))
    preds = np.concatenate([base, other])
    ((ref_base, ref_other),) = reference.multibootstrap(
        run_info(len(base), len(other)),
        preds,
        labels,
        score_fn,
        paired_seeds=True,
        sample_seeds=False,
        sample_examples=False,
        nboot=1,
        verbose=False,
    )
    assert_same([bs.estimate(measure(base)), bs.estimate(measure(other))], [ref_base, ref_other], EXACT[case])
    # entropy's sums are real: the reference sums in numpy's pairwise order, anisweep by a matrix product


@pytest.mark.parametrize("design", ["paired", "unpaired"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_replicates_intervals_and_p_equal_the_reference_on_the_same_draws(reference, case, design):
    score_fn, labels, base, other, measure = CASES[case](np.random.default_rng(1))
    if design == "unpaired":
        other = other[:4]  # independent seeds: another number of them
    samples, seed = 200, 7
    ref = reference.multibootstrap(
        run_info(len(base), len(other)),
        np.concatenate([base, other]),
        labels,
        score_fn,
        paired_seeds=design == "paired",
        nboot=samples,
        rng=seed,
        verbose=False,
    )
    blocks = reference_draws(len(labels), len(base), len(other), design, samples, seed)
    got_base, got_other = bs.replicates(measure(base), measure(other), blocks)
    assert_same(got_base, [b for b, _ in ref], EXACT[case])
    assert_same(got_other, [o for _, o in ref], EXACT[case])

    for level in (0.95, 0.9):
        stats_up = quiet(reference.report_ci, ref, c=level)
        stats_down = quiet(reference.report_ci, ref, c=level, expect_negative_effect=True)
        mine = bs.summarise(measure(base), got_base, level)
        assert_same([mine.low, mine.high], [stats_up["base"]["low"], stats_up["base"]["high"]], EXACT[case])
        diff = bs.difference(measure(base), measure(other), got_base, got_other, design, level)
        assert_same([diff.low, diff.high], [stats_up["delta"]["low"], stats_up["delta"]["high"]], EXACT[case])
        # the reference's p is one-sided (the share on the side against the effect it expects, at least 1 / B)
        assert diff.p == min(1.0, 2 * min(stats_up["delta"]["p"], stats_down["delta"]["p"]))
        assert diff.design == design and diff.samples == samples


def quantile_error(samples, q, b):
    """Monte Carlo standard error of the q-quantile of b draws from the distribution of `samples`:
    sqrt(q (1 - q) / b) / density at the quantile (a Gaussian kernel density)."""
    at = np.quantile(samples, q)
    return np.sqrt(q * (1 - q) / b) / stats.gaussian_kde(samples)(at)[0]


@pytest.mark.slow
def test_intervals_and_p_within_monte_carlo_error_of_the_reference_at_large_b(reference):
    """Each side's own draws (anisweep's generator, the reference's RandomState), B = 3,000: the interval ends and
    the p-value differ by less than 4 standard errors of their difference (sqrt 2 times one side's)."""
    score_fn, labels, base, other, measure = entropy_case(np.random.default_rng(2))
    b = 3000
    ref = reference.multibootstrap(
        run_info(len(base), len(other)),
        np.concatenate([base, other]),
        labels,
        score_fn,
        paired_seeds=True,
        nboot=b,
        rng=3,
        verbose=False,
    )
    ref_deltas = np.array([o - s for s, o in ref])
    mine = bs.compare(measure(base), measure(other), design="paired", samples=b, seed=3)
    up = quiet(reference.report_ci, ref)
    down = quiet(reference.report_ci, ref, expect_negative_effect=True)
    for got, want, q in [(mine.low, up["delta"]["low"], 0.025), (mine.high, up["delta"]["high"], 0.975)]:
        assert abs(got - want) < 4 * np.sqrt(2) * quantile_error(ref_deltas, q, b)
    ref_p = min(1.0, 2 * min(up["delta"]["p"], down["delta"]["p"]))
    p_error = 2 * np.sqrt(max(ref_p / 2 * (1 - ref_p / 2), 1 / b) / b)
    assert abs(mine.p - ref_p) < 4 * np.sqrt(2) * p_error
    assert 0.001 < ref_p < 0.5  # a p-value in the range where the test above can tell a wrong one


# --------------------------------------------------------------------------- reweighting the sums


def test_unit_weights_reproduce_the_full_sample_sums():
    rng = np.random.default_rng(4)
    per_unit = np.stack([rng.gamma(3.0, size=(3, 50)), rng.integers(1, 30, size=(3, 50))], axis=2)
    measure = bs.SumBuilt(per_unit, lambda s: s[..., 0] / s[..., 1])
    every_unit_once = measure.of_weights(np.ones((1, 50)))[0]
    full = per_unit[..., 0].sum(axis=1) / per_unit[..., 1].sum(axis=1)
    np.testing.assert_allclose(every_unit_once, full, rtol=1e-14)  # float64 sums: only the order of adding differs
    counts = bs.SumBuilt(per_unit[..., 1:], lambda s: s[..., 0])
    np.testing.assert_array_equal(counts.of_weights(np.ones((1, 50)))[0], per_unit[..., 1].sum(axis=1))


def test_reweighted_sums_equal_the_measure_of_the_drawn_units_repeated():
    rng = np.random.default_rng(5)
    sums, tokens = rng.gamma(3.0, size=(2, 40)), rng.integers(1, 30, size=40).astype(float)
    measure = bs.SumBuilt(
        np.stack([sums, np.broadcast_to(tokens, sums.shape)], axis=2), lambda s: s[..., 0] / s[..., 1]
    )
    (block,) = bs.draws(40, 2, samples=6, seed=1)
    for draw, values in zip(block.units, measure.values(block, np.ones((6, 2), dtype=bool))):
        repeated = [sums[s, draw].sum() / tokens[draw].sum() for s in range(2)]
        np.testing.assert_allclose(values, repeated, rtol=1e-13)


# --------------------------------------------------------------------------- sample-built: IsoScore of drawn tokens


def clustered_tokens(rng, n_units=60, per_unit=8, scales=(2.0, 1.0, 0.5)):
    """Tokens in 3 dims, `per_unit` a sequence sharing a sequence-level offset (so tokens of a sequence correlate)."""
    scales = np.asarray(scales)
    offsets = rng.normal(size=(n_units, 3)) * scales * 0.6
    noise = rng.normal(size=(n_units, per_unit, 3)) * scales * 0.8
    return (offsets[:, None, :] + noise).reshape(-1, 3), np.repeat(np.arange(n_units), per_unit), scales**2


def isoscore_of_eigenvalues(lam):
    """geometry.isoscore's formula on the last axis of eigenvalues."""
    d = lam.shape[-1]
    sd = np.sqrt(d)
    lam_hat = sd * lam / np.linalg.norm(lam, axis=-1, keepdims=True)
    delta = np.linalg.norm(lam_hat - 1.0, axis=-1) / np.sqrt(2.0 * (d - sd))
    k = (d - delta**2 * (d - sd)) ** 2 / d**2
    return (d * k - 1.0) / (d - 1.0)


def drawn_isoscore(tokens, unit_of_row):
    """IsoScore of each draw's tokens (a sequence's tokens as often as it is drawn), for many draws at once: the
    covariance of the drawn tokens is their count-weighted covariance."""
    n_units = int(unit_of_row.max()) + 1
    outer_shape = (tokens.shape[1], tokens.shape[1])

    def of_units(seed, units):
        weights = bs.unit_counts(units, n_units)[:, unit_of_row]  # draws x tokens
        total = weights.sum(axis=1)
        mean = weights @ tokens / total[:, None]
        outer = (tokens[:, :, None] * tokens[:, None, :]).reshape(len(tokens), -1)
        scatter = (weights @ outer).reshape(-1, *outer_shape) - total[:, None, None] * mean[:, :, None] * mean[:, None]
        return isoscore_of_eigenvalues(np.linalg.eigvalsh(scatter / (total - 1)[:, None, None]))

    return of_units


def test_rows_of_units_gives_each_drawn_units_rows_as_often_as_drawn():
    unit_of_row = np.array([2, 0, 1, 0, 2, 2, 4])
    units = np.array([2, 0, 2, 3, 4])
    expected = [i for u in units for i in np.flatnonzero(unit_of_row == u)]
    np.testing.assert_array_equal(bs.rows_of_units(unit_of_row, units), expected)


def test_sample_built_isoscore_is_geometry_isoscore_of_the_drawn_tokens():
    tokens, unit_of_row, _ = clustered_tokens(np.random.default_rng(6))
    batched = bs.SampleBuilt(1, 60, drawn_isoscore(tokens, unit_of_row))
    one_by_one = bs.SampleBuilt(
        1, 60, bs.one_at_a_time(lambda s, u: isoscore(tokens[bs.rows_of_units(unit_of_row, u)]))
    )
    (block,) = bs.draws(60, 1, samples=8, seed=2)
    wanted = np.ones((8, 1), dtype=bool)
    np.testing.assert_allclose(batched.values(block, wanted), one_by_one.values(block, wanted), rtol=1e-10)
    assert bs.estimate(one_by_one) == isoscore(tokens)


# --------------------------------------------------------------------------- designs, draws, refusals


def gamma_measure(rng, seeds, n=30, names=None):
    return bs.SumBuilt(rng.gamma(2.0, size=(seeds, n)), lambda s: s[..., 0], seeds=names)


def test_a_model_alone_gets_the_example_level_interval():
    got = bs.interval(gamma_measure(np.random.default_rng(7), 1), level=0.9, samples=200)
    assert (got.n_seeds, got.n_units, got.samples, got.level, got.design) == (1, 30, 200, 0.9, "units")
    assert got.low < got.estimate < got.high
    group = bs.interval(gamma_measure(np.random.default_rng(7), 3), samples=200)
    assert (group.n_seeds, group.design) == (3, "seeds and units")


def test_paired_draws_share_seeds_unpaired_draw_them_apart_and_units_depend_on_the_seed_alone():
    (paired,) = bs.draws(20, 5, 5, design="paired", samples=50, seed=3)
    (unpaired,) = bs.draws(20, 5, 4, design="unpaired", samples=50, seed=3)
    (alone,) = bs.draws(20, 1, samples=50, seed=3)
    np.testing.assert_array_equal(paired.base, paired.other)
    assert unpaired.other.shape == (50, 4) and not np.array_equal(unpaired.base[:, :4], unpaired.other)
    np.testing.assert_array_equal(paired.units, unpaired.units)
    np.testing.assert_array_equal(paired.units, alone.units)  # every measure, step and group: the same sequences
    (fewer,) = bs.draws(20, 2, samples=30, seed=3)
    np.testing.assert_array_equal(fewer.units, alone.units[:30])  # whatever B
    (other_seed,) = bs.draws(20, 1, samples=50, seed=4)
    assert not np.array_equal(alone.units, other_seed.units)


def test_draws_come_in_blocks_that_bound_memory():
    n_units = bs.BLOCK_ELEMENTS // 100
    blocks = list(bs.draws(n_units, 2, samples=250, seed=0))
    assert [b.units.shape[0] for b in blocks] == [100, 100, 50]
    assert all(b.units.size <= bs.BLOCK_ELEMENTS for b in blocks)


def test_a_paired_step_test_sees_a_shift_that_seed_spread_hides_unpaired():
    rng = np.random.default_rng(8)
    spread = rng.normal(0, 1.0, size=(5, 1))  # seeds far apart, each moving by 0.1 between the steps
    earlier = rng.normal(size=(5, 80)) * 0.1 + spread
    later = earlier + 0.1
    step = [bs.SumBuilt(v, lambda s: s[..., 0] / 80) for v in (earlier, later)]
    paired = bs.compare(*step, design="paired", samples=500)
    unpaired = bs.compare(*step, design="unpaired", samples=500)
    assert paired.p == 2 / 500 and paired.low > 0  # every replicate moves up: p at its floor, 2 / B
    assert unpaired.p > 0.5 and unpaired.low < 0 < unpaired.high
    assert paired.difference == pytest.approx(0.1)


def test_two_sided_p():
    assert bs.two_sided_p(np.array([1.0, 2.0, 3.0, 4.0])) == 0.5  # none at or below 0: the floor 1 / B, doubled
    assert bs.two_sided_p(np.array([-1.0, 1.0])) == 1.0
    deltas = np.linspace(-1, 9, 101)  # 11 of 101 at or below 0
    assert bs.two_sided_p(deltas) == pytest.approx(22 / 101)
    assert bs.two_sided_p(-deltas) == bs.two_sided_p(deltas)


def test_a_measure_undefined_on_some_draws_gives_no_interval():
    values = np.random.default_rng(9).normal(size=(1, 20))
    measure = bs.SumBuilt(values, lambda s: np.where(s[..., 0] > 0, np.log(np.abs(s[..., 0])), np.nan))
    got = bs.interval(measure, samples=300)
    assert 0 < got.undefined < 300 and np.isnan(got.low) and np.isnan(got.high)


def test_step_pairs_are_each_step_against_the_previous_and_the_final():
    assert bs.step_pairs([30, 0, 10, 20]) == [(0, 10), (10, 20), (20, 30), (0, 30), (10, 30)]
    assert bs.step_pairs([5]) == []


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: bs.SumBuilt(np.ones((2, 1)), lambda s: s[..., 0]), "at least 2 units"),
        (lambda: bs.SumBuilt(np.ones((2,)), lambda s: s), "seeds x units x statistics"),
        (lambda: bs.SumBuilt(np.array([[1.0, np.nan]]), lambda s: s[..., 0]), "not all finite"),
        (lambda: bs.SumBuilt(np.ones((2, 3)), lambda s: s[..., 0], seeds=["a"]), "1 seed names for 2 seeds"),
        (lambda: bs.SumBuilt(np.ones((2, 3)), lambda s: s[..., 0], seeds=["a", "a"]), "seed names repeat"),
        (lambda: bs.interval(bs.SumBuilt(np.ones((1, 3)), lambda s: s), samples=10), "to shape (...)"),
        (lambda: bs.interval(bs.SumBuilt(np.ones((1, 3)), lambda s: s[..., 0]), level=95), "between 0 and 1"),
        (lambda: bs.interval(bs.SumBuilt(np.ones((1, 3)), lambda s: s[..., 0]), samples=0), "at least 1"),
    ],
)
def test_bad_input_says_what_is_wrong(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        make()


def test_comparisons_refuse_sides_that_do_not_match():
    rng = np.random.default_rng(10)
    with pytest.raises(ValueError, match="same units"):
        bs.compare(gamma_measure(rng, 2), gamma_measure(rng, 2, n=31), design="paired")
    with pytest.raises(ValueError, match="same seeds in the same order.*design='unpaired'"):
        bs.compare(
            gamma_measure(rng, 2, names=["s0", "s1"]), gamma_measure(rng, 2, names=["s1", "s0"]), design="paired"
        )
    with pytest.raises(ValueError, match="'paired' or 'unpaired'"):
        bs.compare(gamma_measure(rng, 2), gamma_measure(rng, 2), design="joint")
    got = bs.compare(gamma_measure(rng, 2), gamma_measure(rng, 3), design="unpaired", samples=50)
    assert (got.n_seeds_base, got.n_seeds_other, got.design) == (2, 3, "unpaired")


# --------------------------------------------------------------------------- coverage on a known truth

REPLICATES = 1000  # the share covered has a standard error of 0.7% around 95%: 93-97% is about 3 of them


def entropy_units(rng, n=150):
    """Per-sequence entropy sums and token counts: a sequence of c tokens sums Gamma(2 c) entropies, scaled by a
    sequence-level factor of mean 1 (tokens of a sequence correlate). The true entropy per token is 2."""
    tokens = 1 + rng.poisson(20, size=n)
    factor = rng.lognormal(-0.125, 0.5, size=n)
    return np.stack([rng.gamma(2.0 * tokens, 1.0) * factor, tokens], axis=1)[None]


@pytest.mark.slow
def test_entropy_intervals_cover_the_truth_at_their_level():
    rng = np.random.default_rng(11)
    covered = 0
    for r in range(REPLICATES):
        measure = bs.SumBuilt(entropy_units(rng), lambda s: s[..., 0] / s[..., 1])
        got = bs.interval(measure, samples=bs.DEFAULT_SAMPLES, seed=r)
        covered += got.low <= 2.0 <= got.high
    assert 0.93 <= covered / REPLICATES <= 0.97, covered


@pytest.mark.slow
def test_isoscore_intervals_cover_the_truth_at_their_level():
    rng = np.random.default_rng(12)
    _, _, variances = clustered_tokens(rng)
    truth = isoscore_of_eigenvalues(variances)  # offsets' and noise's variances add: (0.36 + 0.64) scales^2
    covered = 0
    for r in range(REPLICATES):
        tokens, unit_of_row, _ = clustered_tokens(rng, n_units=100)
        measure = bs.SampleBuilt(1, 100, drawn_isoscore(tokens, unit_of_row))
        got = bs.interval(measure, samples=bs.DEFAULT_SAMPLES, seed=r)
        covered += got.low <= truth <= got.high
    assert 0.93 <= covered / REPLICATES <= 0.97, covered
