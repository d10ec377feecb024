"""Synthetic sweep tables for the explorer's tests: two models (one with two seeds), their per-layer rows at
resid and attention, and rows the page must leave out (a head's, a gradient subspace's, a duplicate step's); a
Hub model and a live run whose tokens seen are unknown (all, or past step 8) and that lack some metric x site pairs;
a model whose names (folders too) are markup."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

MODELS = {("toy", "toy-neox", 0): 2, ("toy", "toy-neox", 1): 2, ("pythia", "pythia-70m", 0): 3}  # key: layers
STEPS = [0, 1, 8, 64, 512]


def sweep_rows(family: str, model: str, seed: int, n_layers: int) -> pl.DataFrame:
    rng = np.random.default_rng([len(model), seed])
    rows = []
    for step in STEPS:
        base = {"family": family, "model": model, "seed": seed, "step": step, "tokens_seen": step * 2048}
        base |= {"status": "duplicate" if step == 8 and model == "pythia-70m" else "ok"}
        for layer in range(n_layers + 1):
            for metric in ("avg_cos", "isoscore"):
                rows.append(base | {"layer": layer, "site": "resid", "metric": metric, "value": rng.uniform(0.1, 0.9)})
        for layer in range(n_layers):
            rows.append(base | {"layer": layer, "site": "attention", "metric": "entropy_mean", "value": rng.uniform()})
            rows.append(base | {"layer": layer, "head": 0, "site": "attention", "metric": "entropy_mean", "value": 9.0})
        rows.append(base | {"layer": 1, "site": "resid", "metric": "avg_cos", "subspace": "top", "value": 9.0})
        rows.append(base | {"layer": None, "site": "resid", "metric": "drift_avg_cos_spearman_r", "value": 0.5})
    schema = {"head": pl.Int64, "subspace": pl.String, "layer": pl.Int64, "value": pl.Float64}
    return pl.DataFrame(rows, schema_overrides=schema, infer_schema_length=None)


def write_results(root: Path) -> list[Path]:
    """One sweep.parquet per model (its seeds in one table), as the workflow files them."""
    paths = []
    for family, model in sorted({(f, m) for f, m, _ in MODELS}):
        frames = [sweep_rows(f, m, s, n) for (f, m, s), n in MODELS.items() if (f, m) == (family, model)]
        path = root / family / model / "sweep.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pl.concat(frames, how="diagonal").write_parquet(path)
        paths.append(path)
    return paths


def expected(root: Path, family: str, model: str, seed: int, site: str, metric: str, layer: int) -> pl.DataFrame:
    """(step, value) of one model's per-layer metric at its analysed steps, as the sweep holds it."""
    sweep = pl.read_parquet(root / family / model / "sweep.parquet")
    return (
        sweep.filter(
            pl.col("seed") == seed,
            pl.col("site") == site,
            pl.col("metric") == metric,
            pl.col("layer") == layer,
            pl.col("head").is_null(),
            pl.col("subspace").is_null(),
            pl.col("status") == "ok",
        )
        .select("step", "tokens_seen", "value")
        .sort("step")
    )


def write_gaps(root: Path) -> None:
    """write_results(root) and two models with gaps: a Hub entry without tokens_per_step (no tokens seen) that has
    avg_cos alone (no isoscore, nothing at attention), and a live run whose tokens seen are known up to step 8 only,
    without isoscore."""
    write_results(root)
    hub = sweep_rows("hub", "tiny-hub", 0, 2).filter(pl.col("metric") == "avg_cos")
    live = sweep_rows("local", "live-run", 0, 2).filter(pl.col("metric") != "isoscore")
    for rows in (
        hub.with_columns(tokens_seen=pl.lit(None, pl.Int64)),
        live.with_columns(tokens_seen=pl.when(pl.col("step") <= 8).then(pl.col("tokens_seen"))),
    ):
        path = root / rows["family"][0] / rows["model"][0] / "sweep.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        rows.write_parquet(path)


#: Names that are markup where they stand in the page: a script element's end, a comment's start, an entity.
HOSTILE = {
    "family": "fam<!--<script>",
    "model": "m&amp;</script><script>x</script>",
    "site": "resid</SCRIPT ><!--",
    "metric": "isoscore<!--<script>",
}


def write_hostile(root: Path) -> Path:
    """One model's sweep.parquet at root/{family}/{model}/ with the HOSTILE names, its isoscore and resid renamed
    (avg_cos and attention keep theirs)."""
    rows = sweep_rows("toy", "toy-neox", 0, 2).with_columns(
        family=pl.lit(HOSTILE["family"]),
        model=pl.lit(HOSTILE["model"]),
        site=pl.when(pl.col("site") == "resid").then(pl.lit(HOSTILE["site"])).otherwise(pl.col("site")),
        metric=pl.when(pl.col("metric") == "isoscore").then(pl.lit(HOSTILE["metric"])).otherwise(pl.col("metric")),
    )
    path = root / HOSTILE["family"] / HOSTILE["model"].replace("/", "_") / "sweep.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows.write_parquet(path)
    return path


def write_intervals(root: Path) -> list[Path]:
    """pythia-70m's bootstrap.parquet beside its sweep, as anisweep.measures.sample_bootstrap writes it: an interval
    of isoscore at resid per layer and step (step 8 too, which the page does not draw: its sweep marks it a
    duplicate; none at step 64, where every replicate was undefined), each with a paired test row beside it."""
    from anisweep.measures.sample_bootstrap import SCHEMA

    rng = np.random.default_rng(7)
    rows = []
    for step in STEPS:
        for layer in range(MODELS[("pythia", "pythia-70m", 0)] + 1):
            low, high = sorted(rng.uniform(0.0, 1.0, 2))
            undefined = step == 64
            row = {
                "models": ["pythia/pythia-70m"],
                "family": "pythia",
                "model": "pythia-70m",
                "seed": 0,
                "step": step,
                "tokens_seen": step * 2048,
                "layer": layer,
                "site": "resid",
                "metric": "isoscore",
                "estimate": (low + high) / 2,
                "low": float("nan") if undefined else low,
                "high": float("nan") if undefined else high,
                "level": 0.9,
                "n_seeds": 1,
                "n_units": 8,
                "samples": 100,
                "undefined": 100 if undefined else 0,
                "design": "units",
            }
            rows += [row, row | {"against": "final", "ref_step": 512, "low": -1.0, "high": 1.0, "p": 0.2}]
    path = root / "pythia" / "pythia-70m" / "bootstrap.parquet"
    pl.DataFrame(rows, schema=SCHEMA).write_parquet(path)
    return [path]


def expected_intervals(root: Path, layer: int) -> pl.DataFrame:
    """(step, low, high) of pythia-70m's isoscore interval at `layer`, at the steps the page draws (null: none)."""
    table = pl.read_parquet(root / "pythia" / "pythia-70m" / "bootstrap.parquet").filter(
        pl.col("against").is_null(), pl.col("layer") == layer
    )
    drawn = expected(root, "pythia", "pythia-70m", 0, "resid", "isoscore", layer).select("step")
    table = table.with_columns(pl.when(pl.col("low").is_finite()).then(pl.col(c)).alias(c) for c in ("low", "high"))
    return drawn.join(table.select("step", "low", "high"), on="step", how="left").sort("step")
