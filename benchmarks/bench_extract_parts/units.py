"""The `units` part (CPU): the cost of the resampling units' sums (extract.units; units.parquet, the Multi-Bootstrap
of the measures built of sums).

extract with the default units against extract with `extract.units: 0` (no per-sequence or per-unit sums), both
interleaved with the plain forward in each of --processes fresh `speed` processes, as the `outliers` part does: the
ratios are medians over all the repetitions, the cost the median of the paired differences (goal: within 3%).
"""

from __future__ import annotations

import statistics

from .outliers import with_and_without

TABLE_HEAD = (
    "| model | batch x seq | extract vs plain | each process | without the units' sums | cost (median of pairs) |"
)


def table_line(c: dict) -> str:
    each = " / ".join(f"{r:.3f}" for r in c["with_per_process"])
    return (
        f"| {c['shape']} | {c['batch']}x{c['seq_len']} | {c['with']:.3f}x | {each} | {c['without']:.3f}x | "
        f"{c['cost']:.1%} of extract's time ({c['added_seconds'] * 1e3:.0f} ms per batch) |"
    )


def units_cost(a, shape: str, t: int) -> dict:
    """extract's speed ratio to the plain forward with and without the units' sums, interleaved in each of
    --processes fresh processes; the cost is the median of the paired relative differences of extract's seconds."""
    print(f"[{shape} {a.batch}x{t}] the units' sums' cost, {a.processes} processes ...", flush=True)
    row, with_, without = with_and_without(a, shape, t, "extract_without_units")
    return row | {"cost": statistics.median(w / x - 1 for w, x in zip(with_["seconds"], without["seconds"]))}
