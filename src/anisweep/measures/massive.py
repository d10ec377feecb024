"""Massive activations (Sun et al. 2024): a few activations thousands of times the typical one, at fixed
dimensions and tokens. Per layer and hidden site, from extract's tables:

- the largest |x_ij| over every valid token and dimension (hidden_stats.parquet's per-dimension `abs_max`, streamed);
- the median |x_ij| over the components of the seeded token sample (hidden.parquet): a median does not stream in one
  pass, the sample's is an unbiased estimate of it (its quantile error shrinks as 1/sqrt(sample_tokens x d));
- which dimensions hold the largest activations (by `abs_max`), and where the TOP_K tokens with the largest
  |component| sit (massive.parquet): the first token, a delimiter or another token.

Whether the dimensions are the same over training is a question across checkpoints: `dimension_identity` answers it
from a sweep (the massive_dim_1 rows of every step), without running a model.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from anisweep.measures.sites import SAMPLED_SITES

MASSIVE_SITES = SAMPLED_SITES
N_DIMS_NAMED = 3
KINDS = ("first", "delimiter", "other")


def massive_rows(stats: pl.DataFrame, samples: dict, massive: pl.DataFrame) -> list[dict]:
    """Rows of the massive_activations measure per (layer, site) of MASSIVE_SITES: from hidden_stats (`stats`), the
    sampled vectors {(layer, site): (tokens, d)} and massive.parquet's top tokens."""
    rows = []
    for r in stats.iter_rows(named=True):
        if r["site"] not in MASSIVE_SITES or r.get("abs_max") is None or not r["n"]:
            continue
        layer, site = r["layer"], r["site"]
        abs_max = np.asarray(r["abs_max"], np.float64)
        order = np.argsort(-abs_max, kind="stable")
        x = samples.get((layer, site))
        median = float("nan")
        if x is not None:
            x = x[np.isfinite(x).all(axis=1)]
            if x.size:
                median = float(np.median(np.abs(x)))
        largest = float(abs_max[order[0]])
        values = {
            "massive_max": largest,
            "massive_median": median,
            "massive_ratio": largest / median if median > 0 else float("nan"),
        }
        values |= {f"massive_dim_{i + 1}": float(order[i]) for i in range(min(N_DIMS_NAMED, len(order)))}
        top = massive.filter((pl.col("layer") == layer) & (pl.col("site") == site)).sort("rank")
        if top.height:
            values |= {f"massive_top_{kind}_share": float((top["kind"] == kind).mean()) for kind in KINDS}
            values["massive_top1_position"] = float(top["position"][0])
            values["massive_top1_dim"] = float(top["dim"][0])
        rows += [{"layer": layer, "site": site, "metric": m, "value": v} for m, v in values.items()]
    return rows


#: the columns that tell one model's sweep from another's in a frame of several (anisweep.results.scan)
MODEL_KEYS = ("family", "model", "seed")


def dimension_identity(sweep: pl.DataFrame, site: str = "resid", metric: str = "massive_dim_1") -> pl.DataFrame:
    """Across the checkpoints of each model's sweep: per layer and step, the dimension `metric` names (the largest
    massive activation's, by default), whether it is the last step's (`same_as_last`) and the previous step's
    (`same_as_previous`, null at the first step), and per layer the share of steps that agree with the last
    (`share_as_last`). Computed from sweep.parquet alone; a frame of several models' sweeps (`scan(root, "sweep")`)
    is taken model by model (family, model, seed: the leading columns, where the frame has them)."""
    keys = [key for key in MODEL_KEYS if key in sweep.columns]
    rows = sweep.filter((pl.col("metric") == metric) & (pl.col("site") == site) & pl.col("head").is_null())
    if not rows.height:
        return pl.DataFrame(
            schema={
                **{key: sweep.schema[key] for key in keys},
                "layer": pl.Int64,
                "step": pl.Int64,
                "dim": pl.Int64,
                "same_as_last": pl.Boolean,
                "same_as_previous": pl.Boolean,
                "share_as_last": pl.Float64,
            }
        )
    per_layer = [*keys, "layer"]
    table = rows.select(*per_layer, "step", pl.col("value").cast(pl.Int64).alias("dim")).sort(*per_layer, "step")
    table = table.with_columns(
        (pl.col("dim") == pl.col("dim").last().over(per_layer)).alias("same_as_last"),
        (pl.col("dim") == pl.col("dim").shift(1).over(per_layer)).alias("same_as_previous"),
    )
    return table.with_columns(pl.col("same_as_last").cast(pl.Float64).mean().over(per_layer).alias("share_as_last"))
