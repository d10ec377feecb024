"""anisweep.tables.vectors: a column of vectors read as one array, as np.stack of its rows would give it."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from anisweep.tables import vectors


def test_a_list_column_reads_as_the_stack_of_its_rows():
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(5, 3)).astype(np.float32)
    rows[1, 2] = np.nan  # a non-finite component stays where it is
    column = pl.Series("vector", [list(map(float, r)) for r in rows], dtype=pl.List(pl.Float32))
    got = vectors(column)
    assert got.shape == (5, 3) and got.dtype == np.float32
    np.testing.assert_array_equal(got, np.stack(column.to_list()).astype(np.float32))
    np.testing.assert_array_equal(vectors(column[2:4]), rows[2:4])  # a slice, as a group of a group_by is


def test_an_array_column_reads_as_its_own_array():
    rows = np.arange(6, dtype=np.float64).reshape(3, 2)
    np.testing.assert_array_equal(vectors(pl.Series("delta", rows)), rows)


@pytest.mark.parametrize("values", [[[1.0, 2.0], [3.0]], [[1.0], None], []], ids=["ragged", "null", "empty"])
def test_vectors_that_do_not_stack_are_refused(values):
    with pytest.raises(ValueError, match="cannot stack"):
        vectors(pl.Series("vector", values, dtype=pl.List(pl.Float32)))
