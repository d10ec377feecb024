"""A seed group's Multi-Bootstrap offline under MultiBERTs' real ids: three seeds (tests/hubcache.py lays tiny random
BERTs out as ``google/multiberts-seed_{0,1,2}-step_{0,20,40}k`` at ``main``, seed_2 also at 60k), run through the
workflow with ``bootstrap: {groups: {multiberts: [seed_0, seed_1, seed_2]}}``. results/bootstrap/multiberts.parquet
holds the intervals over seeds and sequences of every resampled measure (the sampled vectors' IsoScore and RankMe,
the sums' avg_cos, entropy_mean, qk_cos) at the three steps the seeds share (not seed_2's own 60k), each estimate the
mean of the seeds' metrics.parquet values (written by the metrics jobs, not the bootstrap's), the paired step
tests, and linear CKA of each step with the previous and the final one over seeds and sequences."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from anisweep import schema
from anisweep.measures import compare

from conftest import snakemake_command
from hubcache import build_hub_cache, offline_env, save_tiny_bert, write_eval_corpus

# a whole (small) DAG: fetch, extract, metrics, bootstrap; its Snakemake runs share one warm worker
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_worker")]

SEEDS = ("seed_0", "seed_1", "seed_2")
SHARED = (0, 20000, 40000)
OWN = {"seed_2": (60000,)}  # a step only one seed has: the group leaves it out
SAMPLES = 200
N_SEQUENCES = 32
EXTRACT = {"n_sequences": N_SEQUENCES, "seq_len": 32, "batch_size": 8, "sample_tokens": 512, "seed": 0}
MEASURES = [*schema.defaults("bootstrap")["measures"], "rankme", "cka"]


def run_group(root: Path) -> Path:
    """Lay the seeds out in a Hub cache under `root`, run the group's job and the seeds' metrics; the workdir."""
    hf_home = root / "hf"
    for s, name in enumerate(SEEDS):
        for step in (*SHARED, *OWN.get(name, ())):
            k = step // 1000
            folder = save_tiny_bert(root / "models" / f"{name}_{k}", seed=100 * s + k)
            build_hub_cache(hf_home, f"google/multiberts-seed_{s}-step_{k}k", {"main": folder})
    corpus = write_eval_corpus(root / "eval.txt")
    config = {
        "models": [
            {"family": "multiberts", "name": name, "steps": sorted((*SHARED, *OWN.get(name, ())))} for name in SEEDS
        ],
        "corpus": {"source": "text", "paths": [str(corpus)]},
        "extract": EXTRACT,
        "fetch": {"keep_weights": False, "retries": 1},
        "gradients": {"enabled": False},
        "weights": {"enabled": False},
        "untrained": {"enabled": False},
        "audit": {"flagged": "keep"},
        "bootstrap": {"enabled": True, "samples": SAMPLES, "groups": {"multiberts": list(SEEDS)}, "measures": MEASURES},
    }
    configfile = root / "group.yaml"
    configfile.write_text(yaml.safe_dump(config))
    workdir = root / "work"
    workdir.mkdir()
    env = offline_env(hf_home)
    metrics = [f"results/multiberts/{name}/step{step}/metrics.parquet" for name in SEEDS for step in SHARED]
    command = snakemake_command(
        workdir, "--configfile", str(configfile), "--cores", "2", "results/bootstrap/multiberts.parquet", *metrics
    )
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-5000:]
    return workdir


@pytest.fixture(scope="module")
def group_run(tmp_path_factory) -> Path:
    return run_group(tmp_path_factory.mktemp("multiberts-group"))


KEY = ["layer", "site", "head", "metric"]


def read_group(workdir: Path) -> pl.DataFrame:
    return pl.read_parquet(workdir / "results/bootstrap/multiberts.parquet")


def metric_values(workdir: Path, name: str, step: int, metrics: set[str]) -> pl.DataFrame:
    table = pl.read_parquet(workdir / f"results/multiberts/{name}/step{step}/metrics.parquet")
    return table.filter(pl.col("metric").is_in(sorted(metrics))).select(*KEY, "value")


def test_the_group_is_resampled_over_its_seeds_at_the_steps_they_share(group_run):
    table = read_group(group_run)
    assert set(table["group"]) == {"multiberts"}
    assert table["models"].to_list() == [[f"multiberts/{name}" for name in SEEDS]] * table.height
    assert set(table["n_seeds"]) == {len(SEEDS)} and set(table["n_units"]) == {N_SEQUENCES}
    assert set(table["samples"]) == {SAMPLES} and set(table["family"]) == {"multiberts"}
    intervals = table.filter(pl.col("against").is_null())
    assert set(intervals["design"]) == {"seeds and units"}
    assert set(intervals["step"]) == set(SHARED)  # seed_2's 60k is no step of the group
    keys = intervals.select(KEY).unique()
    assert {"isoscore", "rankme"} <= set(keys["metric"])
    assert keys.filter(metric="isoscore").height >= 3  # the residual stream's sampled sites at least
    assert intervals.height == keys.height * len(SHARED)  # every key at every shared step, once
    assert intervals["undefined"].sum() == 0
    assert intervals.select(pl.col("estimate", "low", "high").is_nan().any()).row(0) == (False, False, False)
    assert (intervals["low"] < intervals["high"]).all()  # three different seeds: the replicates spread
    held = intervals.filter(pl.col("metric") != "isoscore")  # IsoScore's: the xfail below
    assert ((held["low"] <= held["estimate"]) & (held["estimate"] <= held["high"])).all()


@pytest.mark.xfail(
    strict=True,
    reason="a replicate repeats each drawn sequence's tokens, which lowers IsoScore (fewer distinct vectors per "
    "dimension; docs/measures.md, the Multi-Bootstrap): the percentile interval sits below the estimate, and at "
    "this sample (512 tokens of 32 sequences in 32 dimensions) leaves it out at some steps and layers",
)
def test_each_isoscore_interval_holds_its_estimate(group_run):
    intervals = read_group(group_run).filter(pl.col("against").is_null(), metric="isoscore")
    assert (intervals["low"] <= intervals["estimate"]).all()
    assert (intervals["estimate"] <= intervals["high"]).all()


def test_each_estimate_is_the_mean_of_the_seeds_metrics(group_run):
    intervals = read_group(group_run).filter(pl.col("against").is_null())
    metrics = set(intervals["metric"])
    for step in SHARED:
        per_seed = pl.concat(metric_values(group_run, name, step, metrics) for name in SEEDS)
        counts = per_seed.group_by(KEY).len()
        assert set(counts["len"]) == {len(SEEDS)}  # each key once per seed
        mean = per_seed.group_by(KEY).agg(pl.col("value").mean().alias("mean"), pl.col("value").std().alias("sd"))
        got = intervals.filter(step=step).join(mean, on=KEY, how="left", nulls_equal=True)
        assert got.height == intervals.filter(step=step).height and got["mean"].null_count() == 0
        exact = got.filter(pl.col("metric") != "qk_cos")
        np.testing.assert_allclose(exact["estimate"], exact["mean"], rtol=1e-12, atol=1e-15)
        # metrics' qk_cos is of qk.parquet's float32 means of q and k, the bootstrap's of units.parquet's float64 sums
        qk = got.filter(metric="qk_cos")
        np.testing.assert_allclose(qk["estimate"], qk["mean"], rtol=0, atol=1e-6)
        assert (got["sd"] > 0).all()  # the seeds differ, so the mean is no one seed's value


def test_each_step_is_tested_against_the_previous_and_the_final(group_run):
    table = read_group(group_run)
    tests = table.filter(pl.col("against").is_not_null(), pl.col("p").is_not_null())
    assert set(tests["design"]) == {"paired"}
    pairs = set(tests.select("step", "ref_step", "against").unique().iter_rows())
    assert pairs == {(20000, 0, "previous"), (40000, 20000, "previous"), (0, 40000, "final"), (20000, 40000, "final")}
    intervals = table.filter(pl.col("against").is_null())
    for step, ref_step, _ in pairs:
        got = tests.filter(step=step, ref_step=ref_step)
        for name, at in (("at", step), ("ref", ref_step)):
            estimates = intervals.filter(step=at).select(*KEY, pl.col("estimate").alias(name))
            got = got.join(estimates, on=KEY, how="left", nulls_equal=True)
        assert got.height == intervals.filter(step=step).height and got["ref"].null_count() == 0
        np.testing.assert_allclose(got["estimate"], got["at"] - got["ref"], rtol=1e-12, atol=1e-15)
        assert ((got["p"] >= 2 / SAMPLES) & (got["p"] <= 1)).all()
        assert (got["low"] <= got["high"]).all()


def test_cka_of_each_step_with_the_previous_and_the_final_is_resampled_over_seeds(group_run):
    """The group's CKA rows: an interval over seeds and sequences per pair of steps and sampled site, no p-value, the
    estimate the mean over seeds of compare's CKA of the two checkpoints (to 1e-6: the units' float32 products)."""
    pairs = read_group(group_run).filter(metric="cka")
    assert set(pairs.select("step", "ref_step", "against").unique().iter_rows()) == {
        (20000, 0, "previous"), (40000, 20000, "previous"), (0, 40000, "final"), (20000, 40000, "final")
    }  # fmt: skip
    assert set(pairs["design"]) == {"seeds and units"} and pairs["p"].is_null().all()
    assert pairs["undefined"].sum() == 0 and (pairs["low"] < pairs["high"]).all()
    folder = group_run / "results" / "multiberts"
    for step, ref_step in ((0, 40000), (40000, 20000)):
        values = [
            compare.compare_pair(folder / name / f"step{step}", folder / name / f"step{ref_step}")
            .filter(metric="cka")
            .select("layer", "site", "value")
            for name in SEEDS
        ]
        mean = pl.concat(values).group_by("layer", "site").agg(pl.col("value").mean())
        got = pairs.filter(step=step, ref_step=ref_step).join(mean, on=["layer", "site"])
        assert got.height == mean.height > 0
        np.testing.assert_allclose(got["estimate"], got["value"], rtol=1e-6)
