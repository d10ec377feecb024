"""Attention sinks (Xiao et al. 2024): heads that park their attention on a few keys, mostly the first token. Per
layer and head, from the column sums the attention pass computes over every valid query row (sinks.parquet,
sink_keys.parquet) and attention.parquet:

- sink_first_mass: the mean over valid query rows of p on their sequence's first valid key;
- sink_row_max_mass: the mean over valid query rows of the largest p of the row (its most-attended key; the same
  value as attention's p_max_mean, named here beside the others);
- sink_top_key_share: the attention the key that receives the most (in the whole batch) gets from its sequence's
  rows, over their number; its position, and the kinds of the TOP_K keys that receive the most (first, delimiter,
  other).
- sink1_eps: Gu et al. 2024's Sink_1^epsilon (sail-sg/Attention-Sink, eval_sink_open_source.py
  `compute_attention_sink`): the share of sequences whose first-key importance (the attention the first valid key
  receives, averaged over the sequence's valid query rows: sinks.parquet's `first_importance`) exceeds epsilon.
Per layer (head null): each metric's mean over heads; sink1_eps also per model (layer and head null), the share over
every layer, head and sequence, the number Gu et al. report (as a percentage), and sink1_epsilon, the epsilon used.
"""

from __future__ import annotations

import numpy as np
import polars as pl

KINDS = ("first", "delimiter", "other")
PER_LAYER = ("sink_first_mass", "sink_row_max_mass", "sink_top_key_share", "sink_top_first_share", "sink1_eps")
EPSILON = 0.3  # Gu et al. 2024's threshold on the first key's importance


def sink_share(importance, epsilon: float) -> float:
    """The share of the (finite) importances above epsilon; NaN where there are none."""
    importance = np.asarray(importance, dtype=np.float64)
    importance = importance[np.isfinite(importance)]
    return float((importance > epsilon).mean()) if len(importance) else float("nan")


def sink_rows(
    sinks: pl.DataFrame, sink_keys: pl.DataFrame, attention: pl.DataFrame, epsilon: float = EPSILON
) -> list[dict]:
    rows = []
    p_max = {(r["layer"], r["head"]): r["p_max_mean"] for r in attention.iter_rows(named=True)}
    keys = {key: group.sort("rank") for key, group in sink_keys.group_by("layer", "head")}
    for r in sinks.iter_rows(named=True):
        layer, head = r["layer"], r["head"]
        values = {
            "sink_first_mass": r["first_received"] / r["n_rows"] if r["n_rows"] else float("nan"),
            "sink_row_max_mass": p_max.get((layer, head), float("nan")),
            "sink1_eps": sink_share(r["first_importance"], epsilon),
        }
        top = keys.get((layer, head))
        if top is not None and top.height:
            values["sink_top_key_share"] = top["share"][0]
            values["sink_top_key_position"] = float(top["position"][0])
            values |= {f"sink_top_{kind}_share": float((top["kind"] == kind).mean()) for kind in KINDS}
        rows += [
            {"layer": layer, "head": head, "site": "attention", "metric": m, "value": v} for m, v in values.items()
        ]
    by_layer: dict[tuple[int, str], list[float]] = {}
    for row in rows:
        if row["metric"] in PER_LAYER:
            by_layer.setdefault((row["layer"], row["metric"]), []).append(row["value"])
    rows += [
        {"layer": layer, "site": "attention", "metric": metric, "value": float(np.mean(values))}
        for (layer, metric), values in sorted(by_layer.items())
    ]
    if sinks.height:
        every = [v for importance in sinks["first_importance"].to_list() for v in importance]
        rows += [
            {"layer": None, "site": "attention", "metric": "sink1_eps", "value": sink_share(every, epsilon)},
            {"layer": None, "site": "attention", "metric": "sink1_epsilon", "value": float(epsilon)},
        ]
    return rows


def received_by_position(sinks: pl.DataFrame) -> pl.DataFrame:
    """Per layer, head and key position: the mean attention a key at that position receives from its sequence's
    valid rows (sum over rows of p, averaged over the sequences whose key there is valid)."""
    frames = []
    for r in sinks.iter_rows(named=True):
        received, counts = np.asarray(r["received"]), np.asarray(r["key_count"])
        mean = np.divide(received, counts, out=np.full(received.shape, np.nan), where=counts > 0)
        frames.append(
            pl.DataFrame(
                {
                    "layer": np.full(len(mean), r["layer"]),
                    "head": np.full(len(mean), r["head"]),
                    "position": np.arange(len(mean)),
                    "received": mean,
                }
            )
        )
    return pl.concat(frames) if frames else pl.DataFrame()
