"""Alignment of the token embeddings' change over training with the activation subspaces (config
`gradients.embedding_change`).

Per analysed checkpoint, the gradients rule keeps the input-embedding rows (the raw table,
`get_input_embeddings().weight`) of a bounded set of the evaluation batch's token ids, and the orthonormal
bases fitted at the embedding-output site (layer 0). The ids: every distinct valid id of the batch, by its
frequency stratum (anisweep.tangent.batch.frequency_strata: the count of the id in the training corpus where
known, else in the batch; special tokens are left out), at most
`embedding_tokens` in all: each stratum gets a third of that budget, a stratum with fewer ids is kept whole and
the budget it leaves goes to the others (`stratum_quotas`), so every id is kept when the batch has no more
distinct ids than the budget, and otherwise the whole budget is used; a stratum with more ids than its quota is
a seeded uniform sample of them. The batch, the strata and the sample are the same at every step, so the rows
of two steps pair up.

For consecutive analysed steps t1 < t2, with ΔE = E(t2) - E(t1) over those rows and P the projector on a
rank-k basis U at t1 (per-checkpoint) or the fixed one:

    share = sum_i w_i ||ΔE_i U||^2 / sum_i w_i ||ΔE_i||^2

per stratum (w_i = 1) and over all strata (w_i = the stratum's distinct ids / its sampled ids, so that `all`
estimates the share over every distinct id of the batch: a ratio of two unbiased stratified sums, so nearly
unbiased, and exact when nothing is sampled). Chance: k / d. z is against the exact null of a uniformly random
rank-k subspace (the share is tr(P A) / tr(A), A = ΔE^T W ΔE: anisweep.tangent.shares.null_moments); the gradient
analysis's matched-rank random subspaces (same seed) are a check of it (control_mean, control_sd).

For BERT the layer-0 site is the embedding output AFTER the embeddings' LayerNorm (and the position and
token-type embeddings), while ΔE lives in the raw token-embedding table's space.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from anisweep.tables import vectors

STRATUM_NAMES = ("frequent", "middle", "rare")

EMBEDDING_SCHEMA = {
    "token_id": pl.Int64,
    "stratum": pl.String,
    "count": pl.Int64,
    "weight": pl.Float64,
    "vector": pl.List(pl.Float32),
}


def stratum_quotas(sizes: list[int], cap: int) -> list[int]:
    """How many ids to keep of each stratum of `sizes` distinct ids under a budget of `cap`: equal shares of the
    budget (the remainder one each to the first strata), a stratum smaller than its share kept whole and the
    share it leaves split among the others in turn, so that min(cap, sum(sizes)) ids are kept in all and a
    stratum is sampled only when it holds more ids than its quota."""
    quota = [0] * len(sizes)
    remaining, open_ = cap, [i for i, size in enumerate(sizes) if size > 0]
    while open_ and remaining > 0:
        share, extra = divmod(remaining, len(open_))
        small = [i for i in open_ if sizes[i] <= share]
        if not small:  # every open stratum fills its share: split the rest
            for j, i in enumerate(open_):
                quota[i] = share + (1 if j < extra else 0)
            break
        for i in small:
            quota[i] = sizes[i]
            remaining -= sizes[i]
        open_ = [i for i in open_ if i not in small]
    return quota


def sample_ids(token_ids, valid, cap: int, seed: int, corpus_counts=None, special_ids=()) -> pl.DataFrame:
    """The kept ids: token_id, stratum, count (in the batch), weight (see the module's docstring); per stratum
    `stratum_quotas` of its distinct ids, a seeded uniform sample without replacement where the quota is less
    than the stratum (the strata drawn in order from one generator). The strata are the gradient pass's
    (`corpus_counts`, `special_ids`: anisweep.tangent.batch.frequency_strata); special tokens are not kept."""
    from anisweep.tangent.batch import frequency_strata

    strata, _ = frequency_strata(token_ids, valid, corpus_counts, special_ids)
    ids, strata = token_ids[valid].numpy(), strata[valid].numpy()
    distinct, first, counts = np.unique(ids, return_index=True, return_counts=True)
    id_strata = strata[first]  # an id's stratum depends on its count alone
    rng = np.random.default_rng(seed)
    members_of = [np.flatnonzero(id_strata == index) for index in range(len(STRATUM_NAMES))]
    quota = stratum_quotas([len(m) for m in members_of], cap)
    rows = []
    for name, members, n in zip(STRATUM_NAMES, members_of, quota, strict=True):
        chosen = members if len(members) <= n else np.sort(rng.choice(members, n, replace=False))
        weight = len(members) / len(chosen) if len(chosen) else float("nan")
        rows += [
            {"token_id": int(distinct[i]), "stratum": name, "count": int(counts[i]), "weight": weight} for i in chosen
        ]
    return pl.DataFrame(rows, schema={k: EMBEDDING_SCHEMA[k] for k in ("token_id", "stratum", "count", "weight")})


def embedding_rows(table: np.ndarray, kept: pl.DataFrame) -> pl.DataFrame:
    """The kept ids' rows of the embedding table (vocab x d), float32 (the loaded weights' precision or less)."""
    vectors = np.asarray(table, np.float32)[kept["token_id"].to_numpy()]
    return kept.with_columns(pl.Series("vector", vectors).cast(pl.List(pl.Float32)))


def weighted_share(delta: np.ndarray, weight: np.ndarray, basis: np.ndarray) -> float:
    """sum_i w_i ||delta_i U||^2 / sum_i w_i ||delta_i||^2 (U orthonormal)."""
    total = float(weight @ (delta**2).sum(1))
    return float(weight @ ((delta @ basis) ** 2).sum(1) / total) if total > 0 else float("nan")


def _pair(rows1: pl.DataFrame, rows2: pl.DataFrame, steps: tuple[int, int]) -> pl.DataFrame:
    a, b = rows1.sort("token_id"), rows2.sort("token_id")
    if a["token_id"].to_list() != b["token_id"].to_list() or a["stratum"].to_list() != b["stratum"].to_list():
        raise ValueError(
            f"embedding change: steps {steps[0]} and {steps[1]} kept different token ids; both must come from the "
            "same evaluation batch and gradients.embedding_tokens / seed (rerun their gradients rules)"
        )
    return a.with_columns(
        delta=pl.Series(vectors(b["vector"]).astype(np.float64) - vectors(a["vector"]).astype(np.float64))
    )


def change_rows(
    rows1: pl.DataFrame,
    rows2: pl.DataFrame,
    bases: dict[str, dict[tuple[str, int], np.ndarray]],
    n_random: int,
    seed: int,
    steps: tuple[int, int],
) -> list[dict]:
    """The share of ΔE = E(t2) - E(t1) in each basis, per stratum and over all, against random controls.
    `bases`: {fit: {(subspace, rank): U}} (the per-checkpoint ones at t1, the fixed ones)."""
    from anisweep.tangent.shares import control_stats, null_moments, random_bases

    paired = _pair(rows1, rows2, steps)
    delta = vectors(paired["delta"]).astype(np.float64)
    weight, stratum = paired["weight"].to_numpy(), paired["stratum"].to_numpy()
    d = delta.shape[1]
    ranks = sorted({rank for by in bases.values() for _, rank in by})
    controls = {rank: random_bases(d, rank, n_random, seed + rank) for rank in ranks}
    old = vectors(paired["vector"]).astype(np.float64)
    rows = []
    for name in ("all", *STRATUM_NAMES):
        keep = np.ones(len(delta), bool) if name == "all" else stratum == name
        if not keep.any():
            continue
        dx, w = delta[keep], weight[keep] if name == "all" else np.ones(keep.sum())
        where = {"layer": 0, "site": "resid", "stratum": name, "n_tokens": int(keep.sum()), "step_from": steps[0]}
        relative = np.sqrt((w @ (dx**2).sum(1)) / max(float(w @ (old[keep] ** 2).sum(1)), 1e-300))
        rows.append({**where, "measure": "embedding_change_relative", "value": float(relative)})
        # the share is tr(P A) / tr(A) with A = dx^T W dx: its exact null (anisweep.tangent.shares.null_moments)
        a = (dx * w[:, None]).T @ dx
        trace, trace_sq = float(np.trace(a)), float((a**2).sum())
        for rank in ranks:
            control = np.array([weighted_share(dx, w, u) for u in controls[rank]])
            null = null_moments(trace, trace_sq, d, rank)
            for fit, by in bases.items():
                for (subspace, r), basis in sorted(by.items()):
                    if r != rank:
                        continue
                    if basis.shape[0] != d:
                        raise ValueError(f"embedding change: a {basis.shape[0]}-d basis for {d}-d embeddings")
                    value = weighted_share(dx, w, basis)
                    rows.append(
                        {
                            **where,
                            "subspace": subspace,
                            "fit": fit,
                            "rank": rank,
                            "measure": "embedding_change_share",
                            "value": value,
                            "chance": rank / d,
                            **control_stats(value, control, null),
                        }
                    )
            rows.append(
                {
                    **where,
                    "subspace": "random",
                    "rank": rank,
                    "measure": "embedding_change_share",
                    "value": float(control.mean()),
                    "chance": rank / d,
                    **control_stats(float(control.mean()), control, null),
                }
            )
    return rows


def layer0_bases(frame: pl.DataFrame) -> dict[tuple[str, int], np.ndarray]:
    """{(subspace, rank): U} of the embedding-output site (layer 0, resid) of a bases table."""
    from anisweep.tangent.fixed import bases_from_frame

    bases = bases_from_frame(frame.filter((pl.col("layer") == 0) & (pl.col("site") == "resid")))
    return {(method, rank): u for (_, _, rank), by in bases.items() for method, u in by.items()}


def sweep_rows(
    steps: list[int],
    embeddings: dict[int, pl.DataFrame],
    checkpoint_bases: dict[int, pl.DataFrame],
    fixed_bases: pl.DataFrame | None,
    n_random: int,
    seed: int,
    per_checkpoint: bool = True,
) -> list[dict]:
    """change_rows for every consecutive pair of `steps`, the per-checkpoint bases taken at the earlier step; the
    rows of the fixed bases carry their fit window (`window`, anisweep.tangent.fixed.window_of) where the bases'
    table names it."""
    from anisweep.tangent.fixed import window_of

    steps = sorted(steps)
    fixed = layer0_bases(fixed_bases) if fixed_bases is not None else None
    window = window_of(fixed_bases) if fixed_bases is not None else None
    rows = []
    for t1, t2 in zip(steps, steps[1:], strict=False):
        bases = {"checkpoint": layer0_bases(checkpoint_bases[t1])} if per_checkpoint else {}
        if fixed is not None:
            bases["fixed"] = fixed
        for r in change_rows(embeddings[t1], embeddings[t2], bases, n_random, seed, (t1, t2)):
            rows.append({**r, "step": t2, **({"window": window} if window and r.get("fit") == "fixed" else {})})
    return rows
