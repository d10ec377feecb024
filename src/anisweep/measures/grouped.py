"""The sampled vectors of a table split by group (hidden.parquet per (layer, site), qk_sample.parquet per (layer,
head, rope)) with numpy, from one array per column: iterating polars' group_by ran a query per group, and turning
each group's column into an array several more, most of a metrics job's time on a small model."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from anisweep.tables import vectors


def group_rows(df: pl.DataFrame, keys: Sequence[str]) -> list[tuple[tuple, np.ndarray]]:
    """[(key, the group's row indices in the table's order)] for each distinct value of `keys`, in sorted order."""
    groups = df.select(keys).with_row_index("row").group_by(keys).agg(pl.col("row"))
    groups = sorted(groups.iter_rows(), key=lambda group: group[:-1])
    return [(group[:-1], np.sort(np.asarray(group[-1], dtype=np.int64))) for group in groups]


def vectors_by_group(
    df: pl.DataFrame,
    keys: Sequence[str],
    columns: Sequence[str],
    groups: list[tuple[tuple, np.ndarray]] | None = None,
    dtype: type = np.float64,
) -> list[tuple[tuple, dict[str, np.ndarray]]]:
    """[(key, {column: the group's vectors as one `dtype` array (rows, width)})] for each distinct value of `keys`,
    in sorted order of the key, each group's rows in the table's order (`groups`: group_rows of the same keys, where
    the caller has them)."""
    groups = group_rows(df, keys) if groups is None else groups
    split = {column: _split(df[column], [rows for _, rows in groups]) for column in columns}
    return [
        (key, {column: split[column][i].astype(dtype, copy=False) for column in columns})
        for i, (key, _) in enumerate(groups)
    ]


def _split(column: pl.Series, rows: list[np.ndarray]) -> list[np.ndarray]:
    try:
        whole = vectors(column)
    except ValueError:  # vectors of several widths (a model whose width changes with depth): group by group
        return [vectors(column.gather(index)) for index in rows]
    return [_rows_of(whole, index) for index in rows]


def _rows_of(whole: np.ndarray, index: np.ndarray) -> np.ndarray:
    """whole[index]: a view where the rows are one run (a table written group after group), else a copy."""
    if len(index) and index[-1] - index[0] + 1 == len(index) and np.all(np.diff(index) == 1):
        return whole[index[0] : index[-1] + 1]
    return whole[index]
