"""The Multi-Bootstrap (Sellam et al. 2022, "The MultiBERTs: BERT Reproductions for Robustness Analysis"): confidence
intervals and paired tests for a measure of a training procedure, resampling its seeds and the evaluation examples
together, as google-research/language's language/multiberts/multibootstrap.py does.

A seed is one model of the procedure (one checkpoint per step); a unit is one resampling unit of the evaluation
sample (a sequence), the same units for every seed. A replicate draws n_units units with replacement (the same draw
for every seed and both sides of a comparison) and n_seeds seeds with replacement; its score is the mean over the
drawn seeds of each seed's measure on the drawn units. A measure is given one of two ways:

- `SumBuilt`: a function of sums over units. Each seed holds its per-unit statistics (units x k); a draw weights
  each unit by how often it is drawn (multinomial counts), so the measure is recomputed from the weighted sums
  without the data, and the counts of the full sample (every unit once) give the full-sample value.
- `SampleBuilt`: a function of the drawn units themselves (a seed's sampled tokens of those units), for measures
  that no sums determine (IsoScore, spectra, CKA).

The point estimate is the mean over seeds of each seed's full-sample value (the reference's score on the
unresampled data); the interval is the percentile interval of the replicates' scores; the p-value of a difference
is two-sided: twice the smaller share of replicate differences on either side of 0 (each share at least 1 / B, as
the reference floors its one-sided p), at most 1. Replicate r of a given `seed` draws the same units whatever the
measure, step or group, so that intervals of different steps and layers rest on the same draws.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

DEFAULT_LEVEL = 0.95
DEFAULT_SAMPLES = 1000
#: at most this many drawn unit indices are held at once (B is drawn and scored in blocks of replicates)
BLOCK_ELEMENTS = 1 << 20
MAX_BLOCK = 1024

Design = Literal["paired", "unpaired"]


def _labels(seeds: Sequence[str] | None, n: int, what: str) -> tuple[str, ...]:
    if seeds is None:
        return tuple(str(i) for i in range(n))
    labels = tuple(str(s) for s in seeds)
    if len(labels) != n:
        raise ValueError(f"{what}: {len(labels)} seed names for {n} seeds; name each seed once")
    if len(set(labels)) != n:
        raise ValueError(f"{what}: seed names repeat ({list(labels)}); name each seed once")
    return labels


def _check_units(n_units: int, what: str) -> None:
    if n_units < 2:
        raise ValueError(f"{what}: {n_units} unit(s); resampling needs at least 2 units (sequences)")


@dataclass(frozen=True)
class SumBuilt:
    """A measure built from sums over units: `per_unit` (seeds x units x k) holds each seed's per-unit statistics,
    `of_sums` maps weighted sums of shape (..., k) to the measure, shape (...) (e.g. entropy per token:
    ``lambda s: s[..., 0] / s[..., 1]`` over per-unit entropy sums and token counts)."""

    per_unit: np.ndarray
    of_sums: Callable[[np.ndarray], np.ndarray]
    seeds: tuple[str, ...]

    def __init__(self, per_unit, of_sums, seeds: Sequence[str] | None = None):
        stats = np.asarray(per_unit, dtype=np.float64)
        if stats.ndim == 2:
            stats = stats[:, :, None]
        if stats.ndim != 3 or 0 in stats.shape:
            raise ValueError(
                f"per-unit statistics: expected an array of seeds x units x statistics, got shape {stats.shape}"
            )
        _check_units(stats.shape[1], "per-unit statistics")
        if not np.isfinite(stats).all():
            raise ValueError("per-unit statistics: not all finite; a unit's sums must be numbers")
        object.__setattr__(self, "per_unit", stats)
        object.__setattr__(self, "of_sums", of_sums)
        object.__setattr__(self, "seeds", _labels(seeds, stats.shape[0], "per-unit statistics"))

    @property
    def n_units(self) -> int:
        return self.per_unit.shape[1]

    def values(self, block: Draws, wanted: np.ndarray) -> np.ndarray:
        """(draws x seeds) values of every seed on each of the block's draws of units."""
        return self.of_weights(block.counts)

    def of_weights(self, weights: np.ndarray) -> np.ndarray:
        """(draws x seeds) values of every seed with its units weighted by `weights` (draws x units)."""
        sums = np.tensordot(weights, self.per_unit, axes=([1], [1]))  # draws x seeds x k
        out = np.asarray(self.of_sums(sums), dtype=np.float64)
        if out.shape != sums.shape[:2]:
            raise ValueError(
                f"of_sums must map sums of shape (..., k) to shape (...): sums {sums.shape} gave {out.shape}"
            )
        return out


@dataclass(frozen=True)
class SampleBuilt:
    """A measure of the drawn units themselves: `of_units(seed, units)` is seed `seed`'s (its position in `seeds`)
    measure on each row of `units` (draws x n_units unit indices, a unit as often as drawn), shape (draws,).
    `one_at_a_time` makes one from a function of a single draw; `rows_of_units` gives a draw's sampled rows."""

    seeds: tuple[str, ...]
    n_units: int
    of_units: Callable[[int, np.ndarray], np.ndarray]

    def __init__(self, seeds: int | Sequence[str], n_units: int, of_units):
        n_seeds = seeds if isinstance(seeds, int) else len(seeds)
        if n_seeds < 1:
            raise ValueError("a sample-built measure needs at least one seed")
        _check_units(n_units, "sample-built measure")
        object.__setattr__(self, "seeds", _labels(None if isinstance(seeds, int) else seeds, n_seeds, "measure"))
        object.__setattr__(self, "n_units", int(n_units))
        object.__setattr__(self, "of_units", of_units)

    def values(self, block: Draws, wanted: np.ndarray) -> np.ndarray:
        """(draws x seeds) values on the block's draws of units, computed only where `wanted` (draws x seeds) is
        True, NaN elsewhere."""
        out = np.full(wanted.shape, np.nan)
        for seed in range(wanted.shape[1]):
            rows = np.flatnonzero(wanted[:, seed])
            if rows.size:
                got = np.asarray(self.of_units(seed, block.units[rows]), dtype=np.float64)
                if got.shape != rows.shape:
                    raise ValueError(f"of_units must give one value per draw: {rows.size} draws gave {got.shape}")
                out[rows, seed] = got
        return out


Measure = SumBuilt | SampleBuilt


def one_at_a_time(fn: Callable[[int, np.ndarray], float]) -> Callable[[int, np.ndarray], np.ndarray]:
    """`SampleBuilt.of_units` from fn(seed, units) of one draw (units: n_units unit indices)."""
    return lambda seed, units: np.array([fn(seed, draw) for draw in units], dtype=np.float64)


def rows_of_units(unit_of_row: np.ndarray, units: np.ndarray) -> np.ndarray:
    """Indices of the rows (sampled tokens) whose unit is in `units`, a unit's rows as often as it is drawn, in the
    order of `units` (each unit's rows in their own order)."""
    unit_of_row = np.asarray(unit_of_row)
    order = np.argsort(unit_of_row, kind="stable")
    n = int(max(unit_of_row.max(initial=-1), np.max(units, initial=-1))) + 1
    per_unit = np.bincount(unit_of_row, minlength=n)
    starts = np.concatenate([[0], np.cumsum(per_unit)[:-1]])
    lengths = per_unit[units]
    first = np.repeat(starts[units] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return order[first + np.arange(lengths.sum())]


def unit_counts(units: np.ndarray, n_units: int) -> np.ndarray:
    """(draws x n_units) float counts: how often each unit is in each draw (a multinomial weight)."""
    draws = units.shape[0]
    flat = (units + n_units * np.arange(draws)[:, None]).ravel()
    return np.bincount(flat, minlength=draws * n_units).reshape(draws, n_units).astype(np.float64)


@dataclass(frozen=True)
class Draws:
    """One block of replicates: `units` (b x n_units) unit indices, `base` and `other` (b x seeds) seed positions.
    A block can be kept and given to `replicates` for every measure of a group, its counts computed once."""

    units: np.ndarray
    base: np.ndarray
    other: np.ndarray | None = None

    @cached_property
    def counts(self) -> np.ndarray:
        """(b x n_units) float counts: how often each unit is in each draw (a multinomial weight)."""
        return unit_counts(self.units, self.units.shape[1])


def draws(
    n_units: int,
    n_base: int,
    n_other: int | None = None,
    *,
    design: Design = "paired",
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
) -> Iterator[Draws]:
    """`samples` replicates in blocks of at most BLOCK_ELEMENTS drawn units. Block i draws from the generator
    seeded [seed, i]: units first, then the base's seeds, then (unpaired) the other's, so the units a replicate
    draws depend only on `seed`, `n_units` and its index (not on B, the seeds or the design)."""
    if samples < 1:
        raise ValueError(f"samples (B) must be at least 1, got {samples}")
    if design == "paired" and n_other not in (None, n_base):
        raise ValueError(f"a paired design needs the same seeds on both sides: {n_base} against {n_other}")
    block = max(1, min(MAX_BLOCK, BLOCK_ELEMENTS // n_units))
    for i, start in enumerate(range(0, samples, block)):
        b = min(block, samples - start)
        rng = np.random.default_rng([seed, i])
        units = rng.integers(0, n_units, size=(b, n_units))
        base = rng.integers(0, n_base, size=(b, n_base))
        if n_other is None:
            yield Draws(units, base)
        else:
            yield Draws(units, base, base if design == "paired" else rng.integers(0, n_other, size=(b, n_other)))


def _scores(measure: Measure, block: Draws, seeds: np.ndarray) -> np.ndarray:
    wanted = np.zeros((seeds.shape[0], len(measure.seeds)), dtype=bool)
    np.put_along_axis(wanted, seeds, True, axis=1)
    return seed_means(measure.values(block, wanted), seeds)


def seed_means(values: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """Each replicate's score: the mean of `values` (draws x seeds: each seed's measure on the draw's units) over the
    draw's seeds (`seeds`, draws x drawn seed positions)."""
    return np.take_along_axis(values, seeds, axis=1).mean(axis=1)


def replicates(base: Measure, other: Measure | None, blocks: Iterable[Draws]) -> tuple[np.ndarray, np.ndarray | None]:
    """Each replicate's score of `base` (and of `other`, on the same units), over all blocks."""
    got_base, got_other = [], []
    for block in blocks:
        if block.units.shape[1] != base.n_units:
            raise ValueError(f"draws of {block.units.shape[1]} units for a measure of {base.n_units} units")
        got_base.append(_scores(base, block, block.base))
        if other is not None:
            got_other.append(_scores(other, block, block.other))
    return np.concatenate(got_base), (np.concatenate(got_other) if other is not None else None)


def estimate(measure: Measure) -> float:
    """Mean over seeds of each seed's full-sample value (every unit once)."""
    all_seeds = np.arange(len(measure.seeds))[None, :]
    return float(_scores(measure, Draws(np.arange(measure.n_units)[None, :], all_seeds), all_seeds)[0])


def percentile_interval(samples: np.ndarray, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """The (1 - level) / 2 and 1 - (1 - level) / 2 quantiles (linear interpolation, as np.quantile's default)."""
    _check_level(level)
    low, high = np.quantile(samples, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(low), float(high)


def two_sided_p(differences: np.ndarray) -> float:
    """2 min(P(d <= 0), P(d >= 0)) over the replicates' differences, each share at least 1 / B, at most 1."""
    floor = 1.0 / len(differences)
    below = max(float(np.mean(differences <= 0)), floor)
    above = max(float(np.mean(differences >= 0)), floor)
    return min(1.0, 2.0 * min(below, above))


def _check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"confidence level must lie strictly between 0 and 1 (0.95 for 95%), got {level}")


@dataclass(frozen=True)
class Interval:
    """A measure's estimate over seeds and its percentile interval. design: 'seeds and units' (several seeds) or
    'units' (one model: the example-level interval). undefined: replicates where the measure is NaN (then the
    interval is NaN)."""

    estimate: float
    low: float
    high: float
    level: float
    n_seeds: int
    n_units: int
    samples: int
    undefined: int
    design: str


@dataclass(frozen=True)
class Difference:
    """other - base: the difference of the estimates, its percentile interval and two-sided p-value. design:
    'paired' (same seeds drawn on both sides) or 'unpaired' (seeds drawn independently); units are shared in both."""

    base: float
    other: float
    difference: float
    low: float
    high: float
    p: float
    level: float
    n_seeds_base: int
    n_seeds_other: int
    n_units: int
    samples: int
    undefined: int
    design: str


def interval(
    measure: Measure, *, level: float = DEFAULT_LEVEL, samples: int = DEFAULT_SAMPLES, seed: int = 0
) -> Interval:
    """The Multi-Bootstrap interval of one measure (a group's seeds at one step, or one model alone)."""
    _check_level(level)
    scores, _ = replicates(measure, None, draws(measure.n_units, len(measure.seeds), samples=samples, seed=seed))
    return summarise(measure, scores, level)


def summarise(measure: Measure, scores: np.ndarray, level: float = DEFAULT_LEVEL) -> Interval:
    """An `Interval` from the replicates' scores of `measure`."""
    undefined = int(np.isnan(scores).sum())
    low, high = percentile_interval(scores, level) if not undefined else (float("nan"), float("nan"))
    n_seeds = len(measure.seeds)
    return Interval(
        estimate(measure),
        low,
        high,
        level,
        n_seeds,
        measure.n_units,
        len(scores),
        undefined,
        "seeds and units" if n_seeds > 1 else "units",
    )


def compare(
    base: Measure,
    other: Measure,
    *,
    design: Design,
    level: float = DEFAULT_LEVEL,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
) -> Difference:
    """The Multi-Bootstrap test of other - base on shared units. 'paired': the same seeds (by name, in the same
    order) on both sides, drawn once for both, as a step against another step of one group, or two groups of the
    same seeds; 'unpaired': each side's seeds drawn on their own, as two groups of independent seeds."""
    _check_level(level)
    _check_comparable(base, other, design)
    blocks = draws(base.n_units, len(base.seeds), len(other.seeds), design=design, samples=samples, seed=seed)
    got_base, got_other = replicates(base, other, blocks)
    return difference(base, other, got_base, got_other, design, level)


def _check_comparable(base: Measure, other: Measure, design: str) -> None:
    if design not in ("paired", "unpaired"):
        raise ValueError(f"design must be 'paired' or 'unpaired', got {design!r}")
    if base.n_units != other.n_units:
        raise ValueError(
            f"the two sides must be measured on the same units (sequences): {base.n_units} against {other.n_units}"
        )
    if design == "paired" and base.seeds != other.seeds:
        raise ValueError(
            f"a paired design needs the same seeds in the same order on both sides: {list(base.seeds)} against "
            f"{list(other.seeds)}; use design='unpaired' for independent seeds"
        )


def difference(
    base: Measure, other: Measure, got_base: np.ndarray, got_other: np.ndarray, design: str, level: float
) -> Difference:
    """A `Difference` from both sides' replicate scores (drawn on the same units)."""
    deltas = got_other - got_base
    undefined = int(np.isnan(deltas).sum())
    if undefined:
        low = high = p = float("nan")
    else:
        low, high = percentile_interval(deltas, level)
        p = two_sided_p(deltas)
    b, o = estimate(base), estimate(other)
    return Difference(
        b,
        o,
        o - b,
        low,
        high,
        p,
        level,
        len(base.seeds),
        len(other.seeds),
        base.n_units,
        len(deltas),
        undefined,
        design,
    )


def step_pairs(steps: Sequence[int]) -> list[tuple[int, int]]:
    """The default step comparisons: each step against the previous one and against the final one (once each)."""
    ordered = sorted(set(steps))
    pairs = list(zip(ordered, ordered[1:]))
    pairs += [(s, ordered[-1]) for s in ordered[:-2]]
    return pairs
