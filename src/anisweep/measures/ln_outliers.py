"""LayerNorm outlier dimensions (Kovaleva et al. 2021; Timkey & van Schijndel 2021 trace rogue dimensions to
them): the coordinates of a norm's gain or bias more than OUTLIER_SD standard deviations from the vector's mean,
their count, and whether they are the rogue dimensions (the top ROGUE_TOP dimensions by contribution to avg_cos,
anisweep.measures.rogue) of the residual stream at the norm's layer (`resid`: in a post-LN model such as BERT the
output of the block's last norm; the final norm: its output, `final_ln_out`). The outlier statistics are streamed
at the sampled sites only (resid, final_ln_in, final_ln_out), where they cost the least."""

from __future__ import annotations

import numpy as np
import polars as pl

from anisweep.measures.rogue import top_dims

OUTLIER_SD = 3.0
ROGUE_TOP = 10


def outliers(v: np.ndarray, sd: float = OUTLIER_SD) -> np.ndarray:
    """Indices of the entries more than `sd` population standard deviations from the mean, largest |z| first."""
    v = np.asarray(v, np.float64)
    std = v.std()
    if not np.isfinite(std) or std == 0:
        return np.zeros(0, dtype=np.int64)
    z = np.abs(v - v.mean()) / std
    found = np.nonzero(z > sd)[0]
    return found[np.argsort(-z[found], kind="stable")]


def ln_outlier_rows(layernorm: pl.DataFrame, stats: pl.DataFrame) -> list[dict]:
    rows = []
    outputs = {(r["layer"], r["site"]): r for r in stats.iter_rows(named=True)}
    for r in layernorm.iter_rows(named=True):
        if r["gain"] is None:  # a norm without parameters (OLMo): nothing to describe
            continue
        gain = outliers(np.asarray(r["gain"]))
        bias = None if r["bias"] is None else outliers(np.asarray(r["bias"]))
        # a norm without a bias has no bias outliers to count, one without outliers no first outlier dimension: no
        # row, rather than a NaN that would mark the checkpoint's metrics as failed
        values = {"ln_gain_outliers": float(len(gain))}
        if bias is not None:
            values["ln_bias_outliers"] = float(len(bias))
        if len(gain):
            values["ln_gain_outlier_dim_1"] = float(gain[0])
        out = outputs.get((r["layer"], "final_ln_out" if r["site"] == "final_ln" else "resid"))
        if out is not None and out.get("m2_unit") is not None and out["n"] >= 2:
            rogue = set(top_dims(out, ROGUE_TOP))
            either = set(gain.tolist()) | (set() if bias is None else set(bias.tolist()))
            values["ln_outliers_in_rogue"] = float(len(either & rogue))
            values["ln_rogue_1_is_outlier"] = float(top_dims(out, 1)[0] in either)
        rows += [{"layer": r["layer"], "site": r["site"], "metric": m, "value": v} for m, v in values.items()]
    return rows
