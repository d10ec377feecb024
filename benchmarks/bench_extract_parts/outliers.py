"""The `outliers` part (CPU): the outlier statistics' cost.

extract against extract without what it measures of rogue dimensions, massive activations and attention sinks
(models.without_outlier_statistics: no per-dimension squares or top tokens at the sampled sites, no column sums in
the attention pass), both interleaved with the plain forward in each of --processes fresh `speed` processes (3; 11
repetitions each): the ratios are medians over all the repetitions, each process's own beside them; the drop of
extract's ratio is the median of the paired differences.
"""

from __future__ import annotations

import statistics

from .speed import spawn_speed

TABLE_HEAD = (
    "| model | batch x seq | extract vs plain | each process | without the outlier statistics | "
    "drop (median of pairs) |"
)


def table_line(c: dict) -> str:
    each = " / ".join(f"{r:.3f}" for r in c.get("with_per_process", [c["with"]]))
    return (
        f"| {c['shape']} | {c['batch']}x{c['seq_len']} | {c['with']:.3f}x | {each} | {c['without']:.3f}x | "
        f"{c['drop']:.3f} ({c['added_seconds'] * 1e3:.0f} ms per batch) |"
    )


def outlier_cost(a, shape: str, t: int) -> dict:
    """extract's speed ratio to the plain forward with and without the outlier statistics, interleaved in each of
    --processes fresh processes (a process's ratio differs from the next one's by up to 0.1 on a 2-core machine):
    each ratio is the median over all their repetitions, the drop the median of the paired differences."""
    print(f"[{shape} {a.batch}x{t}] outlier statistics' cost, {a.processes} processes ...", flush=True)
    row, with_, without = with_and_without(a, shape, t, "extract_without_outliers")
    drops = [w - x for w, x in zip(without["speed_ratios"], with_["speed_ratios"])]
    return row | {"drop": statistics.median(drops), "drops": drops}


def with_and_without(a, shape: str, t: int, without_variant: str) -> tuple[dict, dict, dict]:
    """extract and `without_variant` interleaved with the plain forward in each of --processes fresh `speed`
    processes: (the row's shared figures, extract's pooled figures, the variant's)."""
    variants = ["plain", "extract", without_variant]
    runs = [spawn_speed(a, shape, t, variants, a.repeat or 11) for _ in range(a.processes)]
    with_, without = pooled(runs, "extract"), pooled(runs, without_variant)
    row = {
        "shape": shape,
        "batch": a.batch,
        "seq_len": t,
        "with": with_["speed_ratio"],
        "without": without["speed_ratio"],
        "with_per_process": with_["per_process"],
        "without_per_process": without["per_process"],
        "added_seconds": statistics.median(w - x for w, x in zip(with_["seconds"], without["seconds"])),
    }
    return row, with_, without


def pooled(runs: list[dict], variant: str) -> dict:
    """One variant's figures from several `speed` processes: their repetitions together, the speed ratio as the
    median over all of them, and each process's own median."""
    ratios = [r for run in runs for r in run[variant]["speed_ratios"]]
    return {
        "seconds": [s for run in runs for s in run[variant]["seconds"]],
        "speed_ratios": ratios,
        "speed_ratio": statistics.median(ratios),
        "per_process": [run[variant]["speed_ratio"] for run in runs],
    }
