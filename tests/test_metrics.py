"""metrics.parquet against independent computations on the very vectors extract kept."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import transformers
from IsoScore import IsoScore
from scipy import stats

from anisweep.metrics import checkpoint_metrics
from anisweep.tables import write_atomic

from conftest import bert_config, neox_config, padded_batch, run_extract, saved

TOL = 1e-6


@pytest.fixture(scope="module", params=["bert", "gpt_neox"])
def measured(request, tmp_path_factory):
    """Extract tables of a tiny model (every valid token sampled) and the metrics computed from them."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    if request.param == "bert":
        path = saved(tmp_path, transformers.BertForMaskedLM, bert_config(), "m")
    else:
        path = saved(tmp_path, transformers.GPTNeoXForCausalLM, neox_config(), "m")
    batch = padded_batch(n=5, t=12)
    tables, _ = run_extract(path, batch)
    for name, df in tables.items():
        write_atomic(df, tmp_path / f"{name}.parquet")
    return tables, checkpoint_metrics(tmp_path)


def value(metrics, metric, site, layer=None, head=None):
    rows = metrics.filter((pl.col("metric") == metric) & (pl.col("site") == site))
    rows = rows.filter(pl.col("layer").is_null() if layer is None else pl.col("layer") == layer)
    rows = rows.filter(pl.col("head").is_null() if head is None else pl.col("head") == head)
    assert rows.height == 1, (metric, site, layer, head, rows)
    return rows["value"][0]


def cloud(tables, layer, site):
    rows = tables["hidden"].filter((pl.col("layer") == layer) & (pl.col("site") == site))
    return np.stack(rows["vector"].to_list()).astype(np.float64)


def test_isotropy_metrics_match_brute_force_on_the_kept_vectors(measured):
    tables, metrics = measured
    for layer, site in tables["hidden"].select("layer", "site").unique().iter_rows():
        x = cloud(tables, layer, site)  # sample_tokens exceeds the batch: every valid token
        unit = x / np.linalg.norm(x, axis=1, keepdims=True)
        pairwise = unit @ unit.T
        n = len(x)
        assert value(metrics, "avg_cos", site, layer) == pytest.approx((pairwise.sum() - n) / (n * (n - 1)), abs=1e-5)
        assert value(metrics, "drift_norm", site, layer) == pytest.approx(np.linalg.norm(x.mean(0)), rel=1e-5)
        ratio = np.linalg.norm(x.mean(0)) / np.linalg.norm(x, axis=1).mean()
        assert value(metrics, "drift_ratio", site, layer) == pytest.approx(ratio, rel=1e-5)
        norms = np.linalg.norm(x, axis=1)
        assert value(metrics, "norm_std", site, layer) == pytest.approx(norms.std(), rel=1e-4, abs=1e-6)
        centred = x - x.mean(0)
        cu = centred / np.linalg.norm(centred, axis=1, keepdims=True)
        assert value(metrics, "centred_avg_cos", site, layer) == pytest.approx(
            ((cu @ cu.T).sum() - n) / (n * (n - 1)), abs=1e-6
        )
        eig = np.linalg.eigvalsh(np.cov(x.T))
        assert value(metrics, "top_eig_share", site, layer) == pytest.approx(eig[-1] / eig.sum(), rel=1e-6)
        assert value(metrics, "isoscore", site, layer) == pytest.approx(float(IsoScore.IsoScore(x)), abs=1e-6)


def test_drift_anisotropy_correlations_match_scipy(measured):
    tables, metrics = measured
    layers = sorted(tables["hidden"].filter(pl.col("site") == "resid")["layer"].unique())
    drift, avg = [], []
    for layer in layers:
        x = cloud(tables, layer, "resid")
        unit = x / np.linalg.norm(x, axis=1, keepdims=True)
        drift.append(np.linalg.norm(x.mean(0)))
        avg.append(((unit.sum(0) ** 2).sum() - len(x)) / (len(x) * (len(x) - 1)))
    spearman, pearson = stats.spearmanr(drift, avg), stats.pearsonr(drift, avg)
    assert value(metrics, "drift_avg_cos_spearman_r", "resid") == pytest.approx(spearman.statistic, abs=1e-9)
    assert value(metrics, "drift_avg_cos_spearman_p", "resid") == pytest.approx(spearman.pvalue, abs=1e-9)
    assert value(metrics, "drift_avg_cos_pearson_r", "resid") == pytest.approx(pearson.statistic, abs=1e-5)
    assert value(metrics, "drift_avg_cos_pearson_p", "resid") == pytest.approx(pearson.pvalue, abs=1e-4)


def test_attention_and_qk_rows_carry_the_extracted_values(measured):
    tables, metrics = measured
    for row in tables["attention"].iter_rows(named=True):
        assert value(metrics, "entropy_mean", "attention", row["layer"], row["head"]) == row["entropy_mean"]
    per_layer = tables["attention"].group_by("layer").agg(pl.col("entropy_norm_mean").mean())
    for layer, mean in per_layer.iter_rows():
        assert value(metrics, "entropy_norm_mean", "attention", layer) == pytest.approx(mean, abs=TOL)
    for row in tables["qk"].iter_rows(named=True):
        assert value(metrics, "qk_cos", f"qk_{row['rope']}", row["layer"], row["head"]) == pytest.approx(
            row["qk_cos"], abs=TOL
        )


def test_final_layernorm_parameters_and_bias_share(measured):
    tables, metrics = measured
    ln = tables["layernorm"].filter(pl.col("site") == "final_ln").row(0, named=True)
    gain, bias = np.asarray(ln["gain"], dtype=np.float64), np.asarray(ln["bias"], dtype=np.float64)
    layer = ln["layer"]
    assert value(metrics, "gain_mean", "final_ln", layer) == pytest.approx(gain.mean(), rel=1e-6)
    assert value(metrics, "gain_std", "final_ln", layer) == pytest.approx(gain.std(), rel=1e-5)
    assert value(metrics, "bias_norm", "final_ln", layer) == pytest.approx(np.linalg.norm(bias), rel=1e-6)
    mean_out = cloud(tables, layer, "final_ln_out").mean(0)
    assert value(metrics, "bias_drift_share", "final_ln", layer) == pytest.approx(
        bias @ mean_out / (mean_out @ mean_out), rel=1e-4
    )


def test_embedding_isotropy_is_carried_over(measured):
    tables, metrics = measured
    for row in tables["embeddings"].iter_rows(named=True):
        assert value(metrics, row["metric"], row["matrix"]) == row["value"]


def test_identity_and_schema(measured):
    _, metrics = measured
    assert metrics.columns == [
        "family",
        "model",
        "seed",
        "step",
        "tokens_seen",
        "layer",
        "head",
        "site",
        "metric",
        "value",
    ]
    assert metrics["step"].unique().to_list() == [3]
    assert metrics.filter(pl.col("metric") == "n_nonfinite")["value"].sum() == 0
