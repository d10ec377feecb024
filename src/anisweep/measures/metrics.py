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

from anisweep.measures import geometry, ln_outliers, massive, rogue, sinks, spectra, spectral
from anisweep.measures.grouped import vectors_by_group
from anisweep.measures.registry import (
    GRADIENT_MEASURE,
    CheckpointTables,
    Measure,
    builtin_measure,
    measure_frame,
    measure_of,
)
from anisweep.tables import (
    ATTENTION_STATISTICS,
    IDENTITY,
    METRIC_KEY,
    check_metric_keys,
    in_metric_schema,
    metric_rows,
    read_parquet,
)


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
        norm_mean, norm_std = geometry.norm_spread_from_moments(r["sum_norm"], r["m2_norm"], n)
        avg_cos = geometry.avg_cos_from_sums(np.asarray(r["sum_unit"]), n - (r.get("n_zero") or 0))
        values = {
            "avg_cos": avg_cos,
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
            "isotropic_cos_q95": geometry.isotropic_cos_quantile(r["d"], 0.95),
            "avg_cos_isotropic_sf": geometry.isotropic_cos_sf(r["d"], avg_cos),
        }
        rows += [{"layer": r["layer"], "site": r["site"], "metric": m, "value": v} for m, v in values.items()]
    return rows


#: The seed of the order avg_cos_pairs draws its pairs in: the same pairs of sampled tokens at every checkpoint.
PAIR_SEED = 0


def sample_rows(hidden: pl.DataFrame) -> list[dict]:
    """Metrics that need the point cloud, on the seeded sample of tokens."""
    rows = []
    for (layer, site), group in vectors_by_group(hidden, ("layer", "site"), ("vector",)):
        x = group["vector"]
        x = x[np.isfinite(x).all(axis=1)]
        n, d = x.shape
        nan = float("nan")
        pairs, pairs_se, n_pairs = geometry.pair_avg_cos(x, seed=PAIR_SEED)
        spread = geometry.relative_spread(x)
        values = {"centred_avg_cos": nan, "isoscore": nan, "top_eig_share": nan, "n_sampled": n}
        values |= {"avg_cos_pairs": pairs, "avg_cos_pairs_se": pairs_se, "n_pairs": n_pairs, "relative_spread": spread}
        if n < 2:  # every sampled vector non-finite (a diverged layer), flagged by n_nonfinite
            pass
        elif not spread >= geometry.SPREAD_TOLERANCE:
            warnings.warn(
                f"layer {layer} {site}: the {n} sampled vectors have no spread (relative_spread {spread:.3g} <"
                f" {geometry.SPREAD_TOLERANCE:g}: one vector up to rounding); centred_avg_cos, isoscore and"
                " top_eig_share are NaN (status nan)",
                stacklevel=2,
            )
        else:
            values["centred_avg_cos"] = geometry.centred_avg_cos(x)
            values["top_eig_share"] = geometry.top_eig_share(x)
            if n >= d:
                values["isoscore"] = geometry.isoscore(x)
            else:
                warnings.warn(
                    f"layer {layer} {site}: {n} sampled tokens < d = {d}; IsoScore is NaN (raise"
                    " extract.sample_tokens)",
                    stacklevel=2,
                )
        rows += [{"layer": layer, "site": site, "metric": m, "value": v} for m, v in values.items()]
    return rows


def qk_sample_rows(qk_sample: pl.DataFrame) -> list[dict]:
    """Anisotropy of the queries and of the keys themselves per head (Godey et al. 2024, Sec. 5): exact
    all-pairs avg_cos and drift ratio within the sampled q vectors, and within the sampled k vectors."""
    rows = []
    for (layer, head, rope), group in vectors_by_group(qk_sample, ("layer", "head", "rope"), ("q", "k")):
        for which in ("q", "k"):
            x = group[which]
            x = x[np.isfinite(x).all(axis=1)]
            values = {f"{which}_avg_cos": geometry.avg_cos(x), f"{which}_drift_ratio": geometry.drift(x)[1]}
            rows += [
                {"layer": layer, "head": head, "site": f"qk_{rope}", "metric": m, "value": v} for m, v in values.items()
            ]
    return rows


def spectral_rows(hidden: pl.DataFrame) -> list[dict]:
    """The shape of each sampled site's spectrum (anisweep.measures.spectral): its uncentred singular values, as
    spectra.parquet holds them, and its centred covariance's eigenvalues."""
    rows = []
    for (layer, site), group in vectors_by_group(hidden, ("layer", "site"), ("vector",)):
        x = group["vector"]
        x = x[np.isfinite(x).all(axis=1)]
        singular, _ = spectra.spectrum(x)
        values = spectral.sample_spectral_values(x, singular)
        rows += [{"layer": layer, "site": site, "metric": m, "value": v} for m, v in values.items()]
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


# --------------------------------------------------------------------------- the built-in measures
# Registered as a user's table measures are, their tables and figures named in anisweep.measures.registry.BUILTIN.


@builtin_measure("qk_alignment")
def qk_alignment(tables) -> list[dict]:
    """Query-key alignment per head from the mean queries and keys (qk_cos, qk_mean_score, qk_mean_dot, their
    norms) and per layer (qk_cos_abs_mean, qk_cos_concat)."""
    return qk_rows(tables.qk)


@builtin_measure("attention")
def attention(tables) -> list[dict]:
    """Attention entropy, softmax max / median / min and the pre-softmax scores' mean and std, per head and
    per layer."""
    return attention_rows(tables.attention)


@builtin_measure("stream_geometry")
def stream_geometry(tables) -> list[dict]:
    """Exact statistics over every valid token at each hidden site: avg_cos, drift, norms."""
    return stats_rows(tables.hidden_stats)


@builtin_measure("sample_geometry")
def sample_geometry(tables) -> list[dict]:
    """Statistics of the sampled point cloud at each sampled site: centred avg_cos, IsoScore, top eigenvalue
    share."""
    return sample_rows(tables.hidden)


@builtin_measure("drift_correlation")
def drift_correlation(tables) -> list[dict]:
    """Correlation of drift and anisotropy over the residual-stream layers (Godey et al. 2024, Fig. 5 and 16)."""
    return correlation_rows(stats_rows(tables.hidden_stats))


@builtin_measure("layernorm")
def layernorm(tables) -> list[dict]:
    """Each norm's gain and bias, and the final LayerNorm bias's share of the output drift."""
    return layernorm_rows(tables.layernorm, tables.hidden_stats)


@builtin_measure("embeddings")
def embeddings(tables) -> list[dict]:
    """Isotropy of the embedding matrices (partition isotropy I(W), avg_cos)."""
    return embedding_rows(tables.embeddings)


@builtin_measure("qk_anisotropy")
def qk_anisotropy(tables) -> list[dict]:
    """Anisotropy of the sampled queries and of the sampled keys themselves, per head."""
    return qk_sample_rows(tables.qk_sample)


@builtin_measure("rogue_dimensions")
def rogue_dimensions(tables) -> list[dict]:
    """Rogue dimensions (Timkey & van Schijndel 2021): each dimension's exact contribution to avg_cos over every
    valid token, the top 1, 3 and 10 dimensions' share and which they are, the dimensions that make 90%; and
    avg_cos after standardising each dimension (exact per-dimension mean and std, over the token sample), at the
    residual stream and the final norm's input and output."""
    return rogue.rogue_rows(tables.hidden_stats, tables.samples())


@builtin_measure("massive_activations")
def massive_activations(tables) -> list[dict]:
    """Massive activations (Sun et al. 2024): the largest |activation| over every valid token against the median
    |activation| of the token sample, per layer; the dimensions that hold the largest, and where the largest sit
    (first token, delimiters, others)."""
    return massive.massive_rows(tables.hidden_stats, tables.samples(), tables.massive)


@builtin_measure("attention_sinks")
def attention_sinks(tables) -> list[dict]:
    """Attention sinks (Xiao et al. 2024), per head and per layer: the mean attention on the first key and on
    each row's most-attended key, over every valid query row; the key that receives the most and the kinds of
    the keys that receive the most (first token, delimiters, others); and Gu et al. 2024's Sink_1^epsilon, the share
    of sequences whose first key's importance exceeds epsilon."""
    epsilon = tables.settings.get("sink_epsilon", sinks.EPSILON)
    return sinks.sink_rows(tables.sinks, tables.sink_keys, tables.attention, epsilon)


@builtin_measure("layernorm_outliers")
def layernorm_outliers(tables) -> list[dict]:
    """LayerNorm outlier dimensions (Kovaleva et al. 2021): each norm's gain and bias entries more than 3 standard
    deviations from their mean, counted, and whether they are the rogue dimensions of the residual stream there."""
    return ln_outliers.ln_outlier_rows(tables.layernorm, tables.hidden_stats)


@builtin_measure("spectral")
def spectral_shape(tables) -> list[dict]:
    """The shape of each sampled site's spectrum: RankMe (Garrido et al. 2023), alpha-ReQ (Agrawal et al. 2022,
    fitted as Li et al. 2025), proportional effective rank and condition number (pico-analyze)."""
    return spectral_rows(tables.hidden)


BUILTIN = (  # in anisweep.measures.registry.BUILTIN's order (a test keeps it)
    qk_alignment,
    attention,
    stream_geometry,
    sample_geometry,
    drift_correlation,
    layernorm,
    embeddings,
    qk_anisotropy,
    rogue_dimensions,
    massive_activations,
    attention_sinks,
    layernorm_outliers,
    spectral_shape,
)


def builtin_measures() -> list[Measure]:
    """The built-in table measures as the registry sees them, in the order metrics.parquet lists them."""
    return [measure_of(fn, f"anisweep.measures.metrics:{fn.__name__}", builtin=True) for fn in BUILTIN]


def checkpoint_metrics(
    extract_dir: str | Path,
    gradients: str | Path | None = None,
    measure_tables: list[str | Path] = (),
    sink_epsilon: float = sinks.EPSILON,
) -> pl.DataFrame:
    """Every metric of one checkpoint: the built-in measures' rows from extract's tables in `extract_dir`; with
    `gradients` (the checkpoint's gradients.parquet) the gradient analysis's shares
    (anisweep.measures.gradient_metrics); and the rows of the user's measures in `measure_tables` (each
    measure's own table, written by its table_measure job or by extract). `sink_epsilon`: the threshold of Gu et al.
    2024's Sink_1^epsilon (config `sinks.epsilon`)."""
    tables = CheckpointTables(extract_dir, settings={"sink_epsilon": sink_epsilon})
    ident = _identity(tables.hidden_stats)  # every model has hidden states; a CNN has no q/k rows
    frames = [measure_frame(m, ident, m.target(tables)) for m in builtin_measures()]
    if gradients is not None:
        from anisweep.measures.gradient_metrics import gradient_metric_rows

        frames.append(metric_rows(ident, gradient_metric_rows(read_parquet(gradients)), GRADIENT_MEASURE))
    frames += [in_metric_schema(read_parquet(path)) for path in measure_tables]
    metrics = pl.concat(frames)
    check_metric_keys(metrics, (*IDENTITY, *METRIC_KEY), "metrics")
    return metrics.sort(list(METRIC_KEY), nulls_last=True)
