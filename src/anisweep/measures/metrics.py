"""Per-checkpoint metrics from the Parquet that extract wrote (no model is ever run here).

Every number lands in one tidy table (layer, head, site, metric, subspace, fit, rank, stratum, value): head is
null for per-layer values, layer is null for whole-model values (embedding matrices, correlations over layers);
subspace, fit, rank and stratum are the gradient analysis's parameters, null for every other metric. What each
metric and site means: anisweep.measures.glossary (docs/metrics.md).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import polars as pl

from anisweep.measures import geometry
from anisweep.tables import ATTENTION_STATISTICS, IDENTITY, METRIC_KEY, metric_rows, read_parquet


def _identity(df: pl.DataFrame) -> dict:
    return {key: df[key][0] for key in IDENTITY}


def qk_rows(qk: pl.DataFrame) -> list[dict]:
    """Alignment recomputed from the stored means, so a change to metrics.py needs no model run."""
    rows = []
    means: dict[tuple[int, str], list[tuple[int, np.ndarray, np.ndarray]]] = {}
    for r in qk.iter_rows(named=True):
        q, k = np.asarray(r["q_mean"], np.float64), np.asarray(r["k_mean"], np.float64)
        site = f"qk_{r['rope']}"
        means.setdefault((r["layer"], site), []).append((r["head"], q, k))
        cos, score = geometry.qk_alignment(q, k)
        values = {
            "qk_cos": cos,
            "qk_mean_score": score,
            "qk_mean_dot": geometry.qk_mean_dot(q, k),
            "q_norm_mean": r["q_norm_mean"],
            "k_norm_mean": r["k_norm_mean"],
        }
        rows += [
            {"layer": r["layer"], "head": r["head"], "site": site, "metric": m, "value": v} for m, v in values.items()
        ]
    per_layer: dict[tuple[int, str], list[float]] = {}
    for row in rows:
        if row["metric"] == "qk_cos":
            per_layer.setdefault((row["layer"], row["site"]), []).append(abs(row["value"]))
    rows += [
        {"layer": layer, "site": site, "metric": "qk_cos_abs_mean", "value": float(np.mean(v))}
        for (layer, site), v in sorted(per_layer.items())
    ]
    for (layer, site), heads in sorted(means.items()):
        heads.sort(key=lambda h: h[0])
        concat = geometry.qk_cos_concat([q for _, q, _ in heads], [k for _, _, k in heads])
        rows.append({"layer": layer, "site": site, "metric": "qk_cos_concat", "value": concat})
    return rows


def attention_rows(attention: pl.DataFrame) -> list[dict]:
    rows = []
    for r in attention.iter_rows(named=True):
        rows += [
            {"layer": r["layer"], "head": r["head"], "site": "attention", "metric": m, "value": r[m]}
            for m in ATTENTION_STATISTICS
        ]
    per_layer = attention.group_by("layer").agg(pl.col(list(ATTENTION_STATISTICS)).mean()).sort("layer")
    for r in per_layer.iter_rows(named=True):
        rows += [{"layer": r["layer"], "site": "attention", "metric": m, "value": r[m]} for m in ATTENTION_STATISTICS]
    return rows


def stats_rows(stats: pl.DataFrame) -> list[dict]:
    """Exact statistics over every valid token, from the streamed sums."""
    rows = []
    for r in stats.iter_rows(named=True):
        n = r["n"]
        drift_norm, drift_ratio = geometry.drift_from_sums(np.asarray(r["sum_x"]), r["sum_norm"], n)
        norm_mean, norm_std = geometry.norm_spread_from_sums(r["sum_norm"], r["sum_norm_sq"], n)
        values = {
            "avg_cos": geometry.avg_cos_from_sums(np.asarray(r["sum_unit"]), n - (r.get("n_zero") or 0)),
            "drift_norm": drift_norm,
            "drift_ratio": drift_ratio,
            "norm_mean": norm_mean,
            "norm_std": norm_std,
            "norm_cv": norm_std / norm_mean if norm_mean else float("nan"),
            "norm_min": r["norm_min"],
            "norm_max": r["norm_max"],
            "n_tokens": n,
            "n_nonfinite": r["n_nonfinite"],
            "dim": r["d"],
        }
        rows += [{"layer": r["layer"], "site": r["site"], "metric": m, "value": v} for m, v in values.items()]
    return rows


def sample_rows(hidden: pl.DataFrame) -> list[dict]:
    """Metrics that need the point cloud, on the seeded sample of tokens."""
    rows = []
    for (layer, site), group in sorted(hidden.group_by("layer", "site"), key=lambda g: g[0]):
        x = np.stack(group["vector"].to_list()).astype(np.float64)
        x = x[np.isfinite(x).all(axis=1)]
        n, d = x.shape
        nan = float("nan")
        values = {"centred_avg_cos": nan, "isoscore": nan, "top_eig_share": nan, "n_sampled": n}
        if n >= 2:  # fewer: every sampled vector non-finite (a diverged layer), flagged by n_nonfinite
            values["centred_avg_cos"] = geometry.centred_avg_cos(x)
            values["top_eig_share"] = geometry.top_eig_share(x)
        if n >= d:
            values["isoscore"] = geometry.isoscore(x)
        elif n >= 2:
            warnings.warn(
                f"layer {layer} {site}: {n} sampled tokens < d = {d}; IsoScore is NaN (raise extract.sample_tokens)",
                stacklevel=2,
            )
        rows += [{"layer": layer, "site": site, "metric": m, "value": v} for m, v in values.items()]
    return rows


def qk_sample_rows(qk_sample: pl.DataFrame) -> list[dict]:
    """Anisotropy of the queries and of the keys themselves per head (Godey et al. 2024, Sec. 5): exact
    all-pairs avg_cos and drift ratio within the sampled q vectors, and within the sampled k vectors."""
    rows = []
    for (layer, head, rope), group in sorted(qk_sample.group_by("layer", "head", "rope"), key=lambda g: g[0]):
        for which in ("q", "k"):
            x = np.stack(group[which].to_list()).astype(np.float64)
            x = x[np.isfinite(x).all(axis=1)]
            values = {f"{which}_avg_cos": geometry.avg_cos(x), f"{which}_drift_ratio": geometry.drift(x)[1]}
            rows += [
                {"layer": layer, "head": head, "site": f"qk_{rope}", "metric": m, "value": v} for m, v in values.items()
            ]
    return rows


def correlation_rows(stat_rows: list[dict]) -> list[dict]:
    """Drift vs anisotropy over the residual-stream layers (Godey Fig. 5, 16)."""
    by_layer = {}
    for r in stat_rows:
        if r["site"] == "resid" and r["metric"] in ("drift_norm", "avg_cos"):
            by_layer.setdefault(r["layer"], {})[r["metric"]] = r["value"]
    layers = sorted(by_layer)
    result = geometry.layer_correlations(
        [by_layer[layer]["drift_norm"] for layer in layers], [by_layer[layer]["avg_cos"] for layer in layers]
    )
    return [{"site": "resid", "metric": f"drift_avg_cos_{k}", "value": v} for k, v in result.items()]


def layernorm_rows(layernorm: pl.DataFrame, stats: pl.DataFrame) -> list[dict]:
    rows = []
    for r in layernorm.iter_rows(named=True):
        if r["gain"] is None:  # a norm without parameters (OLMo): nothing to describe
            continue
        bias = None if r["bias"] is None else np.asarray(r["bias"], dtype=np.float64)
        values = geometry.layernorm_param_stats(np.asarray(r["gain"]), bias)
        if r["site"] == "final_ln" and bias is not None:
            out = stats.filter((pl.col("layer") == r["layer"]) & (pl.col("site") == "final_ln_out")).row(0, named=True)
            values["bias_drift_share"] = geometry.bias_drift_share(bias, np.asarray(out["sum_x"]) / max(out["n"], 1))
        rows += [{"layer": r["layer"], "site": r["site"], "metric": m, "value": v} for m, v in values.items()]
    return rows


def embedding_rows(embeddings: pl.DataFrame) -> list[dict]:
    return [{"site": r["matrix"], "metric": r["metric"], "value": r["value"]} for r in embeddings.iter_rows(named=True)]


def checkpoint_metrics(extract_dir: str | Path, gradients: str | Path | None = None) -> pl.DataFrame:
    """Every metric of one checkpoint, from extract's tables in `extract_dir`, and with `gradients` (the
    checkpoint's gradients.parquet) the gradient analysis's shares (anisweep.measures.gradient_metrics)."""
    extract_dir = Path(extract_dir)
    read = lambda name: read_parquet(extract_dir / f"{name}.parquet")  # noqa: E731
    qk, attention, stats = read("qk"), read("attention"), read("hidden_stats")
    stat_rows = stats_rows(stats)
    rows = (
        qk_rows(qk)
        + attention_rows(attention)
        + stat_rows
        + sample_rows(read("hidden"))
        + correlation_rows(stat_rows)
        + layernorm_rows(read("layernorm"), stats)
        + embedding_rows(read("embeddings"))
        + qk_sample_rows(read("qk_sample"))
    )
    if gradients is not None:
        from anisweep.measures.gradient_metrics import gradient_metric_rows

        rows += gradient_metric_rows(read_parquet(gradients))
    return metric_rows(_identity(qk), rows).sort(list(METRIC_KEY), nulls_last=True)
