"""The phases of training that RankMe and alpha-ReQ trace (Li et al. 2025, "Tracing the Representation Geometry of
Language Models from Pretraining to Post-training", arXiv 2509.23024): a warm-up collapse, an entropy-seeking
expansion, then a compression-seeking consolidation, named from a model's sweep by a stated change-point rule.

Li et al. mark the phases by eye on their curves (their code, melodylizx/Tracing-the-representation-geometry-of-
language-models, plots the trajectories and names no boundary). The rule here, per curve (one metric at one layer and
site over the analysed steps, in step order):

1. Smooth: a running median over 2 * `smooth` + 1 neighbouring checkpoints (the window shrinks symmetrically at the
   ends, which stay as measured); it removes a single outlying checkpoint, which would otherwise make two turns.
2. Legs, a zigzag with hysteresis on the smoothed curve, delta = `tolerance` x the median of its absolute values:
   the first leg starts at the first step and takes the direction in which the curve first moves delta away from
   its first value (a wiggle smaller than delta before that is no turn); a leg ends at a turn, its farthest point,
   once the curve has moved back from it by at least delta, and the next leg starts there. Every leg but the last
   moves by at least delta; the last runs to the last step (`ends_at_turn` false).
3. Bounds: each turn's step is the measured curve's extreme among the checkpoints the median window spans around
   it, kept after the bound before it and before the next turn, so that every phase spans at least one step.
4. Names, from the direction the measured values move from a phase's first step to its last: RankMe falling
   (alpha-ReQ rising) is the spectrum concentrating, rising (falling) spreading. Neighbouring legs the measured
   values move across the same way are one phase, and a leg they do not move across at all joins the phase before
   it (the first leg, the one after): where the measured curve contradicts the smoothed one, no phase's start and
   end values move against its name. The first phase, if it concentrates, is `warmup`; afterwards a spreading phase
   is `entropy_seeking` and a concentrating one `compression_seeking` (Li et al. see the pair repeat in continued
   pretraining). A curve that spreads from the start has no warm-up on this grid.

The phases are descriptive: the rule reads a curve's shape and tests no turn against the checkpoints' noise (a curve of
pure noise gets phases too).

A curve with fewer than `min_steps` finite values, or one that never moves by delta, has one row without a phase
whose `reason` says so: never an error, and the other curves keep their rows.

The model as a whole is its last hidden state as Li et al. take it (`model.embed_out = nn.Identity()`: the output
of the final LayerNorm): the site `final_ln_out`, or where a model has none its last layer's `resid`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import polars as pl

from anisweep.measures.sweep import analysed

#: The metrics whose phases are named, and the sign of "spreading" for each: RankMe rises and alpha-ReQ falls as
#: the spectrum spreads. `rankme_cov` is RankMe as Li et al.'s code computes it (the covariance's eigenvalues).
METRICS = {"rankme": 1, "rankme_cov": 1, "alpha_req": -1}
WARMUP, ENTROPY_SEEKING, COMPRESSION_SEEKING = "warmup", "entropy_seeking", "compression_seeking"
MODEL_SITES = ("final_ln_out", "resid")  # the model's summary: the first of these its sweep has, at its last layer
DEFAULTS = {"smooth": 1, "tolerance": 0.05, "min_steps": 5}

PHASES_SCHEMA = {
    "family": pl.String,
    "model": pl.String,
    "seed": pl.Int64,
    "scope": pl.String,  # "layer": one layer and site; "model": the model's summary curve
    "layer": pl.Int64,
    "site": pl.String,
    "metric": pl.String,
    "phase_index": pl.Int64,
    "phase": pl.String,
    "start_step": pl.Int64,
    "end_step": pl.Int64,
    "start_tokens_seen": pl.Int64,
    "end_tokens_seen": pl.Int64,
    "start_value": pl.Float64,
    "end_value": pl.Float64,
    "ends_at_turn": pl.Boolean,
    "n_steps": pl.Int64,
    "delta": pl.Float64,
    "smooth": pl.Int64,
    "tolerance": pl.Float64,
    "min_steps": pl.Int64,
    "reason": pl.String,
}


def running_median(values: np.ndarray, smooth: int) -> np.ndarray:
    """The median of each value and its `smooth` neighbours on either side, fewer where the curve ends (the window
    stays centred: the first and last values are kept)."""
    n = len(values)
    half = [min(smooth, i, n - 1 - i) for i in range(n)]
    return np.array([np.median(values[i - h : i + h + 1]) for i, h in enumerate(half)])


def turns(values: np.ndarray, delta: float) -> tuple[list[int], int]:
    """(the indices of the turns, the direction of the first leg: 1 rising, -1 falling, 0 none) of a curve, by the
    zigzag anchored at its first value: the first leg takes the direction in which the curve first moves `delta`
    away from its first value; an extreme is a turn once the curve has moved back from it by at least `delta`."""
    direction, extreme, found = 0, 0, []
    first = 0
    for i, value in enumerate(values):
        if direction == 0:
            if abs(value - values[0]) >= delta:
                direction = first = 1 if value > values[0] else -1
                extreme = i
        elif direction * (value - values[extreme]) > 0:
            extreme = i
        elif direction * (values[extreme] - value) >= delta:
            found.append(extreme)
            direction, extreme = -direction, i
    return found, first


def located(raw: np.ndarray, found: list[int], first: int, smooth: int) -> list[int]:
    """The phases' bounds: the first index, each turn of the smoothed curve at the measured extreme (a maximum where
    the leg before it rises) within `smooth` checkpoints of it, after the bound before it and before the next turn,
    and the last index. The bounds strictly increase."""
    bounds, sign = [0], first
    for turn, after in zip(found, [*found[1:], len(raw) - 1]):
        low, high = max(turn - smooth, bounds[-1] + 1), min(turn + smooth, after - 1)
        bounds.append(low + int(np.argmax(sign * raw[low : high + 1])))
        sign = -sign
    return [*bounds, len(raw) - 1]


def measured_legs(raw: np.ndarray, bounds: list[int]) -> list[tuple[int, int, int]]:
    """(start, end, direction: 1 rising, -1 falling) of each phase between `bounds`, by the measured values at its
    ends: a leg the measured curve moves across the same way as the phase before it, or not at all, joins that
    phase; a first leg it does not move across joins the next. An empty list where it moves across none."""
    legs: list[list[int]] = []
    for start, end in zip(bounds, bounds[1:]):
        direction = int(np.sign(raw[end] - raw[start]))
        if legs and direction in (0, legs[-1][2]):
            legs[-1][1] = end
        elif legs and legs[-1][2] == 0:
            legs[-1][1:] = [end, direction]
        else:
            legs.append([start, end, direction])
    return [(start, end, direction) for start, end, direction in legs if direction]


def phase_name(index: int, spreading: bool) -> str:
    if spreading:
        return ENTROPY_SEEKING
    return WARMUP if index == 0 else COMPRESSION_SEEKING


def curve_phases(
    steps: np.ndarray, values: np.ndarray, spreads: int, smooth: int, tolerance: float, min_steps: int
) -> list[dict]:
    """The phases of one curve (`spreads`: +1 where a rise spreads the spectrum, -1 where a fall does): a dict per
    phase (phase_index, phase, start/end step and value, ends_at_turn, delta), or one dict with a `reason` and no
    phase."""
    order = np.argsort(steps)
    steps, values = np.asarray(steps)[order], np.asarray(values, dtype=np.float64)[order]
    finite = np.isfinite(values)
    steps, values = steps[finite], values[finite]
    if len(steps) < min_steps:
        return [
            {
                "reason": f"not enough steps: {len(steps)} analysed step(s) with a finite value, the rule needs"
                f" phases.min_steps = {min_steps}"
            }
        ]
    smoothed = running_median(values, smooth)
    delta = tolerance * float(np.median(np.abs(smoothed)))
    found, first = turns(smoothed, delta) if delta > 0 else ([], 0)
    if first == 0:
        return [
            {
                "delta": delta,
                "reason": f"no phase: the curve moves less than delta = {delta:.4g} (phases.tolerance {tolerance:g}"
                " of its median) away from its first value",
            }
        ]
    legs = measured_legs(values, located(values, found, first, smooth))
    if not legs:
        return [
            {
                "delta": delta,
                "reason": "no phase: the smoothed curve moves by delta, but the measured values at its turns and"
                " last step equal the first",
            }
        ]
    return [
        {
            "phase_index": index,
            "phase": phase_name(index, direction == spreads),
            "start_step": int(steps[start]),
            "end_step": int(steps[end]),
            "start_value": float(values[start]),
            "end_value": float(values[end]),
            "ends_at_turn": index < len(legs) - 1,
            "delta": delta,
        }
        for index, (start, end, direction) in enumerate(legs)
    ]


def summary_curve(rows: pl.DataFrame) -> tuple[int, str] | None:
    """(layer, site) of the curve that stands for the model: the first of MODEL_SITES it has, at its last layer."""
    for site in MODEL_SITES:
        at_site = rows.filter(pl.col("site") == site)
        if at_site.height:
            return int(at_site["layer"].max()), site
    return None


def model_phases(sweep: pl.DataFrame, settings: Mapping[str, float] | None = None) -> pl.DataFrame:
    """phases.parquet of one model's sweep: the phases of each metric of METRICS at every layer and sampled site
    (scope `layer`) and of the model's summary curve (scope `model`), from the rows the figures show (status ok)."""
    settings = {**DEFAULTS, **(settings or {})}
    smooth, tolerance, min_steps = int(settings["smooth"]), float(settings["tolerance"]), int(settings["min_steps"])
    ident = {key: sweep[key][0] if sweep.height else None for key in ("family", "model", "seed")}
    rows = analysed(sweep).filter(pl.col("metric").is_in(list(METRICS)) & pl.col("head").is_null())
    tokens = dict(zip(*analysed(sweep).select("step", "tokens_seen").unique("step")))
    out = []
    summary = summary_curve(rows)
    curves = sorted(rows.group_by("metric", "layer", "site"), key=lambda group: group[0])
    for (metric, layer, site), curve in curves:
        phases = curve_phases(
            curve["step"].to_numpy(), curve["value"].to_numpy(), METRICS[metric], smooth, tolerance, min_steps
        )
        scopes = ["layer", *(["model"] if (layer, site) == summary else [])]
        for scope in scopes:
            for phase in phases:
                out.append(
                    {
                        **ident,
                        "scope": scope,
                        "layer": layer,
                        "site": site,
                        "metric": metric,
                        **phase,
                        "start_tokens_seen": tokens.get(phase.get("start_step")),
                        "end_tokens_seen": tokens.get(phase.get("end_step")),
                        "n_steps": curve["value"].is_finite().sum(),
                        "smooth": smooth,
                        "tolerance": tolerance,
                        "min_steps": min_steps,
                    }
                )
    for metric in METRICS:
        if summary is None or not rows.filter(pl.col("metric") == metric).height:
            out.append({**ident, "scope": "model", "metric": metric, "reason": f"the sweep has no {metric} rows"})
    frame = pl.DataFrame(out, schema=PHASES_SCHEMA) if out else pl.DataFrame(schema=PHASES_SCHEMA)
    return frame.sort("scope", "metric", "site", "layer", "phase_index", nulls_last=True)
