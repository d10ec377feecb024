"""The gradient analysis's key numbers as tidy rows of metrics.parquet (layer, site, metric, value), so that
sweep.parquet carries them next to every other metric.

metrics.parquet has no stratum or rank column; both go into the metric's name, in a fixed order:

    grad_{measure}_{subspace}[_fixed]_k{rank}_{stratum}[_control_mean | _z]

measure: energy_share | anisotropy_share; subspace: seminmf | pca; `_fixed` for the subspaces held fixed
(fit = "fixed" in gradients.parquet); stratum: all | frequent | middle | rare. Without a suffix the value is
the share itself; `_control_mean` is the matched-rank random controls' mean and `_z` the z against them.
`parse_metric` gives the parts back.
"""

from __future__ import annotations

import re

import polars as pl

MEASURES = ("energy_share", "anisotropy_share")
_NAME = re.compile(
    r"^grad_(?P<measure>energy_share|anisotropy_share)_(?P<subspace>[a-z0-9]+?)(?P<fixed>_fixed)?"
    r"_k(?P<rank>\d+)_(?P<stratum>all|frequent|middle|rare)(?P<statistic>_control_mean|_z)?$"
)


def metric_name(measure: str, subspace: str, fit: str, rank: int, stratum: str, statistic: str = "value") -> str:
    fixed = "_fixed" if fit == "fixed" else ""
    suffix = "" if statistic == "value" else f"_{statistic}"
    return f"grad_{measure}_{subspace}{fixed}_k{rank}_{stratum}{suffix}"


def parse_metric(name: str) -> dict | None:
    """{measure, subspace, fit, rank, stratum, statistic} of a gradient metric's name; None for other metrics."""
    match = _NAME.match(name)
    if match is None:
        return None
    parts = match.groupdict()
    return {
        "measure": parts["measure"],
        "subspace": parts["subspace"],
        "fit": "fixed" if parts["fixed"] else "checkpoint",
        "rank": int(parts["rank"]),
        "stratum": parts["stratum"],
        "statistic": (parts["statistic"] or "_value")[1:],
    }


def gradient_metric_rows(table: pl.DataFrame) -> list[dict]:
    """Rows (layer, site, metric, value) of gradients.parquet's fitted subspaces' shares: the share, the
    controls' mean and z. Tables written before the `fit` column count as per-checkpoint fits."""
    if "fit" not in table.columns:
        table = table.with_columns(pl.lit("checkpoint").alias("fit"))
    shares = table.filter(pl.col("measure").is_in(MEASURES) & (pl.col("subspace") != "random"))
    rows = []
    for r in shares.sort("layer", "site", "fit", "subspace", "rank", "stratum", "measure").iter_rows(named=True):
        for statistic, column in (("value", "value"), ("control_mean", "control_mean"), ("z", "z")):
            name = metric_name(r["measure"], r["subspace"], r["fit"], r["rank"], r["stratum"], statistic)
            rows.append({"layer": r["layer"], "site": r["site"], "metric": name, "value": r[column]})
    return rows
