"""The phases rule (anisweep.measures.phases) on synthetic curves with known turns, on flat and monotone curves and on
too few steps, and phases.parquet from a sweep: per layer and site, the model's summary curve, statuses left out."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from anisweep.measures import phases
from anisweep.measures.phases import curve_phases, measured_legs, model_phases, running_median, turns
from anisweep.schema import defaults

GRID = np.array([0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000])
#: RankMe that collapses to step 8, expands to step 128, then compresses (Li et al.'s three phases)
THREE_PHASES = np.array([40.0, 33, 26, 20, 14, 22, 31, 40, 46, 41, 37, 35])


def named(rows: list[dict]) -> list[tuple]:
    return [(r["phase"], r["start_step"], r["end_step"], r["ends_at_turn"]) for r in rows]


def test_three_phases_turn_where_planted():
    rows = curve_phases(GRID, THREE_PHASES, 1, smooth=1, tolerance=0.05, min_steps=5)
    assert named(rows) == [
        ("warmup", 0, 8, True),
        ("entropy_seeking", 8, 128, True),
        ("compression_seeking", 128, 1000, False),
    ]
    assert [r["phase_index"] for r in rows] == [0, 1, 2]
    assert rows[0]["start_value"] == 40.0 and rows[1]["start_value"] == 14.0 and rows[2]["start_value"] == 46.0
    assert rows[0]["delta"] == pytest.approx(0.05 * np.median(running_median(THREE_PHASES, 1)))


def test_alpha_req_reads_the_other_way():
    """alpha-ReQ rises as the spectrum concentrates: the mirrored curve has the same phases."""
    rows = curve_phases(GRID, 3.0 - THREE_PHASES / 40, -1, smooth=1, tolerance=0.05, min_steps=5)
    assert [r["phase"] for r in rows] == ["warmup", "entropy_seeking", "compression_seeking"]
    assert [r["end_step"] for r in rows] == [8, 128, 1000]


def test_no_smoothing_finds_the_same_turns():
    rows = curve_phases(GRID, THREE_PHASES, 1, smooth=0, tolerance=0.05, min_steps=5)
    assert [r["end_step"] for r in rows] == [8, 128, 1000]


def test_a_turn_is_the_measured_extreme_not_the_smoothed_one():
    """A sharp V: the running median lifts its bottom to a neighbour's value (a tie between two steps); the turn is
    still the step where the measured curve is lowest."""
    values = np.array([40.0, 36, 32, 28, 24, 10, 26, 30, 34, 38, 42, 44])
    smoothed = running_median(values, 1)
    assert smoothed[4] == smoothed[5]  # the tie the refinement resolves
    rows = curve_phases(GRID, values, 1, smooth=1, tolerance=0.05, min_steps=5)
    assert [r["end_step"] for r in rows] == [16, 1000]
    assert [r["phase"] for r in rows] == ["warmup", "entropy_seeking"]


def test_one_outlying_checkpoint_makes_no_turns_when_smoothed():
    values = np.linspace(40, 20, 12)
    values[6] += 8  # one checkpoint measured high
    assert named(curve_phases(GRID, values, 1, smooth=1, tolerance=0.05, min_steps=5)) == [("warmup", 0, 1000, False)]
    unsmoothed = curve_phases(GRID, values, 1, smooth=0, tolerance=0.05, min_steps=5)
    assert [r["phase"] for r in unsmoothed] == ["warmup", "entropy_seeking", "compression_seeking"]


def test_wiggles_below_the_tolerance_do_not_flicker():
    rng = np.random.default_rng(0)
    noisy = THREE_PHASES * (1 + 0.01 * rng.standard_normal(len(GRID)))
    assert [r["end_step"] for r in curve_phases(GRID, noisy, 1, 1, 0.05, 5)] == [8, 128, 1000]
    flat = 30 * (1 + 0.01 * rng.standard_normal(len(GRID)))
    (row,) = curve_phases(GRID, flat, 1, 1, 0.05, 5)
    assert "phase" not in row and row["reason"].startswith("no phase: the curve moves less than delta")


def test_a_wiggle_before_the_first_move_of_delta_makes_no_phase():
    """The first leg takes the direction in which the curve first moves delta (1.61) away from its first value: the
    rise to 31.4 (1.4) and the dip to 29.6 (0.4 below the start) are wiggles, and the curve spreads from its first
    step."""
    values = np.array([30.0, 30, 31.4, 31.4, 29.6, 29.6, 33, 36, 40, 44, 48, 50])
    rows = curve_phases(GRID, values, 1, smooth=1, tolerance=0.05, min_steps=5)
    assert named(rows) == [("entropy_seeking", 0, 1000, False)]
    assert rows[0]["delta"] == pytest.approx(1.61)


def test_a_curve_that_never_moves_delta_from_its_first_value_has_no_phase():
    """Its range (2.2) is over delta (1.5), but no value is delta away from the first: every move is a wiggle."""
    values = np.array([30.0, 31.1, 29.0, 31.1, 29.0, 31.1, 29.0, 31.1, 29.0, 31.1, 29.0, 30.0])
    (row,) = curve_phases(GRID, values, 1, smooth=0, tolerance=0.05, min_steps=5)
    assert "phase" not in row
    assert row["reason"] == (
        "no phase: the curve moves less than delta = 1.5 (phases.tolerance 0.05 of its median) away from its first"
        " value"
    )


def test_no_phase_spans_no_step():
    """Turns of the smoothed curve one step apart: each bound stays after the one before it and before the next
    turn, and legs the measured values move across the same way are one phase."""
    rows = curve_phases(
        np.arange(6), np.array([9.7, 7.8, 7.1, 9.1, 9.3, 7.9]), 1, smooth=2, tolerance=0.05, min_steps=5
    )
    assert named(rows) == [
        ("warmup", 0, 2, True),
        ("entropy_seeking", 2, 4, True),
        ("compression_seeking", 4, 5, False),
    ]


def moves_as_named(rows: list[dict], steps: np.ndarray, spreads: int) -> list[str]:
    """What breaks the rule's promises: the phases tile the steps, each spans a step, their names alternate, and
    each moves from its start value to its end value the way its name says."""
    if "phase" not in rows[0]:
        return []
    broken = []
    if (rows[0]["start_step"], rows[-1]["end_step"]) != (steps[0], steps[-1]):
        broken.append("not from the first step to the last")
    for before, after in zip(rows, rows[1:]):
        if before["end_step"] != after["start_step"]:
            broken.append(f"a gap at {before['end_step']}")
        if (before["phase"] == "entropy_seeking") == (after["phase"] == "entropy_seeking"):
            broken.append(f"two phases the same way at {before['end_step']}")
    for row in rows:
        if row["start_step"] >= row["end_step"]:
            broken.append(f"{row['phase']} spans no step at {row['start_step']}")
        move = spreads * (row["end_value"] - row["start_value"])
        if (move <= 0) if row["phase"] == "entropy_seeking" else (move >= 0):
            broken.append(f"{row['phase']} {row['start_step']}->{row['end_step']} moves against its name")
    return broken


def test_every_phase_spans_a_step_and_moves_as_its_name_says():
    """Short noisy curves at every smoothing: where the measured curve contradicts the smoothed one, phases merge
    rather than run backwards or shrink to one step."""
    rng = np.random.default_rng(2)
    broken = []
    for trial in range(600):
        n, smooth, spreads = int(rng.integers(5, 16)), int(rng.integers(0, 4)), int(rng.choice([-1, 1]))
        values = [30 + 10 * rng.standard_normal(n), 30 + np.cumsum(rng.standard_normal(n))][trial % 2]
        steps = np.arange(n) * 10
        rows = curve_phases(steps, values, spreads, smooth, tolerance=0.05, min_steps=5)
        broken += [f"{values.round(2).tolist()} smooth {smooth}: {b}" for b in moves_as_named(rows, steps, spreads)]
    assert not broken, broken[:5]


def test_the_phases_are_descriptive_pure_noise_has_them_too():
    """No noise guard: the docs and the figure say so, and a guard added to the rule would have to change both."""
    noise = 30 + 10 * np.random.default_rng(3).standard_normal(len(GRID))
    assert len([row for row in curve_phases(GRID, noise, 1, 1, 0.05, 5) if "phase" in row]) > 1


def test_legs_the_measured_curve_moves_across_the_same_way_are_one_phase():
    raw = np.array([0.0, 5, 6, 3, 3, 4])
    assert measured_legs(raw, [0, 1, 2, 3, 4, 5]) == [(0, 2, 1), (2, 4, -1), (4, 5, 1)]  # 3 -> 3 joins the fall
    assert measured_legs(np.array([1.0, 1, 2]), [0, 1, 2]) == [(0, 2, 1)]  # a flat first leg joins the next
    assert measured_legs(np.array([1.0, 1, 1]), [0, 1, 2]) == []  # no move at all: no phase


@pytest.mark.parametrize(
    ("values", "phase"),
    [(np.linspace(40, 10, 12), "warmup"), (np.linspace(10, 40, 12), "entropy_seeking")],
)
def test_a_monotone_curve_is_one_phase_to_the_last_step(values, phase):
    assert named(curve_phases(GRID, values, 1, 1, 0.05, 5)) == [(phase, 0, 1000, False)]


def test_a_flat_curve_has_no_phase():
    (row,) = curve_phases(GRID, np.full(12, 30.0), 1, 1, 0.05, 5)
    assert "phase" not in row and "moves less than delta = 1.5" in row["reason"]


def test_too_few_steps_is_a_reason_not_an_error():
    (row,) = curve_phases(GRID[:4], THREE_PHASES[:4], 1, 1, 0.05, 5)
    assert row["reason"] == (
        "not enough steps: 4 analysed step(s) with a finite value, the rule needs phases.min_steps = 5"
    )
    values = THREE_PHASES.copy()
    values[1:9] = np.nan  # NaN steps do not count
    (row,) = curve_phases(GRID, values, 1, 1, 0.05, 5)
    assert row["reason"].startswith("not enough steps: 4 ")


def test_the_zigzag_against_a_brute_force_definition():
    """Every turn is an extreme of its leg, and the curve moves back from it by at least delta before the next."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        values = np.cumsum(rng.standard_normal(30))
        found, first = turns(values, 1.5)
        bounds = [0, *found, len(values) - 1]
        sign = first
        moved = np.flatnonzero(np.abs(values - values[0]) >= 1.5)  # the first leg's direction: its first such move
        assert first == (np.sign(values[moved[0]] - values[0]) if moved.size else 0)
        for start, turn, after in zip(bounds, bounds[1:], bounds[2:]):
            leg = values[start : turn + 1]
            assert values[turn] == (leg.max() if sign > 0 else leg.min())
            assert (sign * (values[turn] - values[turn : after + 1])).max() >= 1.5
            sign = -sign


def test_defaults_are_the_schemas():
    assert phases.DEFAULTS == defaults("phases")


def sweep_of(curves: dict[tuple[str, int, str], np.ndarray], status: dict[int, str] | None = None) -> pl.DataFrame:
    rows = []
    for (metric, layer, site), values in curves.items():
        for step, value in zip(GRID, values):
            rows.append(
                {
                    "family": "toy",
                    "model": "toy-neox",
                    "seed": 0,
                    "step": int(step),
                    "tokens_seen": int(step) * 100,
                    "layer": layer,
                    "head": None,
                    "site": site,
                    "metric": metric,
                    "value": float(value),
                    "status": (status or {}).get(int(step), "ok"),
                }
            )
    return pl.DataFrame(rows)


def test_phases_table_per_layer_and_for_the_model():
    curves = {
        ("rankme", 0, "resid"): np.linspace(10, 40, 12),
        ("rankme", 1, "resid"): THREE_PHASES,
        ("rankme", 1, "final_ln_out"): THREE_PHASES * 1.1,
        ("alpha_req", 1, "final_ln_out"): 3.0 - THREE_PHASES / 40,
        ("avg_cos", 1, "resid"): THREE_PHASES,  # not a metric of the rule
    }
    table = model_phases(sweep_of(curves), {"smooth": 1, "tolerance": 0.05, "min_steps": 5})
    assert set(table["metric"]) == {"rankme", "alpha_req", "rankme_cov"}
    layer0 = table.filter((pl.col("scope") == "layer") & (pl.col("layer") == 0))
    assert layer0["phase"].to_list() == ["entropy_seeking"]
    model = table.filter((pl.col("scope") == "model") & (pl.col("metric") == "rankme"))
    assert model.select("layer", "site").unique().rows() == [(1, "final_ln_out")]
    assert model["phase"].to_list() == ["warmup", "entropy_seeking", "compression_seeking"]
    assert model["end_tokens_seen"].to_list() == [800, 12800, 100000]
    assert model["n_steps"].to_list() == [12, 12, 12]
    (missing,) = table.filter(pl.col("metric") == "rankme_cov").rows(named=True)
    assert missing["scope"] == "model" and missing["reason"] == "the sweep has no rankme_cov rows"
    assert table.schema == pl.Schema(phases.PHASES_SCHEMA)


def test_the_model_falls_back_to_the_last_layers_stream():
    curves = {("rankme", layer, "resid"): THREE_PHASES + layer for layer in range(3)}
    model = model_phases(sweep_of(curves)).filter((pl.col("scope") == "model") & (pl.col("metric") == "rankme"))
    assert model.select("layer", "site").unique().rows() == [(2, "resid")]


def test_steps_the_figures_leave_out_are_left_out():
    """A duplicate or non-finite checkpoint is not a training step: with it gone, too few steps remain."""
    status = {int(s): "duplicate" for s in GRID[4:]}
    table = model_phases(sweep_of({("rankme", 1, "resid"): THREE_PHASES}, status))
    assert table.filter(pl.col("scope") == "layer")["reason"].to_list() == [
        "not enough steps: 4 analysed step(s) with a finite value, the rule needs phases.min_steps = 5"
    ]


def test_the_glossary_names_every_phase_and_column():
    from anisweep.measures.glossary import PHASE_COLUMNS, PHASES

    columns = [name for term in PHASE_COLUMNS for name in term.name.split(", ")]
    assert columns == list(phases.PHASES_SCHEMA)
    assert [term.name for term in PHASES] == [phases.WARMUP, phases.ENTROPY_SEEKING, phases.COMPRESSION_SEEKING]


def test_the_glossary_credits_rankme_cov_to_rankme():
    """rankme_cov is RankMe (Garrido et al.) as Li et al.'s code computes it, not alpha-ReQ."""
    from anisweep.measures.glossary import METRICS

    (term,) = [term for term in METRICS if term.name == "rankme_cov"]
    assert term.source.startswith("Garrido et al. 2023 (RankMe)") and "utils/powerlaw.py" in term.source
    assert "alpha-ReQ" not in term.source
