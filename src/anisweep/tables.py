"""Parquet files of the output contract: which tables there are, the identity columns every row carries, and
writing them atomically (see `atomic`)."""

from __future__ import annotations

import os
from typing import NoReturn

import polars as pl

from anisweep import atomic, sample_storage

#: The identity columns every row of a checkpoint's tables carries, first and in this order, with their types.
IDENTITY_SCHEMA = {"family": pl.String, "model": pl.String, "seed": pl.Int64, "step": pl.Int64, "tokens_seen": pl.Int64}
IDENTITY = tuple(IDENTITY_SCHEMA)

#: the training corpus's count per token id (token_id, count), in a checkpoint's folder or its run folder: the toys
#: write theirs (anisweep.toy.train), the gradient analysis's frequency strata read it (anisweep.tangent.batch)
TOKEN_COUNTS = "token_counts.parquet"

#: attention.parquet's statistics, one value per (layer, head): what extract writes and metrics reads.
ATTENTION_STATISTICS = (
    "entropy_mean",
    "entropy_norm_mean",
    "p_max_mean",
    "p_median_mean",
    "p_min_mean",
    "score_mean",
    "score_std",
)

_F32_LIST = pl.List(pl.Float32)

#: The tables extract writes per checkpoint, `{name}.parquet` (the extract rule's outputs and `extract.tables()`'s
#: keys, in this order), each with its columns after the identity columns and their types, in the order written.
EXTRACT_SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "qk": {
        "layer": pl.Int64,
        "head": pl.Int64,
        "kv_head": pl.Int64,
        "rope": pl.String,
        "n_tokens": pl.Int64,
        "q_mean": _F32_LIST,
        "k_mean": _F32_LIST,
        "q_norm_mean": pl.Float64,
        "k_norm_mean": pl.Float64,
        "qk_cos": pl.Float64,
        "qk_mean_score": pl.Float64,
    },
    "attention": {
        "layer": pl.Int64,
        "head": pl.Int64,
        "n_rows": pl.Int64,
        **dict.fromkeys(ATTENTION_STATISTICS, pl.Float64),
    },
    "hidden": {
        "layer": pl.Int64,
        "site": pl.String,
        "seq": pl.Int64,
        "position": pl.Int64,
        "token_id": pl.Int64,
        "vector": _F32_LIST,
    },
    # an encoder's residual stream at the masked tokens of its masked pass (anisweep.extract.masked): the logit
    # lens's states; no rows for a model without a mask token
    "masked_resid": {
        "layer": pl.Int64,
        "seq": pl.Int64,
        "position": pl.Int64,
        "token_id": pl.Int64,
        "vector": _F32_LIST,
    },
    "hidden_stats": {
        "layer": pl.Int64,
        "site": pl.String,
        "n": pl.Int64,
        "n_nonfinite": pl.Int64,
        "n_zero": pl.Int64,
        "d": pl.Int64,
        "sum_norm": pl.Float64,
        "sum_norm_sq": pl.Float64,
        "norm_min": pl.Float64,
        "norm_max": pl.Float64,
        "sum_x": pl.List(pl.Float64),
        "sum_unit": pl.List(pl.Float64),
        # per dimension: sum x_j^2, sum (x_j / ||x||)^2 and max |x_j| (rogue dimensions, massive activations)
        "sum_x_sq": pl.List(pl.Float64),
        "sum_unit_sq": pl.List(pl.Float64),
        "abs_max": pl.List(pl.Float64),
        # M2, the sum of squared deviations from the mean over the same tokens, streamed without cancellation
        # (anisweep.moments): of ||x|| at every site; per dimension of x_j and of x_j / ||x|| where the sums above are
        "m2_norm": pl.Float64,
        "m2_x": pl.List(pl.Float64),
        "m2_unit": pl.List(pl.Float64),
    },
    "layernorm": {"layer": pl.Int64, "site": pl.String, "eps": pl.Float64, "gain": _F32_LIST, "bias": _F32_LIST},
    "embeddings": {
        "matrix": pl.String,
        "tied": pl.Boolean,
        "n_rows": pl.Int64,
        "d": pl.Int64,
        "metric": pl.String,
        "value": pl.Float64,
    },
    "qk_sample": {
        "layer": pl.Int64,
        "head": pl.Int64,
        "rope": pl.String,
        "seq": pl.Int64,
        "position": pl.Int64,
        "token_id": pl.Int64,
        "q": _F32_LIST,
        "k": _F32_LIST,
    },
    "score_hist": {"layer": pl.Int64, "bin": pl.Int64, "bin_lo": pl.Float64, "bin_hi": pl.Float64, "count": pl.Int64},
    # the tokens and keys that stand out (anisweep.extract.outlier_tables): a hidden site's tokens with the largest
    # |component|, the attention each key position receives per head, the keys that receive the most
    "massive": {
        "layer": pl.Int64,
        "site": pl.String,
        "rank": pl.Int64,
        "seq": pl.Int64,
        "position": pl.Int64,
        "token_id": pl.Int64,
        "token": pl.String,
        "kind": pl.String,
        "dim": pl.Int64,
        "value": pl.Float64,
    },
    "sinks": {
        "layer": pl.Int64,
        "head": pl.Int64,
        "n_rows": pl.Int64,
        "n_seqs": pl.Int64,
        "first_received": pl.Float64,
        "received": pl.List(pl.Float64),
        "key_count": pl.List(pl.Int64),
        "first_importance": pl.List(pl.Float64),
    },
    "sink_keys": {
        "layer": pl.Int64,
        "head": pl.Int64,
        "rank": pl.Int64,
        "seq": pl.Int64,
        "position": pl.Int64,
        "token_id": pl.Int64,
        "token": pl.String,
        "kind": pl.String,
        "received": pl.Float64,
        "share": pl.Float64,
    },
    # the sums of each resampling unit (anisweep.extract.streaming.Units; anisweep.measures.sum_bootstrap): per
    # table (hidden_stats, attention, qk), layer, site, head (null where per layer) and statistic, `values` holds
    # n_units x width floats, unit by unit; they sum to the table's own statistics
    "units": {
        "table": pl.String,
        "layer": pl.Int64,
        "site": pl.String,
        "head": pl.Int64,
        "stat": pl.String,
        "width": pl.Int64,
        "values": pl.List(pl.Float64),
    },
}
EXTRACT_TABLES = tuple(EXTRACT_SCHEMAS)
#: What extract's tables hold, raised whenever the package's extract writes columns (or rows of a quantity) that the
#: analyses read and an older one did not write: the extract rule takes it as a param, so that over a results folder
#: written before, every checkpoint's model job runs again (docs/reruns.md) rather than its metrics failing on the
#: missing columns. 2: hidden_stats' M2 columns and gradient_sums' `grad_m2` (streamed variances without
#: cancellation). 3: sinks' `first_importance` (each sequence's first-key importance, for Sink_1^epsilon). 4: `units`,
#: the resampling units' sums (the Multi-Bootstrap of the measures built of sums).
EXTRACT_FORMAT = 4

#: The tables of the untrained-block experiment (anisweep.mechanism.untrained), `results/untrained/{name}.parquet`,
#: with their columns and types (no identity columns: an init, seed and bias norm say where a row comes from).
UNTRAINED_SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "untrained": {
        "init": pl.String,
        "seed": pl.Int64,
        "norm": pl.Float64,
        "layer": pl.Int64,
        "head": pl.Int64,
        "site": pl.String,
        "metric": pl.String,
        "value": pl.Float64,
    },
    "histogram": {
        "init": pl.String,
        "seed": pl.Int64,
        "norm": pl.Float64,
        "layer": pl.Int64,
        "head": pl.Int64,
        "bin_lo": pl.Float64,
        "bin_hi": pl.Float64,
        "count": pl.Int64,
    },
    "summary": {
        "init": pl.String,
        "norm": pl.Float64,
        "layer": pl.Int64,
        "head": pl.Int64,
        "site": pl.String,
        "metric": pl.String,
        "mean": pl.Float64,
        "std": pl.Float64,
        "min": pl.Float64,
        "max": pl.Float64,
        "n_seeds": pl.UInt32,
    },
}
UNTRAINED_TABLES = tuple(UNTRAINED_SCHEMAS)


def extract_columns(name: str) -> list[str]:
    """Every column of extract's table `name`, as written: the identity columns, then the table's own."""
    return [*IDENTITY, *EXTRACT_SCHEMAS[name]]


#: The parameters a metric row may carry besides its place (layer, head, site): the subspace, how it was fitted,
#: its rank and the token stratum (the gradient metrics'; null elsewhere), in metrics.parquet's own columns.
METRIC_PARAMETERS = ("subspace", "fit", "rank", "stratum")

#: The columns that, with the identity columns, name one metric row: no two rows of a metric table share them.
METRIC_KEY = ("layer", "head", "site", "metric", *METRIC_PARAMETERS)

METRIC_SCHEMA = {
    **IDENTITY_SCHEMA,
    "layer": pl.Int64,
    "head": pl.Int64,
    "site": pl.String,
    "metric": pl.String,
    "subspace": pl.String,
    "fit": pl.String,
    "rank": pl.Int64,
    "stratum": pl.String,
    "value": pl.Float64,
    "measure": pl.String,  # the registered measure that wrote the row (anisweep.measures.registry)
    "reason": pl.String,  # why the value is NaN, where the measure knows (`unmeasured_row`); null elsewhere
}


def with_identity(df: pl.DataFrame, ident: dict) -> pl.DataFrame:
    """Prepend family, model, seed, step, tokens_seen to every row."""
    columns = [
        pl.lit(ident.get(key) if key in ("seed", "tokens_seen") else ident[key], dtype).alias(key)
        for key, dtype in IDENTITY_SCHEMA.items()
    ]
    return df.select([*columns, *[c for c in df.columns if c not in IDENTITY]])


def vectors(column: pl.Series):
    """A list (or array) column of equal-length vectors (hidden.parquet's `vector`, qk_sample's `q` and `k`) as one
    (rows, width) numpy array in its own dtype, read in one piece: a Python list per row and np.stack of them took
    a quarter of a metrics job."""
    if isinstance(column.dtype, pl.Array):
        return column.to_numpy()
    lengths = column.list.len()
    if column.len() == 0 or lengths.null_count() or lengths.min() != lengths.max():
        raise ValueError(f"column {column.name!r} holds no vectors, or vectors of different lengths: cannot stack them")
    return column.explode().to_numpy().reshape(column.len(), -1)


def write_atomic(df: pl.DataFrame, path: str | os.PathLike) -> None:
    """Write a parquet file under a temporary name, then rename it: a reader never sees half a file."""
    atomic.write_with(df.write_parquet, path)


class DamagedTable(ValueError):
    """A Parquet file an earlier run left cut short or corrupt: reading it again fails the same way."""


#: The tables extract writes beside EXTRACT_TABLES when it runs the gradient pass (anisweep.tangent).
EXTRACT_GRADIENT_TABLES = ("gradient_sums", "gradient_sample", "embedding_rows")

#: The rule that writes each table, by file name (the rest are named by their folder's rule in the message).
_MADE_BY = {
    **dict.fromkeys(EXTRACT_TABLES, "extract"),
    **dict.fromkeys(UNTRAINED_TABLES, "untrained"),
    **dict.fromkeys(EXTRACT_GRADIENT_TABLES, "extract"),
    **dict.fromkeys(("gradients", "gradient_bases"), "gradients"),
    "gradient_fixed_shares": "gradient_fixed_shares",
    "metrics": "metrics",
    "spectra": "metrics",
    "sweep": "sweep",
    "qk_svd": "qk_svd",
    "gradients_sweep": "gradients_sweep",
    "gradient_fixed_bases": "gradient_fixed_bases",
    "corpus": "corpus",
}


def _damaged(path: str | os.PathLike, error: Exception) -> DamagedTable | None:
    """The error to raise for `path` when polars' `error` says the file itself is not whole Parquet."""
    text = " ".join(str(error).split())
    if not text.startswith("parquet:") or "No space left" in text:
        return None
    rule = _MADE_BY.get(os.path.basename(os.fspath(path)).removesuffix(".parquet"))
    made = f" (the {rule} rule makes it)" if rule else ""
    return DamagedTable(
        f"{os.fspath(path)} is not a whole Parquet file ({text}): a job of an earlier run was cut short while "
        f"writing it, or the file was damaged since, and rerunning as is reads it again. Delete it (rm "
        f"{os.fspath(path)}) and rerun: the workflow makes it anew{made}"
    )


def _raise_damaged(path: str | os.PathLike, error: Exception) -> NoReturn:
    damaged = _damaged(path, error)
    if damaged is None:
        raise error
    raise damaged from None


def read_parquet(path: str | os.PathLike, **kwargs) -> pl.DataFrame:
    """`pl.read_parquet(path, **kwargs)`, its sampled vectors as float32 lists whatever `extract.sample_precision`
    stored them at (anisweep.sample_storage); a damaged file is a DamagedTable naming it and what to do."""
    columns = kwargs.pop("columns", None)
    try:
        if columns is not None:
            stored = sample_storage.stored_columns(pl.read_parquet_schema(path), columns)
            return sample_storage.decode(pl.read_parquet(path, columns=stored, **kwargs)).select(columns)
        return sample_storage.decode(pl.read_parquet(path, **kwargs))
    except pl.exceptions.ComputeError as error:
        _raise_damaged(path, error)


def scan_parquet(path: str | os.PathLike, **kwargs) -> pl.LazyFrame:
    """`pl.scan_parquet(path, **kwargs)` of a file whose footer reads (checked now, not at collect): a damaged
    file is a DamagedTable naming it and what to do."""
    try:
        pl.read_parquet_schema(path)
    except pl.exceptions.ComputeError as error:
        _raise_damaged(path, error)
    return pl.scan_parquet(path, **kwargs)


def empty_metrics() -> pl.DataFrame:
    return pl.DataFrame(schema=METRIC_SCHEMA)


def unmeasured_row(measure: str, site: str, reason: str) -> dict:
    """The one row of a measure that cannot run on a checkpoint (a model saved without the head it reads, an
    architecture it cannot read): its metric is the measure's own name, its value NaN (status `nan` in the sweep),
    `reason` says why. It takes none of the checkpoint's other rows down."""
    return {"site": site, "metric": measure, "value": float("nan"), "reason": reason}


def in_metric_schema(df: pl.DataFrame) -> pl.DataFrame:
    """A metric table in METRIC_SCHEMA; one written before `reason` was a column (a stream measure's, which extract
    wrote) gets it as nulls."""
    if "reason" not in df.columns:
        df = df.with_columns(pl.lit(None, pl.String).alias("reason"))
    return df.select(list(METRIC_SCHEMA)).cast(METRIC_SCHEMA)


def check_metric_keys(df: pl.DataFrame, key: tuple[str, ...] = METRIC_KEY, where: str = "metrics") -> None:
    """Raise ValueError when two rows of a metric table share their `key` columns: a metric measured twice at
    the same place, or a parameter (subspace, fit, rank, stratum) that was left out of a row."""
    duplicates = df.filter(df.select(list(key)).is_duplicated())  # nulls compare as equal
    if not duplicates.is_empty():
        shown = duplicates.select(list(key)).unique(maintain_order=True).head(5).to_dicts()
        raise ValueError(f"{where}: {duplicates.height} rows share their key columns {list(key)}, e.g. {shown}")


def metric_rows(ident: dict, rows: list[dict], measure: str | None = None) -> pl.DataFrame:
    """Tidy metric rows (layer, head, site, metric, subspace, fit, rank, stratum, value, reason; a missing key is
    null) with the identity columns and `measure`, in METRIC_SCHEMA. Raises ValueError when two rows share their
    METRIC_KEY."""
    if not rows:
        return empty_metrics()
    df = pl.DataFrame(
        [
            {
                **{column: r.get(column) for column in METRIC_KEY},
                "metric": r["metric"],
                "value": None if r["value"] is None else float(r["value"]),
                "reason": r.get("reason"),
            }
            for r in rows
        ],
        schema={k: METRIC_SCHEMA[k] for k in (*METRIC_KEY, "value", "reason")},
    )
    check_metric_keys(df)
    df = df.with_columns(pl.lit(measure, pl.String).alias("measure"))
    return with_identity(df, ident).select(list(METRIC_SCHEMA)).cast(METRIC_SCHEMA)
