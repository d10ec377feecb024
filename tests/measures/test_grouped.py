"""vectors_by_group: the groups of a table's vectors as polars' group_by gives them, split with numpy."""

import numpy as np
import polars as pl
import pytest

from anisweep.measures.grouped import vectors_by_group
from anisweep.tables import vectors


def _by_polars(df, keys, column):
    return [
        (key, vectors(group[column]).astype(np.float64))
        for key, group in sorted(df.group_by(*keys), key=lambda g: g[0])
    ]


def test_groups_equal_polars_group_by_in_order_and_values():
    rng = np.random.default_rng(0)
    n = 50
    df = pl.DataFrame(
        {
            "layer": rng.integers(0, 3, n),
            "site": rng.choice(["resid", "final_ln_in"], n),
            "vector": rng.standard_normal((n, 4)).astype(np.float32).tolist(),
        },
        schema_overrides={"vector": pl.List(pl.Float32)},
    )
    got = vectors_by_group(df, ("layer", "site"), ("vector",))
    want = _by_polars(df, ("layer", "site"), "vector")
    assert [key for key, _ in got] == [key for key, _ in want]
    for (_, columns), (_, x) in zip(got, want):
        assert columns["vector"].dtype == np.float64
        np.testing.assert_array_equal(columns["vector"], x)


def test_groups_of_different_widths_are_split_group_by_group():
    df = pl.DataFrame({"layer": [1, 0, 1, 0], "vector": [[1.0, 2.0, 3.0], [4.0, 5.0], [6.0, 7.0, 8.0], [9.0, 0.0]]})
    got = dict(vectors_by_group(df, ("layer",), ("vector",)))
    np.testing.assert_array_equal(got[(0,)]["vector"], [[4.0, 5.0], [9.0, 0.0]])
    np.testing.assert_array_equal(got[(1,)]["vector"], [[1.0, 2.0, 3.0], [6.0, 7.0, 8.0]])


def test_a_group_of_mixed_widths_is_an_error():
    df = pl.DataFrame({"layer": [0, 0, 1], "vector": [[1.0, 2.0], [3.0], [4.0, 5.0]]})
    with pytest.raises(ValueError, match="different lengths"):
        vectors_by_group(df, ("layer",), ("vector",))
