"""The backward pass as Parquet: what the checkpoint's model job keeps of it, so that every share, fit and control
is computed afterwards from files, without the weights.

gradient_sums.parquet, long: per (layer, site, stratum) of the three frequency strata (`all` is their sum, not
stored) the quantities `n` and `grad_norm` (in `value`), `grad_sum`, `grad_unit`, `act_unit` (d-vectors in `vector`)
and `grad_second` and `grad_m2` (the d x d second moment's and centred scatter's upper triangles, row by row, in
`vector`); and the pass's own numbers
as rows of site `lm` (loss, n_targets, the strata's count quantiles), layer null, stratum `all`.

gradient_sample.parquet: per (layer, site) the seeded token sample's activations and gradients (float32, as the
pass holds them), with each token's stratum (0 frequent, 1 middle, 2 rare) and its index in the sample.

A step outside `gradients.steps` gets both tables without rows.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from anisweep.tangent.shares import STRATA
from anisweep.tangent.sums import GradientPass, SiteSums, with_all

SUMS_SCHEMA = {
    "layer": pl.Int64,
    "site": pl.String,
    "stratum": pl.String,
    "quantity": pl.String,
    "value": pl.Float64,
    "vector": pl.List(pl.Float64),
}
SAMPLE_SCHEMA = {
    "layer": pl.Int64,
    "site": pl.String,
    "token": pl.Int64,
    "stratum": pl.Int64,
    "act": pl.List(pl.Float32),
    "grad": pl.List(pl.Float32),
}
PASS_TABLES = ("gradient_sums", "gradient_sample")
SCALARS = ("n", "n_grad", "n_act", "grad_norm")
VECTORS = ("grad_sum", "grad_unit", "act_unit")
MATRICES = ("grad_second", "grad_m2")  # symmetric: their upper triangles


def empty_pass_tables() -> dict[str, pl.DataFrame]:
    return {"gradient_sums": pl.DataFrame(schema=SUMS_SCHEMA), "gradient_sample": pl.DataFrame(schema=SAMPLE_SCHEMA)}


def pass_tables(result: GradientPass) -> dict[str, pl.DataFrame]:
    """gradient_sums and gradient_sample of a finished pass."""
    rows, vectors = [], []  # the vectors (up to d(d+1)/2 floats each) go to Parquet from numpy, never as lists
    for (layer, site), sums in sorted(result.sums.items()):
        upper = np.triu_indices(sums.d)
        for index, stratum in enumerate(STRATA[1:], start=1):
            where = {"layer": layer, "site": site, "stratum": stratum}
            rows += [{**where, "quantity": q, "value": float(getattr(sums, q)[index])} for q in SCALARS]
            for q in VECTORS:
                rows.append({**where, "quantity": q, "vector": len(vectors)})
                vectors.append(np.asarray(getattr(sums, q)[index], np.float64))
            for q in MATRICES:
                rows.append({**where, "quantity": q, "vector": len(vectors)})
                vectors.append(getattr(sums, q)[index][upper])
    lm = {"loss": result.loss, "n_targets": result.n_targets, **result.strata_info}
    rows += [{"layer": None, "site": "lm", "stratum": "all", "quantity": q, "value": float(v)} for q, v in lm.items()]
    sample = []
    for (layer, site), act in sorted(result.act_sample.items()):
        grad = result.grad_sample[(layer, site)]
        sample.append(
            pl.DataFrame(
                {
                    "layer": layer,
                    "site": site,
                    "token": np.arange(len(act)),
                    "stratum": result.sample_strata.astype(np.int64),
                    "act": act,
                    "grad": grad,
                }
            ).cast(SAMPLE_SCHEMA)
        )
    samples = pl.concat(sample) if sample else pl.DataFrame(schema=SAMPLE_SCHEMA)
    return {"gradient_sums": _with_vectors(rows, vectors), "gradient_sample": samples}


def _with_vectors(rows: list[dict], vectors: list[np.ndarray]) -> pl.DataFrame:
    """The sums table from its rows, whose `vector` holds an index into `vectors` (null for scalar rows)."""
    index = {"vector": pl.Int64}
    table = pl.DataFrame(rows, schema={**SUMS_SCHEMA, **index})
    column = pl.Series("vector", vectors, dtype=SUMS_SCHEMA["vector"]) if vectors else None
    if column is None:
        return table.cast(SUMS_SCHEMA)
    return table.with_columns(pl.col("vector").map_batches(lambda i: column.gather(i), return_dtype=column.dtype))


def _site_sums(rows: pl.DataFrame) -> SiteSums:
    at = {(stratum, quantity): i for i, (stratum, quantity) in enumerate(rows.select("stratum", "quantity").rows())}
    value, vector = rows["value"], rows["vector"]
    strata = STRATA[1:]
    arrays = {q: np.array([value[at[(s, q)]] for s in strata]) for q in SCALARS}
    arrays |= {q: np.stack([vector[at[(s, q)]].to_numpy() for s in strata]) for q in VECTORS}
    d = arrays["grad_sum"].shape[1]
    upper = np.triu_indices(d)
    for q in MATRICES:
        matrix = np.zeros((len(strata), d, d))
        for index, s in enumerate(strata):
            matrix[index][upper] = vector[at[(s, q)]].to_numpy()
            matrix[index] = matrix[index] + np.triu(matrix[index], 1).T
        arrays[q] = matrix
    arrays = with_all(arrays)  # `all` first, as SiteSums.finish() leaves them
    for count in ("n", "n_grad", "n_act"):
        arrays[count] = arrays[count].astype(np.int64)
    return SiteSums.of(**arrays)


def read_pass(sums: pl.DataFrame, sample: pl.DataFrame, where: str = "") -> GradientPass:
    """The pass back from its two tables (its sites' modules and time are not kept)."""
    if sums.is_empty():
        raise ValueError(
            f"{where}: its gradient_sums.parquet has no rows: the step is outside gradients.steps when its model ran; "
            "add it to gradients.steps (the workflow then runs that checkpoint again)"
        )
    lm = dict(sums.filter(pl.col("site") == "lm").select("quantity", "value").iter_rows())
    site_sums = {
        (layer, site): _site_sums(rows)
        for (layer, site), rows in sums.filter(pl.col("site") != "lm").group_by("layer", "site", maintain_order=True)
    }
    act, grad, strata = {}, {}, None
    for (layer, site), rows in sample.group_by("layer", "site", maintain_order=True):
        rows = rows.sort("token")
        act[(layer, site)] = rows["act"].explode().to_numpy().reshape(rows.height, -1).astype(np.float32)
        grad[(layer, site)] = rows["grad"].explode().to_numpy().reshape(rows.height, -1).astype(np.float32)
        strata = rows["stratum"].to_numpy()
    strata_info = {q: v for q, v in lm.items() if q not in ("loss", "n_targets")}
    return GradientPass(
        sites=[],
        sums=site_sums,
        act_sample=act,
        grad_sample=grad,
        sample_strata=strata if strata is not None else np.zeros(0, np.int64),
        loss=float(lm["loss"]),
        n_targets=int(lm["n_targets"]),
        strata_info=strata_info,
        seconds=float("nan"),
    )
