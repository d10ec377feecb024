"""sweep.parquet keeps the metric parameters (subspace, fit, rank, stratum) as columns (anisweep.measures.sweep)."""

from __future__ import annotations

import polars as pl
import pytest

from anisweep.measures.sweep import SWEEP_SCHEMA, aggregate
from anisweep.tables import METRIC_KEY, METRIC_SCHEMA, check_metric_keys, metric_rows, write_atomic

IDENT = {"family": "toy", "model": "m", "seed": 0}


def rows(rank: int = 4) -> list[dict]:
    share = {"layer": 1, "site": "resid", "subspace": "seminmf", "fit": "fixed", "stratum": "rare"}
    return [
        {"layer": 1, "site": "resid", "metric": "avg_cos", "value": 0.5},
        {**share, "metric": "grad_energy_share_z", "rank": rank, "value": 3.0},
        {**share, "metric": "grad_energy_share_z", "rank": 2 * rank, "value": 4.0},
    ]


def test_the_sweep_keeps_the_parameter_columns(tmp_path):
    paths = []
    for step in (0, 8):
        paths.append(tmp_path / f"step{step}" / "metrics.parquet")
        paths[-1].parent.mkdir()
        write_atomic(metric_rows({**IDENT, "step": step, "tokens_seen": step}, rows()), paths[-1])
    with pytest.warns(UserWarning, match="steps \\[16\\]"):
        sweep = aggregate(paths, expected_steps=[0, 8, 16], ident=IDENT)
    assert list(sweep.schema.items()) == list(SWEEP_SCHEMA.items())
    assert list(SWEEP_SCHEMA)[: len(METRIC_SCHEMA)] == list(METRIC_SCHEMA)
    z = sweep.filter(pl.col("metric") == "grad_energy_share_z").sort("step", "rank")
    assert z.select("step", "subspace", "fit", "rank", "stratum", "value").rows() == [
        (0, "seminmf", "fixed", 4, "rare", 3.0),
        (0, "seminmf", "fixed", 8, "rare", 4.0),
        (8, "seminmf", "fixed", 4, "rare", 3.0),
        (8, "seminmf", "fixed", 8, "rare", 4.0),
    ]
    assert sweep.filter(pl.col("metric") == "avg_cos")["rank"].to_list() == [None, None]
    assert sweep.filter(pl.col("step") == 16)["status"].to_list() == ["unfinished"]
    assert not sweep.select("step", *METRIC_KEY).is_duplicated().any()


def test_metrics_from_before_the_parameter_columns(tmp_path):
    """A metrics.parquet without the columns reads with them null; with old-style gradient names (parameters
    inside the name) it must be recomputed."""
    old = metric_rows({**IDENT, "step": 0, "tokens_seen": 0}, rows()[:1]).drop("subspace", "fit", "rank", "stratum")
    write_atomic(old, tmp_path / "metrics.parquet")
    sweep = aggregate([tmp_path / "metrics.parquet"])
    assert sweep.select("metric", "subspace", "fit", "rank", "stratum").rows() == [("avg_cos", None, None, None, None)]
    legacy = old.with_columns(pl.lit("grad_energy_share_seminmf_fixed_k4_rare_z").alias("metric"))
    write_atomic(legacy, tmp_path / "metrics.parquet")
    with pytest.raises(ValueError, match="rerun its metrics"):
        aggregate([tmp_path / "metrics.parquet"])


def test_rows_that_share_their_key_are_refused():
    ident = {**IDENT, "step": 0, "tokens_seen": 0}
    with pytest.raises(ValueError, match="share their key columns"):
        metric_rows(ident, rows() + rows()[:1])
    same_rank = rows()
    same_rank[2]["rank"] = same_rank[1]["rank"]
    with pytest.raises(ValueError, match="share their key columns"):
        metric_rows(ident, same_rank)
    check_metric_keys(metric_rows(ident, rows()))  # different ranks: different rows
