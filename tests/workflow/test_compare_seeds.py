"""A seed comparison offline: two MultiBERTs seeds under their real repo ids (tests/hubcache.py lays tiny random
BERTs out as ``google/multiberts-seed_{0,1}-step_{20,40}k`` at ``main``), run through the workflow with
``compare: {seeds: [[seed_0, seed_1]]}``. The seed rows land in seed_0's compare.parquet at both steps, equal to
CKA computed directly from the two checkpoints' hidden.parquet, and the figure is drawn."""

from __future__ import annotations

import subprocess

import numpy as np
import polars as pl
import pytest
import yaml

from anisweep.measures.cka import linear_cka
from anisweep.tables import read_parquet

from conftest import snakemake_command
from hubcache import build_hub_cache, offline_env, save_tiny_bert, write_eval_corpus

# a whole (small) DAG: fetch, extract, compare; its Snakemake runs share one warm worker
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_worker")]

STEPS = (20, 40)


@pytest.fixture(scope="module")
def seeds_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("seeds")
    hf_home = root / "hf"
    for seed in (0, 1):
        for k in STEPS:
            folder = save_tiny_bert(root / "models" / f"seed{seed}_{k}", seed=10 * seed + k)
            build_hub_cache(hf_home, f"google/multiberts-seed_{seed}-step_{k}k", {"main": folder})
    corpus = write_eval_corpus(root / "eval.txt")
    steps = [1000 * k for k in STEPS]
    config = {
        "models": [{"family": "multiberts", "name": f"seed_{s}", "steps": steps} for s in (0, 1)],
        "corpus": {"source": "text", "paths": [str(corpus)]},
        "extract": {"n_sequences": 8, "seq_len": 32, "batch_size": 4, "sample_tokens": 128, "seed": 0},
        "fetch": {"keep_weights": False, "retries": 1},
        "gradients": {"enabled": False},
        "weights": {"enabled": False},
        "untrained": {"enabled": False},
        "audit": {"flagged": "keep"},
        "compare": {"seeds": [["seed_0", "seed_1"]], "cka_debiased": True},
    }
    configfile = root / "seeds.yaml"
    configfile.write_text(yaml.safe_dump(config))
    workdir = root / "work"
    workdir.mkdir()
    env = offline_env(hf_home)
    targets = ["results/multiberts/seed_0/compare.parquet", "results/multiberts/seed_0/figures/compare_seeds.png"]
    command = snakemake_command(workdir, "--configfile", str(configfile), "--cores", "2", *targets)
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-5000:]
    return workdir


def sample(workdir, model: str, step: int, layer: int) -> np.ndarray:
    hidden = read_parquet(workdir / f"results/multiberts/{model}/step{step}/hidden.parquet")  # as float32
    rows = hidden.filter(layer=layer, site="resid").sort("seq", "position")
    return np.stack(rows["vector"].to_list()).astype(np.float64)


def test_two_multiberts_seeds_are_compared_at_each_step(seeds_run):
    table = pl.read_parquet(seeds_run / "results/multiberts/seed_0/compare.parquet")
    seeds = table.filter(role="seed")
    assert seeds.select("model", "ref_model").unique().rows() == [("seed_0", "seed_1")]
    assert sorted(set(seeds["step"])) == [20000, 40000] and (seeds["step"] == seeds["ref_step"]).all()
    assert seeds["seed"].unique().to_list() == [0] and seeds["ref_seed"].unique().to_list() == [1]
    assert {"cka", "cka_debiased", "svcca", "pwcca"} <= set(seeds["metric"])
    for layer in (0, 2):
        x, y = sample(seeds_run, "seed_0", 40000, layer), sample(seeds_run, "seed_1", 40000, layer)
        row = seeds.filter(step=40000, layer=layer, metric="cka")
        assert row["value"].item() == pytest.approx(linear_cka(x, y), rel=1e-9)
    assert (seeds_run / "results/multiberts/seed_0/figures/compare_seeds.png").stat().st_size > 0
