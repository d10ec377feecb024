"""The sampled vectors' storage (extract.sample_precision, anisweep.sample_storage): what each precision keeps, that
every reader gets float32 back from files of any storage, older float32 ones bit for bit, that the sum-built tables
do not depend on it, and that the sample-based measures stay within their stated tolerance of float32."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from anisweep import sample_storage
from anisweep.extract import tables as extract_tables
from anisweep.extract.model import ExtractSettings, load_model
from anisweep.extract.run import run
from anisweep.schema import defaults
from anisweep.tables import read_parquet, write_atomic

from conftest import bert_config, neox_config, padded_batch, saved

IDENT = {"family": "test", "model": "m", "seed": 0, "step": 3, "tokens_seen": 30}


def stored(tmp_path, x: np.ndarray, precision: str, name: str = "vector"):
    """x written at `precision` as a table's column `name`, and read back."""
    frame = pl.DataFrame({"row": np.arange(len(x))}).with_columns(*sample_storage.vector_columns(name, x, precision))
    path = tmp_path / f"{precision}.parquet"
    write_atomic(frame, path)
    return path, read_parquet(path)


def as_array(column: pl.Series) -> np.ndarray:
    return column.explode().to_numpy().reshape(column.len(), -1)


def test_int8_keeps_each_vectors_largest_components_exactly_and_the_rest_within_half_a_step(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 256)).astype(np.float32)
    x[:, 7] += 40  # a rogue dimension, in every vector
    x[3, 11] = 3e4  # a massive activation
    x[5] = 0  # a zero vector
    x[9, 2] = np.inf
    path, back = stored(tmp_path, x, "int8")
    assert pl.read_parquet(path).schema["vector"] == pl.Binary  # one byte per component on disk
    assert back.columns == ["row", "vector"] and back.schema["vector"] == pl.List(pl.Float32)
    y = as_array(back["vector"])
    finite = np.isfinite(x).all(axis=1)
    assert np.isnan(y[9]).all() and np.isfinite(y[finite]).all()
    assert (y[:, 7][finite] == x[:, 7][finite]).all() and y[3, 11] == x[3, 11] and (y[5] == 0).all()
    for row in np.flatnonzero(finite):
        largest = np.argsort(-np.abs(x[row]))
        exact, rest = largest[: sample_storage.outliers(256)], largest[sample_storage.outliers(256) :]
        assert (y[row, exact] == x[row, exact]).all()
        step = np.abs(x[row, rest]).max() / 127
        assert np.abs(y[row, rest] - x[row, rest]).max() <= step / 2 * (1 + 1e-5)


def test_float16_rounds_each_component_and_refuses_one_beyond_its_range(tmp_path):
    x = np.random.default_rng(1).standard_normal((50, 16)).astype(np.float32) * 100
    _, back = stored(tmp_path, x, "float16")
    assert np.abs(as_array(back["vector"]) - x).max() <= np.abs(x).max() * 2.0**-11
    x[4, 2] = 7e4
    with pytest.raises(ValueError, match=r"layer 2 resid holds a component of magnitude 70000.*set extract"):
        sample_storage.vector_columns("vector", x, "float16", "layer 2 resid")


def test_an_older_float32_table_reads_back_bit_for_bit_and_columns_are_read_in_their_stored_form(tmp_path):
    x = np.random.default_rng(2).standard_normal((30, 8)).astype(np.float32)
    older = pl.DataFrame({"layer": np.zeros(30, np.int64)}).with_columns(
        pl.Series("vector", x).cast(pl.List(pl.Float32))
    )
    older.write_parquet(tmp_path / "hidden.parquet")  # as a package without extract.sample_precision wrote it
    assert read_parquet(tmp_path / "hidden.parquet").equals(older)
    path, _ = stored(tmp_path, x, "int8")
    picked = read_parquet(path, columns=["vector"])
    assert picked.columns == ["vector"] and np.abs(as_array(picked["vector"]) - x).max() < 0.02


def test_vectors_of_several_widths_in_one_table_read_back(tmp_path):
    """A model whose width changes with depth (CvT's stages) stores rows of several widths in one column."""
    rng = np.random.default_rng(3)
    narrow, wide = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((4, 20)).astype(np.float32)
    frame = pl.concat(
        pl.DataFrame({"stage": np.full(len(v), i)}).with_columns(*sample_storage.vector_columns("vector", v, "int8"))
        for i, v in enumerate((narrow, wide))
    )
    back = sample_storage.decode(frame)["vector"].to_list()
    assert np.abs(np.array(back[:5], np.float32) - narrow).max() <= np.abs(narrow).max() / 254 * (1 + 1e-5)
    assert np.abs(np.array(back[5:], np.float32) - wide).max() <= np.abs(wide).max() / 254 * (1 + 1e-5)


def test_the_default_is_float32_the_output_contracts_type_and_reaches_extract():
    assert defaults("extract")["sample_precision"] == "float32" == ExtractSettings().sample_precision


@pytest.mark.parametrize("arch", ["neox", "bert"])
def test_the_sum_built_tables_are_the_same_at_every_precision(tmp_path, arch):
    """Only the sampled tables depend on the storage: every other table of extract is bit for bit float32's."""
    from transformers import BertForMaskedLM, GPTNeoXForCausalLM

    cls, config = {"neox": (GPTNeoXForCausalLM, neox_config), "bert": (BertForMaskedLM, bert_config)}[arch]
    loaded = load_model(saved(tmp_path, cls, config(), "m"), device="cpu")
    settings = ExtractSettings(batch_size=2, sample_tokens=10_000, qk_sample_tokens=10_000, device="cpu")
    recorder = run(loaded, padded_batch(), settings, progress=False)
    by_precision = {p: extract_tables.tables(recorder, loaded, IDENT, precision=p) for p in sample_storage.PRECISIONS}
    sampled = ("hidden", "qk_sample", "masked_resid")
    for precision, written in by_precision.items():
        for name, frame in written.items():
            reference = by_precision["float32"][name]
            if name not in sampled:
                assert frame.equals(reference), (precision, name)
                continue
            decoded = sample_storage.decode(frame)
            assert decoded.schema == reference.schema, (precision, name)
            for column in sample_storage.VECTOR_COLUMNS:
                if column in reference.columns and reference.height:
                    x, y = as_array(reference[column]), as_array(decoded[column])
                    assert np.abs(y - x).max() <= np.abs(x).max() / 254 * (1 + 1e-5), (precision, name, column)
