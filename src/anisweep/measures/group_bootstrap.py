"""One group of seeds against another at the steps they share (the Multi-Bootstrap's test of two training procedures,
anisweep.measures.bootstrap): per metric, layer, site and step, the difference other - base of the groups' estimates,
its percentile interval and two-sided p-value, from both groups' hidden.parquet and extract.json alone.

Both groups are resampled on the same draws of sequences (bootstrap.draws with both sides' seeds: the units are
those every model's and group's table of the same `seed` draws). The design is named in each row: `paired` draws one
set of seed positions for both sides (seed i of the base with seed i of the other: two recipes run from the same
initial seeds), `unpaired` draws each side's seeds on their own (independent runs). Where settings.compared names
comparisons of two steps (CKA, SVCCA, PWCCA: pair_bootstrap), their differences too: each step's comparison with the
previous and the final step (`pair`, `ref_step`), each side's seeds resampled seed by seed
(sample_bootstrap.seed_comparisons) on the same draws.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from anisweep.measures import bootstrap
from anisweep.measures.sample_bootstrap import (
    BootstrapInputError,
    Checkpoint,
    Key,
    Settings,
    check_same_sample,
    read_checkpoint,
    seed_comparisons,
    seed_scores,
    step_measures,
)

SCHEMA = {
    "comparison": pl.String,
    "base_group": pl.String,
    "other_group": pl.String,
    "base_models": pl.List(pl.String),
    "other_models": pl.List(pl.String),
    "family": pl.String,
    "model": pl.String,
    "seed": pl.Int64,
    "step": pl.Int64,
    "tokens_seen": pl.Int64,
    "other_tokens_seen": pl.Int64,
    "layer": pl.Int64,
    "site": pl.String,
    "head": pl.Int64,
    "metric": pl.String,
    "against": pl.String,
    "pair": pl.String,
    "ref_step": pl.Int64,
    "estimate": pl.Float64,
    "base_estimate": pl.Float64,
    "other_estimate": pl.Float64,
    "low": pl.Float64,
    "high": pl.Float64,
    "bias": pl.Float64,
    "p": pl.Float64,
    "level": pl.Float64,
    "n_seeds_base": pl.Int64,
    "n_seeds_other": pl.Int64,
    "n_units": pl.Int64,
    "samples": pl.Int64,
    "undefined": pl.Int64,
    "design": pl.String,
}


@dataclass(frozen=True)
class Sides:
    """One (metric, layer, site, head) at one step: each group's measure (its seeds' checkpoints) and estimate, on
    `n_units` units."""

    key: Key
    base: bootstrap.Measure
    other: bootstrap.Measure
    base_estimate: float
    other_estimate: float
    n_units: int


def sides_of(
    base: Sequence[Checkpoint],
    other: Sequence[Checkpoint],
    folders: tuple[Sequence, Sequence],
    settings: Settings,
) -> Iterator[Sides]:
    """Every measure of `settings` (sample_bootstrap.step_measures: the sampled vectors' and the sums') of both
    groups at one step; `folders`, each side's checkpoint folders of the step."""
    base_measures = step_measures(base, folders[0], [c.name for c in base], settings)
    other_measures = {m.key: m for m in step_measures(other, folders[1], [c.name for c in other], settings)}
    for b in base_measures:
        o = other_measures.get(b.key)
        if o is None or o.n_units != b.n_units:
            raise BootstrapInputError(
                f"{b.key}: the other group has {'no such measure' if o is None else f'{o.n_units} units'} where the "
                f"base has {b.n_units} units: both groups' models must be of one shape and extract settings"
            )
        yield Sides(b.key, b.measure, o.measure, b.estimate, o.estimate, b.n_units)


def _check_sides(base: Sequence[Sequence], other: Sequence[Sequence], design: str) -> None:
    if design not in ("paired", "unpaired"):
        raise BootstrapInputError(f"design {design!r}: 'paired' (seed i against seed i) or 'unpaired'")
    for side, seeds in (("base", base), ("other", other)):
        if not seeds or not all(seeds):
            raise BootstrapInputError(f"the {side} group has no checkpoints: give each seed's checkpoint folders")
    lengths = {len(folders) for folders in [*base, *other]}
    if len(lengths) != 1:
        raise BootstrapInputError(
            f"every seed of both groups needs the same steps: {[len(f) for f in base]} checkpoints per base seed, "
            f"{[len(f) for f in other]} per other seed"
        )
    if design == "paired" and len(base) != len(other):
        raise BootstrapInputError(
            f"a paired design pairs seed i of the base with seed i of the other: {len(base)} against {len(other)} "
            "seeds; give both groups the same number of seeds, or use the unpaired design for independent seeds"
        )


def _step_of(checkpoints: Sequence[Checkpoint], labels: list[str] | None, side: str) -> int:
    names = [c.name for c in checkpoints]
    if labels is not None and names != labels:
        raise BootstrapInputError(f"each step's {side} checkpoints must be its seeds in one order: {labels}")
    steps = sorted({c.step for c in checkpoints})
    if len(steps) != 1:
        raise BootstrapInputError(f"one step's {side} checkpoints are of steps {steps}")
    return steps[0]


def comparison_table(
    base: Sequence[Sequence[str | Path]],
    other: Sequence[Sequence[str | Path]],
    *,
    design: str = "unpaired",
    settings: Settings | None = None,
    name: str | None = None,
    base_group: str | None = None,
    other_group: str | None = None,
) -> pl.DataFrame:
    """other - base at each shared step: `base` and `other` one list of checkpoint folders per seed, every seed's
    folders of the same steps in the same order on both sides. Reads one step's checkpoints at a time."""
    settings = settings or Settings()
    _check_sides(base, other, design)
    blocks, reference, base_labels, other_labels = {}, None, None, None
    rows, identities = [], {}
    for base_folders, other_folders in zip(zip(*base), zip(*other)):
        base_cps = [read_checkpoint(folder, settings.sampled) for folder in base_folders]
        other_cps = [read_checkpoint(folder, settings.sampled) for folder in other_folders]
        reference = reference or base_cps[0]
        step = _step_of(base_cps, base_labels, "base")
        if _step_of(other_cps, other_labels, "other") != step:
            raise BootstrapInputError(
                f"the base group's checkpoints of step {step} are compared with the other's of step "
                f"{other_cps[0].step}: give both groups' folders of the same steps in the same order"
            )
        base_labels, other_labels = [c.name for c in base_cps], [c.name for c in other_cps]
        for c in (*base_cps, *other_cps):
            check_same_sample(reference, c)
        identity = {
            "step": step,
            "tokens_seen": base_cps[0].tokens_seen,
            "other_tokens_seen": other_cps[0].tokens_seen,
        }
        for sides in sides_of(base_cps, other_cps, (base_folders, other_folders), settings):
            if sides.n_units not in blocks:  # the same draws for every step, layer and measure of as many units
                blocks[sides.n_units] = list(
                    bootstrap.draws(
                        sides.n_units, len(base_cps), len(other_cps), design=design,
                        samples=settings.samples, seed=settings.seed,
                    )
                )  # fmt: skip
            got_base, got_other = bootstrap.replicates(sides.base, sides.other, blocks[sides.n_units])
            rows.append(identity | _difference_row(sides, got_other - got_base, settings.level))
        identities[step] = identity
    if settings.compared:
        rows += _pair_differences(base, other, identities, reference.n_units, design, settings)
    families = {label.split("/")[0] for label in [*base_labels, *other_labels]}
    common = {
        "comparison": name,
        "base_group": base_group,
        "other_group": other_group,
        "base_models": base_labels,
        "other_models": other_labels,
        "family": families.pop() if len(families) == 1 else None,
        "model": None,
        "seed": None,
        "against": "group",
        "level": settings.level,
        "n_seeds_base": len(base_labels),
        "n_seeds_other": len(other_labels),
        "samples": settings.samples,
        "design": design,
    }
    table = pl.DataFrame([common | row for row in rows], schema=SCHEMA)
    return table.sort("layer", "site", "metric", "head", "pair", "step", nulls_last=False)


def _pair_differences(base, other, identities: dict, n_units: int, design: str, settings: Settings) -> list[dict]:
    """The rows of the comparisons of two steps: other - base of each step's comparison with the previous and the
    final step, each side's seeds' values on the same draws of units, each side's seeds drawn as `design` says."""
    draws = list(
        bootstrap.draws(n_units, len(base), len(other), design=design, samples=settings.samples, seed=settings.seed)
    )

    def draws_of(units: int) -> list[bootstrap.Draws]:
        if units != n_units:
            raise BootstrapInputError(f"a comparison of two steps on {units} units where the groups have {n_units}")
        return draws

    sides = [[seed_comparisons(folders, settings, draws_of) for folders in group] for group in (base, other)]
    rows = []
    for key, (ref_step, _, _, units) in sides[0][0].items():
        metric, layer, site, step, against = key
        scores = [seed_scores(values, key, draws, side) for values, side in zip(sides, ("base", "other"))]
        estimates = [float(np.mean([seed[key][1] for seed in values])) for values in sides]
        pair = Sides((metric, layer, site, None), None, None, *estimates, units)
        row = _difference_row(pair, scores[1] - scores[0], settings.level)
        rows.append(identities[step] | row | {"pair": against, "ref_step": ref_step})
    return rows


def _difference_row(sides: Sides, deltas: np.ndarray, level: float) -> dict:
    metric, layer, site, head = sides.key
    undefined = int(np.isnan(deltas).sum())
    if undefined:
        low = high = p = np.nan
    else:
        low, high = bootstrap.percentile_interval(deltas, level)
        p = bootstrap.two_sided_p(deltas)
    return {
        "layer": layer,
        "site": site,
        "head": head,
        "metric": metric,
        "n_units": sides.n_units,
        "estimate": sides.other_estimate - sides.base_estimate,
        "bias": np.nan if undefined else float(np.mean(deltas)) - (sides.other_estimate - sides.base_estimate),
        "base_estimate": sides.base_estimate,
        "other_estimate": sides.other_estimate,
        "low": low,
        "high": high,
        "p": p,
        "undefined": undefined,
    }
