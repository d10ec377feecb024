"""The Triton attention kernels compiled for sm_90 and sm_80 without a GPU (every shape the sweeps run: no
spills, shared memory within the limit), and extract's fallback to the torch path where the kernels decline
a shape or fail at its launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

pytest.importorskip("triton")  # in the test extra on Linux

from triton.runtime.errors import PTXASError

from anisweep.extract import attention_triton

from conftest import assert_tables_equal, bert_config, padded_batch, run_extract, saved

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compile_kernels.py"


def ptxas_or_skip() -> None:
    compiler = pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton's CUDA compiler is missing")
    for arch in (80, 90):
        try:
            compiler.get_ptxas(arch)
        except RuntimeError as error:
            pytest.skip(f"Triton's ptxas for sm_{arch} is missing: {error}")


@pytest.mark.slow
def test_every_configuration_compiles_without_spills(tmp_path):
    """benchmarks/compile_kernels.py in a process without TRITON_INTERPRET (about a minute on 2 cores): every
    configuration of sm_90 and sm_80 compiles, spills nothing and fits the shared memory of a block; rows of
    more than MAX_KEYS keys compile nothing (torch)."""
    ptxas_or_skip()
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--out-dir", str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "kernel_compile.json").read_text())
    rows = report["configurations"]
    assert {row["arch"] for row in rows} == {80, 90}
    assert len(rows) == 2 * 3 * 3 * 6 * 2  # arch, dtype, d_head, T, causal
    for row in rows:
        name = f"{row['arch']} {row['dtype']} d_head {row['d_head']} T {row['T']} causal {row['causal']}"
        if row["T"] > attention_triton.MAX_KEYS:
            assert row["kernel"] == "torch", name
            continue
        fused = row["dtype"] != "float32" and row["T"] <= attention_triton.FUSED_MAX_KEYS
        assert row["kernel"] == ("fused_kernel" if fused else "scores_kernel"), name
        assert row["error"] is None, f"{name}: {row['error']}"
        assert row["spill_stores"] == row["spill_loads"] == 0, name
        assert row["shared"] <= report["shared_limit"][str(row["arch"])], name
        assert row["fits"], name
    assert (tmp_path / "kernel_compile.md").read_text().count("\n| ") == len(rows) + 1


def failing_launches(monkeypatch) -> list:
    """Makes every kernel launch fail as a compile error would; returns the shapes of the launches' queries."""
    shapes = []

    def fail(launch):
        shapes.append(tuple(launch.args[0].shape))
        raise PTXASError("ptxas exited with 255")

    monkeypatch.setattr(attention_triton.Launch, "__call__", fail)
    return shapes


@pytest.fixture
def fresh_fallbacks(monkeypatch):
    monkeypatch.setattr(attention_triton, "_fallen_back", {})


def test_failing_launch_warns_once_and_returns_none(monkeypatch, fresh_fallbacks):
    launched = failing_launches(monkeypatch)
    q = torch.randn(2, 2, 13, 16, dtype=torch.bfloat16)
    valid = torch.ones(2, 13, dtype=torch.bool)
    with pytest.warns(attention_triton.FallbackWarning, match=r"13 keys, d_head 16.*PTXASError") as caught:
        for _ in range(3):
            assert attention_triton.try_attend(q, q, q, 0.25, valid, causal=True) is None
    assert len(caught) == 1 and len(launched) == 1  # the shape is not launched again
    with pytest.warns(attention_triton.FallbackWarning) as caught:  # another shape: its own warning
        assert attention_triton.try_attend(q, q, q, 0.25, valid, causal=False) is None
    assert len(caught) == 1


@pytest.mark.slow  # over ~1 s: the quick subset leaves it to the full run
@pytest.mark.parametrize(
    "why, message", [("compile_error", "PTXASError"), ("too_many_keys", "MAX_KEYS = 8"), ("dtype", "torch.float32 is")]
)
def test_extract_falls_back_to_the_torch_path(tmp_path, monkeypatch, fresh_fallbacks, why, message):
    """A whole extract with attention: triton where the kernel fails to compile, or declines the rows (more than
    MAX_KEYS keys; a dtype it was not built for): the torch path's tables, and one warning for the one shape of
    every batch and layer."""
    path = saved(tmp_path, transformers.BertModel, bert_config(), "bert")
    batch = padded_batch(n=5)
    expected, _ = run_extract(path, batch, attention="torch")
    launched = []
    if why == "compile_error":
        launched = failing_launches(monkeypatch)
    elif why == "too_many_keys":
        monkeypatch.setattr(attention_triton, "MAX_KEYS", 8)
    else:
        monkeypatch.setattr(attention_triton, "DTYPES", (torch.bfloat16,))
    calls, try_attend = [], attention_triton.try_attend
    monkeypatch.setattr(attention_triton, "try_attend", lambda *args, **kw: calls.append(1) or try_attend(*args, **kw))
    with pytest.warns(attention_triton.FallbackWarning, match=message) as caught:
        got, _ = run_extract(path, batch, attention="triton")
    assert len(calls) == 3 * 2  # batches of 2 of the 5 sequences (all of 12 tokens), 2 layers: one shape
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert len(launched) == (why == "compile_error")  # a failed shape is not launched again
    for name in ("qk", "attention"):
        assert_tables_equal(got[name], expected[name], name, rtol=0.0)
