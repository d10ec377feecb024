"""The whole DAG on a tiny config, run as a user runs it: snakemake from another directory."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import polars as pl
import pytest
import yaml

from anisweep.config import complete
from anisweep.measures.gradient_metrics import GRADIENT_METRICS
from anisweep.measures.registry import WEIGHT_FIGURES
from anisweep.mechanism.qk_svd import FIGURES as QK_SVD_FIGURES
from anisweep.plots.compare import COMPARE_FIGURES
from anisweep.plots.gradients import gradient_figures
from anisweep.plots.phases import PHASES_FIGURES
from anisweep.plots.spectra import SPECTRA_FIGURES
from anisweep.plots.sweep import MODEL_FIGURES
from anisweep.tables import METRIC_PARAMETERS, extract_columns

from conftest import snakemake_command

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "configs" / "tiny.yaml"

# the whole DAG, and Snakemake started per bad config; its Snakemake runs share one warm worker
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_worker")]

CONTRACT = {
    **{f"{name}.parquet": extract_columns(name) for name in ("qk_sample", "score_hist", "qk", "attention", "hidden")},
    "spectra.parquet": [
        "family",
        "model",
        "step",
        "layer",
        "head",
        "site",
        "vectors",
        "index",
        "singular_value",
        "share",
    ],
    "metrics.parquet": ["family", "model", "step", "tokens_seen", "layer", "head", "site", "metric", "value"],
}


def snakemake(workdir: Path, *args: str, configfile: Path = TINY, timeout: int = 900) -> subprocess.CompletedProcess:
    command = snakemake_command(workdir, "--configfile", str(configfile), "--cores", "2", *args)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


# The tiny config plus the untrained block from a swept model's own step 0 (its weights a temp input of the rule)
UNTRAINED = {"enabled": True, "inits": [{"model": "toy-neox"}], "n_sequences": 2, "seq_len": 16, "n_seeds": 2}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("tiny")
    config = {**yaml.safe_load(TINY.read_text()), "untrained": {**UNTRAINED, "norms": [0, 1, 10]}}
    (workdir / "tiny.yaml").write_text(yaml.safe_dump(config))
    done = snakemake(workdir, configfile=workdir / "tiny.yaml")
    assert done.returncode == 0, done.stderr[-5000:]
    return workdir


def test_every_contract_file_is_written(tiny_run):
    config = yaml.safe_load(TINY.read_text())
    for model in ("toy-bert", "toy-neox"):
        steps = config["toy"][model]["steps"]
        tokens_per_step = config["toy"][model]["batch_size"] * config["toy"][model]["seq_len"]
        for step in steps:
            folder = tiny_run / "results" / "toy" / model / f"step{step}"
            for name, columns in CONTRACT.items():
                df = pl.read_parquet(folder / name)
                assert set(columns) <= set(df.columns), (name, set(columns) - set(df.columns))
                assert df.height > 0, name
                assert df["step"].unique().to_list() == [step]
                if "tokens_seen" in columns:
                    assert df["tokens_seen"].unique().to_list() == [step * tokens_per_step]
        qk = pl.read_parquet(tiny_run / "results" / "toy" / model / f"step{steps[-1]}" / "qk.parquet")
        assert set(qk["rope"]) == ({"pre", "post"} if model == "toy-neox" else {"pre"})
        assert qk.schema["q_mean"] == pl.List(pl.Float32)
        hidden = pl.read_parquet(tiny_run / "results" / "toy" / model / f"step{steps[-1]}" / "hidden.parquet")
        assert {"resid", "final_ln_in", "final_ln_out"} == set(hidden["site"])
        sweep = pl.read_parquet(tiny_run / "results" / "toy" / model / "sweep.parquet")
        assert set(CONTRACT["metrics.parquet"]) <= set(sweep.columns)
        assert sorted(sweep["step"].unique()) == steps
        assert (sweep["status"] == "ok").all()
        for figure in (tiny_run / "results" / "toy" / model / "figures").iterdir():
            assert figure.stat().st_size > 10_000, figure
        figures = {p.name for p in (tiny_run / "results" / "toy" / model / "figures").glob("*.png")}
        assert figures == {
            *MODEL_FIGURES,
            *QK_SVD_FIGURES,
            "score_hist.png",
            *gradient_figures(config["gradients"]),
            *SPECTRA_FIGURES,
            *PHASES_FIGURES,
            *(WEIGHT_FIGURES if complete(dict(config))["weights"]["enabled"] else ()),
            *(COMPARE_FIGURES if complete(dict(config))["compare"]["enabled"] else ()),
        }
        if complete(dict(config))["compare"]["enabled"]:
            compared = pl.read_parquet(tiny_run / "results" / "toy" / model / "compare.parquet")
            assert {"final", "previous", "layers"} <= set(compared["role"])
            assert {"cka", "svcca", "pwcca"} <= set(compared["metric"])
        phases = pl.read_parquet(tiny_run / "results" / "toy" / model / "phases.parquet")
        assert set(phases.filter(pl.col("scope") == "model")["metric"]) == {"rankme", "rankme_cov", "alpha_req"}
        new_metrics = {"qk_mean_dot", "qk_cos_concat", "partition_isotropy_mm", "drift_avg_cos_p_exact"}
        assert new_metrics <= set(sweep["metric"])
        svd = pl.read_parquet(tiny_run / "results" / "toy" / model / "qk_svd.parquet")
        assert set(svd["basis"]) == {"common", "q", "k"} and sorted(svd["step"].unique()) == steps
        gradients = pl.read_parquet(tiny_run / "results" / "toy" / model / "gradients_sweep.parquet")
        assert sorted(gradients["step"].unique()) == config["gradients"]["steps"]
        assert {"seminmf", "pca", "random"} <= set(gradients["subspace"].drop_nulls())
        assert set(gradients["fit"].drop_nulls()) == {"checkpoint", "fixed"}
        change = gradients.filter(pl.col("measure") == "embedding_change_share")
        assert change["step"].unique().to_list() == [32] and change["step_from"].unique().to_list() == [0]
        grad_metrics = sweep.filter(pl.col("metric").str.starts_with("grad_"))
        assert sorted(grad_metrics["step"].unique()) == config["gradients"]["steps"]
        assert set(grad_metrics["metric"]) == set(GRADIENT_METRICS)  # parameters in columns, not in the name
        assert grad_metrics.select(*METRIC_PARAMETERS).null_count().row(0) == (0, 0, 0, 0)
        fixed_z = grad_metrics.filter(
            (pl.col("metric") == "grad_energy_share_z")
            & (pl.col("subspace") == "seminmf")
            & (pl.col("fit") == "fixed")
            & (pl.col("rank") == 4)
            & (pl.col("stratum") == "all")
        )
        assert sorted(fixed_z["step"].unique()) == config["gradients"]["steps"]
    assert (tiny_run / "results" / "toy" / "figures" / "compare.png").exists()
    untrained = pl.read_parquet(tiny_run / "results" / "untrained" / "untrained.parquet")
    assert untrained["init"].unique().to_list() == ["toy-neox@step0"]  # the toy decoder's own step-0 block
    assert untrained.filter(pl.col("metric") == "norm_mean")["value"].is_finite().all()


def test_fetched_checkpoints_are_removed_once_extracted(tiny_run):
    assert (tiny_run / "resources" / "toy" / "toy-bert" / "step32").is_dir()
    assert not list((tiny_run / "weights").rglob("checkpoint.json"))


def test_training_changes_the_geometry(tiny_run):
    """The residual stream's anisotropy at the last checkpoint is far from the initialisation's."""
    for model in ("toy-bert", "toy-neox"):
        sweep = pl.read_parquet(tiny_run / "results" / "toy" / model / "sweep.parquet")
        avg_cos = sweep.filter((pl.col("metric") == "avg_cos") & (pl.col("site") == "resid") & (pl.col("layer") > 0))
        first = avg_cos.filter(pl.col("step") == 0)["value"].mean()
        last = avg_cos.filter(pl.col("step") == 32)["value"].mean()
        assert abs(last - first) > 0.1, model


def test_report_renders(tiny_run):
    done = snakemake(tiny_run, "--report", str(tiny_run / "report.zip"), configfile=tiny_run / "tiny.yaml")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tiny_run / "report.zip").stat().st_size > 50_000
    with zipfile.ZipFile(tiny_run / "report.zip") as report:
        html = next(report.read(name).decode() for name in report.namelist() if name.endswith("report.html"))
    panels = re.findall(r'"params": "((?:[^"\\]|\\.)*)"', html)
    assert any("out_dir=results/toy/toy-neox/figures" in panel for panel in panels), panels
    for panel in panels:  # a figure's parameters panel shows its settings, not the workflow's plumbing
        assert sys.executable not in panel and "rc=$?" not in panel, panel


def bad_config(tmp_path: Path, change) -> Path:
    config = yaml.safe_load(TINY.read_text())
    change(config)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda c: c["extract"].update(n_sequences="many"), "n_sequences"),
        (lambda c: c["extract"].update(batchsize=4), "batchsize"),
        (lambda c: c["models"][0].update(family="pythia", name="pythia-71m", steps=[0]), "pythia-70m"),
        (lambda c: c["models"][0].update(steps=[3]), "step"),
        (lambda c: c.update(untrained={**UNTRAINED, "inits": [{"model": "toy-gpt"}]}), "toy-gpt"),
    ],
    ids=["wrong-type", "unknown-key", "unknown-model", "unknown-step", "unknown-untrained-init"],
)
def test_bad_config_stops_before_any_work(tmp_path, change, named):
    done = snakemake(tmp_path, configfile=bad_config(tmp_path, change), timeout=120)
    assert done.returncode != 0
    assert named in done.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "resources").exists()
