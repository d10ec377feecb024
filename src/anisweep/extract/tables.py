"""extract's tables of one checkpoint, built from a Recorder's accumulators and the model's weights
(anisweep.tables names them and their columns, EXTRACT_SCHEMAS, and holds what the tables share)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import polars as pl
from torch import nn

from anisweep.adapters import Adapter
from anisweep.adapters.base import norm_parameters
from anisweep.extract import outlier_tables
from anisweep.extract.recorder import Recorder
from anisweep.extract.unit_tables import units_table
from anisweep.measures import geometry
from anisweep.sample_storage import vector_columns
from anisweep.tables import EXTRACT_SCHEMAS, EXTRACT_TABLES, with_identity

if TYPE_CHECKING:
    from anisweep.extract.model import LoadedModel


def _f32_lists(arrays) -> pl.Series:
    return pl.Series([np.asarray(a, dtype=np.float32).tolist() for a in arrays], dtype=pl.List(pl.Float32))


def qk_table(recorder: Recorder, cross: bool = False) -> pl.DataFrame:
    """One row per query head: its mean q, and the mean k of the key head it attends with (`kv_head`; the
    same index unless the model has grouped-query attention, where k_mean and k_norm_mean repeat over the
    query heads that share a key head). `cross`: the cross-attention's q (decoder) and k (encoder)."""
    group = 1 if cross else recorder.geometry.group
    rows = []
    q_sites = {(layer, "pre"): s for layer, s in recorder.cross_q.items()} if cross else recorder.q
    k_sites = {(layer, "pre"): s for layer, s in recorder.cross_k.items()} if cross else recorder.k
    for (layer, rope), q_stats in sorted(q_sites.items()):
        k_stats = k_sites[(layer, rope)]
        n, n_k = max(q_stats.n, 1), max(k_stats.n, 1)  # fewer keys than queries: MiT's spatial reduction
        q_mean = (q_stats.sum_x / n).cpu().numpy()
        k_mean = (k_stats.sum_x / n_k).cpu().numpy()
        for head in range(q_mean.shape[0]):
            kv_head = head // group
            cos, score = geometry.qk_alignment(q_mean[head], k_mean[kv_head])
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "kv_head": kv_head,
                    "rope": rope,
                    "n_tokens": q_stats.n,
                    "q_mean": q_mean[head],
                    "k_mean": k_mean[kv_head],
                    "q_norm_mean": float(q_stats.sum_norm[head]) / n,
                    "k_norm_mean": float(k_stats.sum_norm[kv_head]) / n_k,
                    "qk_cos": cos,
                    "qk_mean_score": score,
                }
            )
    if not rows:  # no attention (a CNN)
        return pl.DataFrame(schema=EXTRACT_SCHEMAS["qk"])
    df = pl.DataFrame([{k: v for k, v in r.items() if k not in ("q_mean", "k_mean")} for r in rows])
    return df.with_columns(
        _f32_lists([r["q_mean"] for r in rows]).alias("q_mean"),  # widths may differ by layer (CvT's stages)
        _f32_lists([r["k_mean"] for r in rows]).alias("k_mean"),
    ).select(*EXTRACT_SCHEMAS["qk"])


def attention_table(recorder: Recorder, cross: bool = False) -> pl.DataFrame:
    """One row per layer and head; `cross`: the cross-attention's."""
    rows = []
    for layer, stats in sorted((recorder.cross_attention if cross else recorder.attention).items()):
        means = {name: value.cpu().numpy() for name, value in stats.means().items()}
        for head in range(recorder.geometry.heads(layer)):
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "n_rows": stats.n_rows,
                    **{name: float(value[head]) for name, value in means.items()},
                }
            )
    return (
        pl.DataFrame(rows, schema=EXTRACT_SCHEMAS["attention"])
        if not rows
        else pl.DataFrame(rows).select(*EXTRACT_SCHEMAS["attention"])
    )


def hidden_stats_table(recorder: Recorder) -> pl.DataFrame:
    rows = []
    for (layer, site), s in sorted(recorder.vectors.items()):
        rows.append(
            {
                "layer": layer,
                "site": site,
                "n": s.n,
                "n_nonfinite": s.n_nonfinite,
                "n_zero": s.n_zero,
                "d": s.sum_x.numel(),
                "sum_norm": s.sum_norm,
                "sum_norm_sq": s.sum_norm_sq,
                "m2_norm": float(s.norm_m2),
                "norm_min": s.norm_min if s.n else None,
                "norm_max": s.norm_max if s.n else None,
            }
        )
    df = pl.DataFrame(rows)
    sums = lambda attr: pl.Series(  # noqa: E731
        [
            getattr(s, attr).cpu().numpy().tolist() if attr in ("sum_x", "sum_unit") or s.has_outliers else None
            for _, s in sorted(recorder.vectors.items())
        ],
        dtype=pl.List(pl.Float64),
    )
    return df.with_columns(
        *(
            sums(name).alias(name)
            for name in ("sum_x", "sum_unit", "sum_x_sq", "sum_unit_sq", "abs_max", "m2_x", "m2_unit")
        )
    ).select(*EXTRACT_SCHEMAS["hidden_stats"])


def hidden_table(recorder: Recorder, precision: str = "float32") -> pl.DataFrame:
    """The sampled tokens' vectors per (layer, site), stored at `precision` (anisweep.sample_storage)."""
    frames = []
    for (layer, site), vectors in sorted(recorder.samples.items()):
        sample = recorder.site_samples.get((layer, site), recorder.sample)  # a CNN stage's cells: its own draw
        vectors = vectors.numpy()
        frames.append(
            pl.DataFrame(
                {
                    "layer": np.full(len(vectors), layer, dtype=np.int64),
                    "site": [site] * len(vectors),
                    "seq": sample.seq.numpy().astype(np.int64),
                    "position": sample.position.numpy().astype(np.int64),
                    "token_id": sample.token_id.numpy().astype(np.int64),
                }
            ).with_columns(*vector_columns("vector", vectors, precision, f"hidden.parquet layer {layer} {site}"))
        )
    return pl.concat(frames)


def masked_resid_table(recorder: Recorder, precision: str = "float32") -> pl.DataFrame:
    """The masked pass's residual states, one row per (layer, masked token); none without one."""
    masked = recorder.masked
    if masked is None:
        return pl.DataFrame(schema=EXTRACT_SCHEMAS["masked_resid"])
    n = len(masked.seq)
    return pl.concat(
        pl.DataFrame(
            {
                "layer": np.full(n, layer, dtype=np.int64),
                "seq": masked.seq,
                "position": masked.position,
                "token_id": masked.token_id,
            }
        ).with_columns(*vector_columns("vector", states, precision, f"masked_resid.parquet layer {layer}"))
        for layer, states in sorted(masked.states.items())
    )


def _by_head(x: np.ndarray) -> np.ndarray:
    """(tokens, heads, d) -> (heads * tokens, d), head-major."""
    return x.transpose(1, 0, 2).reshape(-1, x.shape[2]).astype(np.float32)


def qk_sample_table(recorder: Recorder, precision: str = "float32") -> pl.DataFrame:
    """The sampled tokens' q and k vectors, one row per (layer, rope, head, token), stored at `precision`."""
    sample = recorder.qk_sample
    if sample is None:  # no attention (a CNN)
        return pl.DataFrame(schema=EXTRACT_SCHEMAS["qk_sample"])
    n, frames = len(sample), []
    for layer, rope in sorted({(layer, rope) for layer, rope, _ in sample.vectors}):
        q, k = (sample.vectors[(layer, rope, which)].numpy() for which in ("q", "k"))
        n_heads = q.shape[1]
        frames.append(
            pl.DataFrame(
                {
                    "layer": np.full(n_heads * n, layer, dtype=np.int64),
                    "head": np.repeat(np.arange(n_heads, dtype=np.int64), n),
                    "rope": [rope] * (n_heads * n),
                    "seq": np.tile(sample.seq.numpy().astype(np.int64), n_heads),
                    "position": np.tile(sample.position.numpy().astype(np.int64), n_heads),
                    "token_id": np.tile(sample.token_id.numpy().astype(np.int64), n_heads),
                }
            ).with_columns(
                *vector_columns("q", _by_head(q), precision, f"qk_sample.parquet layer {layer} {rope} q"),
                *vector_columns("k", _by_head(k), precision, f"qk_sample.parquet layer {layer} {rope} k"),
            )
        )
    return pl.concat(frames)


def score_hist_table(recorder: Recorder) -> pl.DataFrame:
    """Counts of pre-softmax scores per layer and bin; the first and last bins are the under- and overflow. No
    rows when extract.score_bins is null."""
    if recorder.score_hist is None:
        return pl.DataFrame(schema=EXTRACT_SCHEMAS["score_hist"])
    edges = recorder.score_hist.edges.numpy()
    lo = np.concatenate([[-np.inf], edges])
    hi = np.concatenate([edges, [np.inf]])
    frames = [
        pl.DataFrame(
            {
                "layer": np.full(len(lo), layer, dtype=np.int64),
                "bin": np.arange(len(lo), dtype=np.int64),
                "bin_lo": lo,
                "bin_hi": hi,
                "count": counts.cpu().numpy().astype(np.int64),
            }
        )
        for layer, counts in sorted(recorder.score_hist.counts.items())
    ]
    return pl.concat(frames)


def layernorm_table(adapter: Adapter, base: nn.Module) -> pl.DataFrame:
    """Each norm's parameters; gain and bias are null where the norm has none (RMSNorm: no bias; OLMo's
    LayerNorm: neither), eps null where the module does not store it."""
    rows = []
    for site in adapter.layernorm_sites(base):
        eps, gain, bias = norm_parameters(site.module)
        as_list = lambda p: None if p is None else p.detach().float().cpu().numpy().tolist()  # noqa: E731
        rows.append({"layer": site.layer, "site": site.site, "eps": eps, "gain": as_list(gain), "bias": as_list(bias)})
    return pl.DataFrame(rows, schema=EXTRACT_SCHEMAS["layernorm"])


def embeddings_table(adapter: Adapter, model: nn.Module, initialised: tuple[str, ...] = ()) -> pl.DataFrame:
    """I(W) of the embedding matrices, here because the matrices never leave extract. A matrix among the
    `initialised` parameters (an untied LM head the checkpoint lacked, anisweep.extract.checked_load) is random:
    it is left out, as for a checkpoint without an LM head."""
    matrices = adapter.embedding_matrices(model)
    tied = "embed_out" in matrices and matrices["embed_out"].data_ptr() == matrices["embed_in"].data_ptr()
    random = {id(p) for name, p in model.named_parameters(remove_duplicate=False) if name in initialised}
    matrices = {name: weight for name, weight in matrices.items() if id(weight) not in random}
    rows = []
    for name, weight in matrices.items():
        w = weight.detach().float().cpu().numpy()
        for centre in (False, True):
            rows += [
                {
                    "matrix": name,
                    "tied": tied,
                    "n_rows": w.shape[0],
                    "d": w.shape[1],
                    "metric": f"{metric}_centred" if centre else metric,
                    "value": value,
                }
                for metric, value in geometry.partition_isotropies(w, centre=centre).items()
            ]
    return pl.DataFrame(rows, schema=EXTRACT_SCHEMAS["embeddings"])  # no rows without matrices (CANINE's hashing)


def tables(
    recorder: Recorder, loaded: LoadedModel, ident: dict, tokenizer=None, precision: str = "float32"
) -> dict[str, pl.DataFrame]:
    """Every table of `tables.EXTRACT_TABLES`, in that order, with the identity columns. `tokenizer` names the
    outlier tables' tokens; without one, the tokenizer in the model's folder does (a live model has none).
    `precision`: the storage of the sampled vectors (`extract.sample_precision`, anisweep.sample_storage)."""
    build = {
        "qk": lambda: qk_table(recorder),
        "attention": lambda: attention_table(recorder),
        "hidden": lambda: hidden_table(recorder, precision),
        "masked_resid": lambda: masked_resid_table(recorder, precision),
        "hidden_stats": lambda: hidden_stats_table(recorder),
        "layernorm": lambda: layernorm_table(loaded.adapter, loaded.base),
        "embeddings": lambda: embeddings_table(loaded.adapter, loaded.model, loaded.initialised),
        "qk_sample": lambda: qk_sample_table(recorder, precision),
        "score_hist": lambda: score_hist_table(recorder),
        "massive": lambda: outlier_tables.massive_table(recorder, kinds),
        "sinks": lambda: outlier_tables.sinks_table(recorder),
        "sink_keys": lambda: outlier_tables.sink_keys_table(recorder, kinds),
        "units": lambda: units_table(recorder),
    }
    kinds = outlier_tables.token_kinds(recorder, loaded.model, loaded.trust_remote_code, tokenizer)
    out = {name: with_identity(build[name](), ident) for name in EXTRACT_TABLES}
    if recorder.geometry.cross_layers:  # an encoder-decoder: its cross-attention in tables of their own
        out["cross_qk"] = with_identity(qk_table(recorder, cross=True), ident)
        out["cross_attention"] = with_identity(attention_table(recorder, cross=True), ident)
    return out
