"""metrics.parquet against independent computations on the very vectors extract kept."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import polars as pl
import pytest
import transformers
from IsoScore import IsoScore
from scipy import stats
from test_geometry import machina_mercer_iw, naive_partition_isotropy

from anisweep.measures.gradient_metrics import GRADIENT_METRICS
from anisweep.measures.metrics import checkpoint_metrics
from anisweep.tables import IDENTITY, METRIC_KEY, METRIC_SCHEMA, with_identity, write_atomic
from anisweep.tangent.analysis import analyse
from anisweep.tangent.backward import gradient_pass, load_lm
from anisweep.tangent.batch import causal_lm_batch, masked_lm_batch
from anisweep.tangent.settings import GradientSettings

from conftest import bert_config, neox_config, padded_batch, run_extract, saved

TOL = 1e-6


def gradients_parquet(path, batch, out, ident) -> None:
    """gradients.parquet of a saved tiny LM as the gradients rule writes it, with subspaces fitted per checkpoint
    and held fixed (its own bases as the fixed ones), at two ranks."""
    model, adapter = load_lm(path)
    geometry = adapter.geometry(model.config)
    valid = batch["attention_mask"].bool()
    if geometry.causal:
        lm = causal_lm_batch(batch["input_ids"], valid)
    else:
        lm = masked_lm_batch(batch["input_ids"], valid, 4, [0, 1, 2, 3, 4], 60, probability=0.3, seed=0)
    settings = GradientSettings(rank=[2, 4], n_random=4)
    result = gradient_pass(model, adapter, geometry.d_model, geometry.n_layers, lm, settings, 5, progress=False)
    own: dict = {}
    analyse(result, settings, geometry.d_model, progress=False, bases_out=own)
    both = GradientSettings(rank=[2, 4], n_random=4, subspaces="both")
    write_atomic(with_identity(analyse(result, both, geometry.d_model, progress=False, fixed=own), ident), out)


def measure_checkpoint(tmp_path, cls, config):
    """Extract tables of a tiny model (every valid token sampled), its gradients.parquet, and the metrics
    computed from both as the metrics rule computes them."""
    path = saved(tmp_path, cls, config, "m")
    batch = padded_batch(n=5, t=12)
    tables, _ = run_extract(path, batch)
    for name, df in tables.items():
        write_atomic(df, tmp_path / f"{name}.parquet")
    ident = {key: tables["qk"][key][0] for key in IDENTITY}
    gradients_parquet(path, batch, tmp_path / "gradients.parquet", ident)
    metrics = checkpoint_metrics(tmp_path, tmp_path / "gradients.parquet")
    return {**tables, "gradients": pl.read_parquet(tmp_path / "gradients.parquet")}, metrics


@pytest.fixture(scope="module", params=["bert", "gpt_neox"])
def measured(request, tmp_path_factory):
    """Extract tables of a tiny model and the metrics computed from them (with the gradient analysis's rows)."""
    tmp_path = tmp_path_factory.mktemp(request.param)
    if request.param == "bert":
        return measure_checkpoint(tmp_path, transformers.BertForMaskedLM, bert_config())
    return measure_checkpoint(tmp_path, transformers.GPTNeoXForCausalLM, neox_config())


def value(metrics, metric, site, layer=None, head=None):
    rows = metrics.filter((pl.col("metric") == metric) & (pl.col("site") == site))
    rows = rows.filter(pl.col("layer").is_null() if layer is None else pl.col("layer") == layer)
    rows = rows.filter(pl.col("head").is_null() if head is None else pl.col("head") == head)
    assert rows.height == 1, (metric, site, layer, head, rows)
    return rows["value"][0]


def cloud(tables, layer, site):
    rows = tables["hidden"].filter((pl.col("layer") == layer) & (pl.col("site") == site))
    return np.stack(rows["vector"].to_list()).astype(np.float64)


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
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
    n = len(layers)
    assert n <= 8  # every ordering of the layers enumerated
    orders = [list(order) for order in itertools.permutations(range(n))]
    for name, statistic in (("spearman", stats.spearmanr), ("pearson", stats.pearsonr)):
        r = statistic(drift, avg).statistic
        null = np.array([statistic(drift, np.asarray(avg)[order]).statistic for order in orders])
        p = min(1.0, 2 * min((null <= r + 1e-9).mean(), (null >= r - 1e-9).mean()))
        assert value(metrics, f"drift_avg_cos_{name}_r", "resid") == pytest.approx(r, abs=1e-5)
        assert value(metrics, f"drift_avg_cos_{name}_p", "resid") == pytest.approx(p, abs=1e-12)
    assert value(metrics, "drift_avg_cos_p_exact", "resid") == 1.0
    assert value(metrics, "drift_avg_cos_n_permutations", "resid") == math.factorial(n)


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


def test_qk_mean_dot_and_concatenated_cosine_from_the_stored_means(measured):
    tables, metrics = measured
    qk = tables["qk"]
    for row in qk.iter_rows(named=True):
        q, k = np.asarray(row["q_mean"], np.float64), np.asarray(row["k_mean"], np.float64)
        site = f"qk_{row['rope']}"
        dot = sum(qi * ki for qi, ki in zip(q.tolist(), k.tolist()))
        assert value(metrics, "qk_mean_dot", site, row["layer"], row["head"]) == pytest.approx(dot, rel=1e-9)
        assert value(metrics, "qk_mean_score", site, row["layer"], row["head"]) == pytest.approx(
            dot / np.sqrt(len(q)), rel=1e-9
        )
    for (layer, rope), group in qk.group_by("layer", "rope"):
        group = group.sort("head")
        q = np.concatenate([np.asarray(v, np.float64) for v in group["q_mean"]])
        k = np.concatenate([np.asarray(v, np.float64) for v in group["k_mean"]])
        assert len(q) == group.height * len(group["q_mean"][0])
        expected = 1 - 0.5 * np.sum((q / np.linalg.norm(q) - k / np.linalg.norm(k)) ** 2)  # cos from the chord
        assert value(metrics, "qk_cos_concat", f"qk_{rope}", layer) == pytest.approx(expected, abs=1e-9)


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
    assert set(tables["embeddings"]["metric"]) == {
        "partition_isotropy",
        "partition_isotropy_centred",
        "partition_isotropy_mm",
        "partition_isotropy_mm_centred",
    }


def test_embedding_isotropy_both_conventions_against_the_weights(tmp_path):
    path = saved(tmp_path, transformers.GPTNeoXForCausalLM, neox_config(), "m")
    tables, _ = run_extract(path, padded_batch(n=2, t=6))
    model = transformers.GPTNeoXForCausalLM.from_pretrained(path)
    weights = {"embed_in": model.get_input_embeddings().weight, "embed_out": model.get_output_embeddings().weight}
    for name, weight in weights.items():
        w = weight.detach().double().numpy()
        for centre, suffix in ((False, ""), (True, "_centred")):
            rows = tables["embeddings"].filter(pl.col("matrix") == name)
            got = dict(zip(rows["metric"], rows["value"]))
            assert got[f"partition_isotropy_mm{suffix}"] == pytest.approx(machina_mercer_iw(w, centre), rel=1e-6)
            assert got[f"partition_isotropy{suffix}"] == pytest.approx(naive_partition_isotropy(w, centre), rel=1e-6)
            assert got[f"partition_isotropy{suffix}"] <= got[f"partition_isotropy_mm{suffix}"]


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
        "subspace",
        "fit",
        "rank",
        "stratum",
        "value",
        "measure",
        "reason",
    ]
    assert list(metrics.schema.items()) == list(METRIC_SCHEMA.items())
    assert metrics["measure"].null_count() == 0
    assert metrics["reason"].null_count() == metrics.height  # every built-in table measure runs on a BERT
    assert metrics["step"].unique().to_list() == [3]
    assert metrics.filter(pl.col("metric") == "n_nonfinite")["value"].sum() == 0
    assert not metrics.select(list(METRIC_KEY)).is_duplicated().any()  # the key columns name every row


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
def test_gradient_metrics_carry_their_parameters_in_columns_not_in_the_name(measured):
    tables, metrics = measured
    names = set(metrics["metric"])
    # the old form put them into the name: grad_energy_share_seminmf_fixed_k16_rare_z
    assert not [name for name in names if re.search(r"_k\d+_|_k\d+$", name)]
    grad = metrics.filter(pl.col("metric").str.starts_with("grad_"))
    assert set(grad["metric"]) == set(GRADIENT_METRICS)
    assert grad.select("subspace", "fit", "rank", "stratum").null_count().row(0) == (0, 0, 0, 0)
    assert set(grad["subspace"]) == {"seminmf", "pca", "pca_uncentred"} and set(grad["fit"]) == {"checkpoint", "fixed"}
    assert set(grad["rank"]) == {2, 4} and "all" in set(grad["stratum"])
    other = metrics.filter(~pl.col("metric").str.starts_with("grad_"))
    assert other.select("subspace", "fit", "rank", "stratum").null_count().row(0) == (other.height,) * 4
    # one row per (site, layer, subspace, fit, rank, stratum) and statistic
    per = grad.group_by("layer", "site", "subspace", "fit", "rank", "stratum").agg(pl.col("metric").sort())
    assert all(sorted(m) == sorted(GRADIENT_METRICS) for m in per["metric"])
    shares = tables["gradients"].filter(pl.col("measure").is_in(["energy_share", "anisotropy_share"]))
    shares = shares.filter(pl.col("subspace") != "random")
    assert grad.height == 3 * shares.height > 0
    for r in shares.iter_rows(named=True):
        for column, suffix in (("value", ""), ("control_mean", "_control_mean"), ("z", "_z")):
            where = {k: r[k] for k in ("layer", "site", "subspace", "fit", "rank", "stratum")}
            row = grad.filter(pl.col("metric") == f"grad_{r['measure']}{suffix}", **where)
            assert row["value"].to_list() == [r[column]], (where, column)


def test_a_sample_without_spread_is_nan_with_its_reason_and_status_nan(tmp_path):
    """Issue 43 item 8: a corpus of one repeated word makes every sampled vector of a layer the same up to rounding;
    IsoScore, the top eigenvalue's share and centred avg_cos there are NaN, said in a warning and by the layer's
    relative_spread, and the sweep marks them `nan`, never `ok`; the other layer keeps its numbers."""
    from anisweep.measures.metrics import builtin_measures, sample_geometry, sample_rows
    from anisweep.measures.registry import measure_frame
    from anisweep.measures.sweep import aggregate

    rng = np.random.default_rng(0)
    same = np.float32(1e-7) * (1 + 3e-7 * rng.standard_normal((64, 8))).astype(np.float32)
    spread = rng.standard_normal((64, 8)).astype(np.float32)
    hidden = pl.DataFrame(
        {
            "layer": [1] * 64 + [2] * 64,
            "site": ["resid"] * 128,
            "seq": list(range(128)),
            "position": [0] * 128,
            "token_id": [7] * 128,
            "vector": [row.tolist() for row in np.concatenate([same, spread])],
        },
        schema_overrides={"vector": pl.List(pl.Float32)},
    )
    with pytest.warns(UserWarning, match=r"layer 1 resid: the 64 sampled vectors have no spread \(relative_spread"):
        rows = sample_rows(hidden)
    values = {(r["layer"], r["metric"]): r["value"] for r in rows}
    for metric in ("isoscore", "top_eig_share", "centred_avg_cos"):
        assert np.isnan(values[(1, metric)]) and np.isfinite(values[(2, metric)]), metric
    assert values[(1, "relative_spread")] < 1e-10 < values[(2, "relative_spread")]
    measure = next(m for m in builtin_measures() if m.target is sample_geometry)
    ident = {"family": "test", "model": "m", "seed": 0, "step": 3, "tokens_seen": 30}
    folder = tmp_path / "step3"
    folder.mkdir()
    write_atomic(measure_frame(measure, ident, rows), folder / "metrics.parquet")
    sweep = aggregate([folder / "metrics.parquet"])
    status = dict(sweep.filter(pl.col("layer") == 1).select("metric", "status").iter_rows())
    assert status["isoscore"] == status["top_eig_share"] == status["centred_avg_cos"] == "nan"
    assert status["avg_cos_pairs"] == "ok"
