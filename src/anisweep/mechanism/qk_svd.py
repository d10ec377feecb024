"""Queries and keys across training, projected on a few singular directions (Godey et al. 2024, Sec. 5 and
App. C): per head, one SVD of the union of every step's sampled q and k vectors (`common`; the paper's
Fig. 11/12), or of the keys only (`k`; Fig. 19/21) or the queries only (`q`; Fig. 20/22), and each step's mean
query and mean key projected on the first two directions. The SVD is not centred: the directions describe the
drift away from the origin, which is the point.

The vectors are extract's q/k sample (`extract.qk_sample_tokens` tokens per step, 256 by default), already a
subsample of the evaluation batch, so by default (`qk_svd.fraction` = DEFAULT_FRACTION = 1) the SVD is fitted on
ALL of them. Godey et al. fitted on 20% of their vectors to save memory; a fraction below 1 takes a seeded share
of the sample, for larger samples only: at 20% of the default toy run's sample (1,229 of 6,144 vectors) direction
1 rotates by up to 13.5 deg and the projections move by up to half the largest mean norm. At fraction 1 the
default toy run (12 steps x 256 tokens, q and k: 6,144 vectors of d_head 16 per head) takes 1.3 ms per SVD and
1-2 s per model for every head, rope and basis (0.3-0.5 s at 0.2; one CPU thread), with a Python peak of 16-28 MiB,
the same at either fraction since every sampled vector is held for the figures anyway. The largest SVD input is
one head's union, n x d_head float64: a Pythia-sized grid (154 steps x 256 tokens x 2, d_head 128) gives
79k x 128 x 8 B = 81 MB.

Reads extract's qk_sample.parquet (the vectors) and qk.parquet (the exact means over every valid token) of
every step of one model; writes qk_svd.parquet and the arrow plots of the heads the config names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from anisweep import sample_storage
from anisweep.measures.grouped import vectors_by_group
from anisweep.tables import IDENTITY, read_parquet, scan_parquet

BASES = ("common", "q", "k")
FIGURES = tuple(f"qk_svd_{basis}.png" for basis in BASES)
N_COMPONENTS = 2
DEFAULT_FRACTION = 1.0  # the whole q/k sample; config.schema.yaml's qk_svd.fraction default


def directions(x: np.ndarray, fraction: float = DEFAULT_FRACTION, seed: int = 0) -> tuple[np.ndarray, np.ndarray, int]:
    """(first N_COMPONENTS right singular vectors as rows, every singular value, rows used) of the finite rows of
    x, uncentred: all of them at fraction 1, else a seeded share (at least N_COMPONENTS). Each direction's sign
    puts its largest-magnitude coordinate positive, so that a rerun gives the same picture."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x).all(axis=1)]
    n = len(x)
    if n < N_COMPONENTS:
        raise ValueError(f"the SVD needs at least {N_COMPONENTS} finite vectors, got {n}")
    if not 0 < fraction <= 1:
        raise ValueError(f"qk_svd.fraction must be in (0, 1], got {fraction}")
    m = min(n, max(N_COMPONENTS, int(np.ceil(fraction * n))))
    if m < n:
        x = x[np.sort(np.random.default_rng(seed).choice(n, size=m, replace=False))]
    _, singular, vt = np.linalg.svd(x, full_matrices=False)
    v = vt[:N_COMPONENTS]
    signs = np.sign(v[np.arange(len(v)), np.abs(v).argmax(axis=1)])
    return v * signs[:, None], singular, m


def head_rows(
    q_by_step: dict[int, np.ndarray],
    k_by_step: dict[int, np.ndarray],
    q_means: dict[int, np.ndarray],
    k_means: dict[int, np.ndarray],
    fraction: float = DEFAULT_FRACTION,
    seed: int = 0,
) -> tuple[list[dict], dict[str, np.ndarray]]:
    """One head's rows (basis, step, projections of the step's mean q and mean k, singular values) and the
    directions of each basis."""
    steps = sorted(q_by_step)
    q_all = np.concatenate([q_by_step[s] for s in steps])
    k_all = np.concatenate([k_by_step[s] for s in steps])
    data = {"common": np.concatenate([q_all, k_all]), "q": q_all, "k": k_all}
    rows, bases = [], {}
    for basis in BASES:
        v, singular, used = directions(data[basis], fraction, seed)
        bases[basis] = v
        share = singular / singular.sum() if singular.sum() > 0 else np.full_like(singular, np.nan)
        for step in steps:
            q, k = v @ q_means[step], v @ k_means[step]
            rows.append(
                {
                    "basis": basis,
                    "step": step,
                    **{f"q_{i + 1}": float(q[i]) for i in range(N_COMPONENTS)},
                    **{f"k_{i + 1}": float(k[i]) for i in range(N_COMPONENTS)},
                    **{f"sv_{i + 1}": float(singular[i]) for i in range(N_COMPONENTS)},
                    **{f"sv_share_{i + 1}": float(share[i]) for i in range(N_COMPONENTS)},
                    "n_svd": used,
                }
            )
    return rows, bases


def select_heads(final_qk: pl.DataFrame, heads) -> list[tuple[int, int]]:
    """`heads` as (layer, head) pairs; `auto`: per layer the head with the largest final qk_cos and the one with
    the most negative (one head when they coincide), on the rope the attention scores use."""
    if heads != "auto":
        known = set(final_qk.select("layer", "head").iter_rows())
        missing = [tuple(h) for h in heads if tuple(h) not in known]
        if missing:
            raise ValueError(
                f"qk_svd.heads: {missing} are not (layer, head) pairs of this model; "
                f"layers 0..{final_qk['layer'].max()}, heads 0..{final_qk['head'].max()}"
            )
        return [tuple(h) for h in heads]
    rope = "post" if "post" in final_qk["rope"].to_list() else "pre"
    chosen = []
    for layer in sorted(final_qk["layer"].unique().to_list()):
        part = final_qk.filter((pl.col("layer") == layer) & (pl.col("rope") == rope)).sort("qk_cos", "head")
        for head in dict.fromkeys([part["head"][-1], part["head"][0]]):
            chosen.append((layer, head))
    return chosen


def _read(paths: list[Path], columns: list[str]) -> pl.DataFrame:
    return pl.concat([read_parquet(p, columns=columns) for p in paths])


def _vectors_by_head(samples: pl.DataFrame) -> dict[tuple, tuple[dict, dict]]:
    """{(head, rope): ({step: q vectors}, {step: k vectors})} (float64, in the sample's row order), sorted by head,
    rope and step."""
    by_head = {}
    for (head, rope, step), group in vectors_by_group(samples, ("head", "rope", "step"), ("q", "k")):
        q_by_step, k_by_step = by_head.setdefault((head, rope), ({}, {}))
        q_by_step[step], k_by_step[step] = group["q"], group["k"]
    return by_head


def _layer_sample(frame: pl.LazyFrame, layer: int) -> pl.DataFrame:
    """One layer's sampled q and k of one checkpoint, as float32 lists whatever their storage."""
    stored = sample_storage.stored_columns(frame.collect_schema(), ["step", "head", "rope", "q", "k"])
    return sample_storage.decode(frame.filter(pl.col("layer") == layer).select(stored).collect())


def qk_svd(extract_dirs: list[Path], fraction: float = DEFAULT_FRACTION, seed: int = 0) -> tuple[pl.DataFrame, dict]:
    """qk_svd.parquet's rows for every (layer, head, rope) of one model, and what the figures need: the
    directions, and a seeded share of the sampled vectors per head."""
    dirs = [Path(d) for d in extract_dirs]
    means = _read([d / "qk.parquet" for d in dirs], [*IDENTITY, "layer", "head", "rope", "q_mean", "k_mean", "qk_cos"])
    if means.is_empty():
        return pl.DataFrame(), {"why": "the model has no attention (a convolutional network): no queries or keys"}
    if all(scan_parquet(d / "qk_sample.parquet").select(pl.len()).collect().item() == 0 for d in dirs):
        why = "extract keeps no q/k sample of a model whose heads change width from stage to stage (MiT, CvT)"
        return pl.DataFrame(), {"why": why}
    if means["step"].n_unique() != len(dirs):
        raise ValueError(f"qk_svd: {len(dirs)} extract folders hold {means['step'].n_unique()} distinct steps")
    ident = {key: means[key][0] for key in ("family", "model", "seed")}
    tokens_seen = dict(means.select("step", "tokens_seen").unique().iter_rows())
    sample_frames = [scan_parquet(d / "qk_sample.parquet") for d in dirs]  # each file's footer checked once
    rows, extras = [], {}
    for layer in sorted(means["layer"].unique().to_list()):
        samples = pl.concat([_layer_sample(f, layer) for f in sample_frames])
        layer_means = means.filter(pl.col("layer") == layer)
        for (head, rope), (q_by_step, k_by_step) in _vectors_by_head(samples).items():
            head_means = layer_means.filter((pl.col("head") == head) & (pl.col("rope") == rope))
            q_means = {s: np.asarray(m, np.float64) for s, m in head_means.select("step", "q_mean").iter_rows()}
            k_means = {s: np.asarray(m, np.float64) for s, m in head_means.select("step", "k_mean").iter_rows()}
            head_table, bases = head_rows(q_by_step, k_by_step, q_means, k_means, fraction, seed)
            rows += [{"layer": layer, "head": head, "rope": rope, **r} for r in head_table]
            extras[(layer, head, rope)] = (bases, q_by_step, k_by_step)
    table = pl.DataFrame(rows).with_columns(
        pl.col("step").replace_strict(tokens_seen, return_dtype=pl.Int64).alias("tokens_seen"),
        *[pl.lit(v).alias(k) for k, v in ident.items()],
    )
    table = table.select(*IDENTITY, *[c for c in table.columns if c not in IDENTITY])
    final = means.filter(pl.col("step") == means["step"].max())
    return table.sort("layer", "head", "rope", "basis", "step"), {"vectors": extras, "final_qk": final}
