"""`anisweep weights` of one checkpoint: the built-in circuits' two tables, and none of their rows (said in the
log) for an architecture no layout names (an encoder-decoder here; image and audio models alike)."""

from __future__ import annotations

import json

import polars as pl
from transformers import GPTNeoXForCausalLM, T5ForConditionalGeneration

from anisweep.cli import main

from conftest import neox_config, saved, t5_config


def checkpoint_arg(path) -> str:
    return json.dumps({"family": "local", "model": "m", "step": 3, "tokens_seen": 30, "seed": 0, "path": str(path)})


def run(path, tmp_path) -> tuple[int, pl.DataFrame, pl.DataFrame]:
    out, pairs = tmp_path / "weights.parquet", tmp_path / "weight_pairs.parquet"
    code = main(["weights", "--checkpoint", checkpoint_arg(path), "--out", str(out), "--pairs-out", str(pairs)])
    return code, pl.read_parquet(out), pl.read_parquet(pairs)


def test_the_builtin_writes_its_rows_and_pairs(tmp_path):
    code, rows, pairs = run(saved(tmp_path, GPTNeoXForCausalLM, neox_config(), "lm"), tmp_path)
    assert code == 0
    assert set(rows["measure"]) == {"circuits"} and set(rows["site"]) == {"weights"} and rows["step"][0] == 3
    assert pairs.height == 2 * 4 * 2 * 5 and set(pairs["kind"]) == {"qk", "ov"}  # layers x heads x kinds x ranks


def test_an_architecture_without_a_layout_gets_no_rows(tmp_path, capsys):
    code, rows, pairs = run(saved(tmp_path, T5ForConditionalGeneration, t5_config(), "t5"), tmp_path)
    assert code == 0 and rows.height == 0 and pairs.height == 0
    assert "model_type is 't5'" in capsys.readouterr().err
