"""How extract stores the sampled vectors (hidden.parquet's and masked_resid.parquet's `vector`, qk_sample.parquet's
`q` and `k`), `extract.sample_precision`, and reading them back as float32 whatever the storage.

- `float32` (the default, the output contract's type): list<float32>, as computed.
- `float16`: list<float16>: each component rounded to 11 significant bits (relative error <= 2^-11); a component
  beyond float16's range (65504) is an error at write time, naming the site.
- `int8`: per vector, its `outliers(d)` components of largest magnitude kept exactly (`{c}_outlier_dim`,
  `{c}_outlier_value`: massive activations and rogue dimensions lose nothing), the others as round(x / s) in int8
  (`{c}`, binary: one signed byte per component, since Parquet stores a list<int8> as 32-bit integers) with one
  float32 scale s = max |x_j| / 127 over them (`{c}_scale`): each such component within s / 2 of its value. A vector
  with a non-finite component reads back as all NaN (the measures drop such rows).

`decode` turns a table of any of the three into the float32 lists of the output contract; anisweep.tables.read_parquet
applies it, so every reader gets float32 vectors from files of any storage, older float32 ones included.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl
import pyarrow as pa

PRECISIONS = ("float32", "float16", "int8")
#: the most components per vector kept exactly in `int8` storage (`outliers`)
OUTLIERS = 4


def outliers(d: int) -> int:
    """The components kept exactly of a vector of d: one per 64 components, at least one, at most OUTLIERS."""
    return min(OUTLIERS, max(1, d // 64), d)


#: the columns of sampled vectors in extract's tables
VECTOR_COLUMNS = ("vector", "q", "k")
_AUXILIARY = ("_scale", "_outlier_dim", "_outlier_value")
_FLOAT16_MAX = float(np.finfo(np.float16).max)


def vector_columns(name: str, x: np.ndarray, precision: str, where: str = "") -> list[pl.Series]:
    """The columns that store the rows of `x` (vectors of one width) as column `name` at `precision`; `where` names
    the site in an error."""
    x = np.asarray(x, dtype=np.float32)
    if precision == "float32":
        return [pl.Series(name, x).cast(pl.List(pl.Float32))]
    if precision == "float16":
        finite = x[np.isfinite(x)]
        if finite.size and np.abs(finite).max() > _FLOAT16_MAX:
            raise ValueError(
                f"extract.sample_precision float16: {where or name} holds a component of magnitude "
                f"{np.abs(finite).max():.6g}, beyond float16's {_FLOAT16_MAX:g}: set extract.sample_precision to int8 "
                "(its largest components are kept exactly) or float32"
            )
        return [pl.Series(name, x.astype(np.float16)).cast(pl.List(pl.Float16))]
    if precision == "int8":
        return _int8_columns(name, x)
    raise ValueError(f"extract.sample_precision {precision!r} is not one of {', '.join(PRECISIONS)}")


def _int8_columns(name: str, x: np.ndarray) -> list[pl.Series]:
    n, d = x.shape
    k = outliers(d)
    finite = np.isfinite(x).all(axis=1)
    safe = np.where(finite[:, None], x, np.float32(0))
    dims = np.sort(np.argpartition(-np.abs(safe), k - 1, axis=1)[:, :k], axis=1) if k else np.zeros((n, 0), np.int64)
    values = np.take_along_axis(safe, dims, axis=1)
    values[~finite] = np.nan
    rest = safe.copy()
    np.put_along_axis(rest, dims, np.float32(0), axis=1)
    scale = (np.abs(rest).max(axis=1, initial=0) / np.float32(127)).astype(np.float32)
    codes = np.zeros_like(rest)
    np.divide(rest, scale[:, None], out=codes, where=scale[:, None] > 0)
    codes = np.clip(np.rint(codes), -127, 127).astype(np.int8)
    scale[~finite] = np.nan
    return [
        _binary(name, codes),
        pl.Series(f"{name}_scale", scale, dtype=pl.Float32),
        pl.Series(f"{name}_outlier_dim", dims.astype(np.int32)).cast(pl.List(pl.Int32)),
        pl.Series(f"{name}_outlier_value", values.astype(np.float32)).cast(pl.List(pl.Float32)),
    ]


def _binary(name: str, codes: np.ndarray) -> pl.Series:
    """One binary value per row of the int8 array `codes`: its bytes."""
    n, d = codes.shape
    offsets = np.arange(0, (n + 1) * d, d, dtype=np.int64)
    array = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(codes).tobytes())]
    )
    return pl.Series(name, pl.from_arrow(array))


def _unbinary(column: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """(the concatenated int8 codes, the bytes per row) of a binary column written by `_binary`."""
    array = column.rechunk().to_arrow()
    array = (array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array).cast(pa.large_binary())
    _, offsets, data = array.buffers()
    offsets = np.frombuffer(offsets, np.int64)[array.offset : array.offset + len(array) + 1]
    codes = np.frombuffer(data, np.int8)[offsets[0] : offsets[-1]] if len(array) else np.zeros(0, np.int8)
    return codes, np.diff(offsets)


def precision_of(df: pl.DataFrame | pl.Schema, column: str) -> str:
    """The storage of a vector column of a table (or its schema)."""
    schema = df.schema if isinstance(df, pl.DataFrame) else df
    if f"{column}_scale" in schema:
        return "int8"
    return "float16" if schema[column] == pl.List(pl.Float16) else "float32"


def stored_columns(schema: pl.Schema, columns: Sequence[str]) -> list[str]:
    """`columns` and the auxiliary columns that store their vectors, those the file's `schema` has."""
    extra = [f"{c}{suffix}" for c in columns if c in VECTOR_COLUMNS for suffix in _AUXILIARY]
    return [*columns, *(c for c in extra if c in schema and c not in columns)]


def decode(df: pl.DataFrame) -> pl.DataFrame:
    """`df` with each stored vector column as list<float32>, its auxiliary columns dropped; a float32 table as is."""
    for column in VECTOR_COLUMNS:
        if column not in df.columns:
            continue
        precision = precision_of(df, column)
        if precision == "float16":
            df = df.with_columns(pl.col(column).cast(pl.List(pl.Float32)))
        elif precision == "int8":
            df = df.with_columns(_int8_decoded(df, column)).drop(f"{column}{s}" for s in _AUXILIARY)
    return df


def _flat(column: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """(the concatenated values, the list lengths) of a list column without empty lists or nulls."""
    lengths = column.list.len().fill_null(0).to_numpy().astype(np.int64)
    if lengths.sum() == 0:
        return np.zeros(0), lengths
    return column.explode().to_numpy(), lengths


def _int8_decoded(df: pl.DataFrame, column: str) -> pl.Series:
    codes, lengths = _unbinary(df[column])
    values = codes.astype(np.float32) * np.repeat(df[f"{column}_scale"].to_numpy().astype(np.float32), lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    dims, n_outliers = _flat(df[f"{column}_outlier_dim"])
    if len(dims):
        values[np.repeat(offsets[:-1], n_outliers) + dims.astype(np.int64)] = _flat(df[f"{column}_outlier_value"])[0]
    lists = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values, pa.float32()))
    return pl.Series(column, pl.from_arrow(lists)).cast(pl.List(pl.Float32))
