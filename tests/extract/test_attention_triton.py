"""The Triton attention kernels, run on CPU tensors by Triton's interpreter, against eager attention in
float64, the torch path's row statistics, and a whole extract."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

pytest.importorskip("triton")  # in the test extra on Linux

from test_extract import (
    bert_config,
    check_all,
    llama_config,
    neox_config,
    padded_batch,
    reference,
    run_extract,
    saved,
)
from test_streaming import attention_rows

from anisweep.extract import attention_triton, recorder
from anisweep.extract.streaming import LOG2_E, ROW_FIELDS, SCORE_FIELDS

TESTS = Path(__file__).parents[1]

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-5, torch.float16: 1e-5}  # statistics: the scores are float32
OUTPUT_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}  # p and the output are rounded


def inputs(b=3, h=2, t=13, d=16, dtype=torch.float32, lengths=(13, 6, 1), seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, t, d, generator=g).mul(scale).to(dtype) for scale in (2.0, 1.0, 1.0))
    valid = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    return q, k, v, d**-0.5, valid


def eager(q, k, v, scaling, valid, causal):
    """Softmax attention, each row's ROW_FIELDS by their definitions (SCORE_FIELDS in bits), in float64, with a
    full sort, and each key's column sum over the valid query rows."""
    q, k, v = q.double(), k.double(), v.double()
    t = q.shape[-2]
    s = scaling * q @ k.transpose(-1, -2)
    visible = valid[:, None, None, :].expand_as(s)
    if causal:
        visible = visible & torch.ones(t, t, dtype=torch.bool).tril()
    m = s.masked_fill(~visible, -torch.inf).amax(-1, keepdim=True)
    e = (s - m).exp().masked_fill(~visible, 0.0)
    z = e.sum(-1, keepdim=True)
    p = e / z
    n = visible.sum(-1, keepdim=True)
    ordered = p.masked_fill(~visible, torch.inf).sort(-1).values
    at = lambda i: ordered.gather(-1, i).squeeze(-1)  # noqa: E731
    fields = {
        "p_dot_shifted": (p * (s - m)).masked_fill(~visible, 0.0).sum(-1),
        "p_min": at(torch.zeros_like(n)),
        "p_lower": at((n - 1) // 2),
        "p_upper": at(n // 2),
        "p_max": at(n - 1),
        "score_max": m.squeeze(-1),
        "shifted_sum": (s - m).masked_fill(~visible, 0.0).sum(-1),
        "shifted_norm": (s - m).masked_fill(~visible, 0.0).square().sum(-1).sqrt(),
        "z": z.squeeze(-1),
    }
    colsum = torch.where(valid[:, None, :, None], p, 0.0).sum(-2)
    rows = torch.stack([fields[name] for name in ROW_FIELDS], dim=-1)
    rows[..., SCORE_FIELDS] *= LOG2_E
    return p @ v, rows, colsum


def assert_matches(got, expected, valid, dtype):
    """Every ROW_FIELDS value and the output, on the rows of valid queries, and every column sum."""
    (output, rows, colsum), (ref_output, ref_rows, ref_colsum) = got, expected
    assert colsum.dtype == torch.float32 and colsum.shape == ref_colsum.shape
    np.testing.assert_allclose(colsum.numpy(), ref_colsum.numpy(), rtol=1e-5, atol=1e-5, err_msg="column sums")
    assert output.dtype == dtype and rows.dtype == torch.float32
    assert torch.isfinite(output).all() and torch.isfinite(rows).all()
    keep = valid[:, None, :].expand(rows.shape[:3])
    for i, name in enumerate(ROW_FIELDS):
        np.testing.assert_allclose(
            rows[..., i][keep].numpy(), ref_rows[..., i][keep].numpy(), rtol=TOL[dtype], atol=TOL[dtype], err_msg=name
        )
    np.testing.assert_allclose(
        output.float()[keep].numpy(),
        ref_output[keep].numpy(),
        rtol=OUTPUT_TOL[dtype],
        atol=OUTPUT_TOL[dtype],
        err_msg="output",
    )


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize(
    "dtype, causal, d",
    [
        (torch.float32, False, 16),
        (torch.float32, True, 64),
        (torch.bfloat16, False, 64),
        (torch.bfloat16, True, 16),
        (torch.float16, True, 16),
    ],
)
def test_matches_eager_reference(dtype, causal, d):
    """Padding (sequences of 13, 6 and 1 tokens: rows with one visible key), 13 keys (not a power of two);
    bf16 and fp16 run the fused kernel, float32 the scores kernel after torch's matmul."""
    q, k, v, scaling, valid = inputs(d=d, dtype=dtype)
    assert attention_triton._fits_fused(q, v) == (dtype != torch.float32)
    assert_matches(
        attention_triton.attend(q, k, v, scaling, valid, causal), eager(q, k, v, scaling, valid, causal), valid, dtype
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ties(dtype):
    """All scores of a row equal (q = 0), and keys repeated so that the middle values tie."""
    q, k, v, scaling, valid = inputs(b=2, h=1, t=11, dtype=dtype, lengths=(11, 8))
    q[0] = 0.0
    k[1] = k[1, :, [0, 0, 1, 1, 1, 2, 2, 3, 3, 3, 3]]
    got = attention_triton.attend(q, k, v, scaling, valid, causal=False)
    assert_matches(got, eager(q, k, v, scaling, valid, causal=False), valid, dtype)
    uniform = got[1][0, 0, :, ROW_FIELDS.index("p_lower")]
    np.testing.assert_allclose(uniform.numpy(), 1 / 11, rtol=1e-6)


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize("path", ["fused", "scores"])
def test_row_blocks_and_score_chunks(monkeypatch, path):
    """Several blocks of query rows per head (causal: each block loads only the keys its rows see), and
    for the scores path one chunk per head; bf16 through either path."""
    monkeypatch.setattr(attention_triton, "ROW_TILE", 1024)  # 40 keys -> blocks of 16 rows
    monkeypatch.setattr(attention_triton, "SCORES_CHUNK", 40 * 40)
    if path == "scores":
        monkeypatch.setattr(attention_triton, "FUSED_TILE_BYTES", 0)
    q, k, v, scaling, valid = inputs(b=2, h=2, t=40, dtype=torch.bfloat16, lengths=(40, 29))
    assert attention_triton._fits_fused(q, v) == (path == "fused")
    assert attention_triton._blocks(40, 16 if path == "fused" else 1)[0] == 16
    assert_matches(
        attention_triton.attend(q, k, v, scaling, valid, causal=True),
        eager(q, k, v, scaling, valid, causal=True),
        valid,
        torch.bfloat16,
    )


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize("causal", [False, True])
def test_torch_path_agrees(causal):
    """The CPU path's masked_exp_ and row_statistics give the kernel's row statistics."""
    q, k, v, scaling, valid = inputs()
    _, rows, _ = attention_triton.attend(q, k, v, scaling, valid, causal)
    torch_rows = attention_rows(q, k, scaling, valid, causal)
    for seq in range(q.shape[0]):
        np.testing.assert_allclose(
            rows[seq][:, valid[seq]].numpy(), torch_rows[seq][:, valid[seq]].numpy(), rtol=2e-6, atol=1e-6
        )


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
def test_refuses_cpu_tensors_without_interpreter():
    code = (
        "import torch; from anisweep.extract import attention_triton as a; q = torch.zeros(1, 1, 4, 16)\n"
        "try: a.attend(q, q, q, 1.0, torch.ones(1, 4, dtype=torch.bool), False)\n"
        "except ValueError as e: print(a.INTERPRETED, e)"
    )
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.startswith("False Triton attention runs on CUDA tensors")


def test_attention_setting_picks_the_kernel():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert recorder.attention_kernel("auto", cpu) is None
    assert recorder.attention_kernel("torch", cuda) is None
    assert recorder.attention_kernel("triton", cpu) is attention_triton
    assert recorder.attention_kernel("auto", cuda) is attention_triton
    assert not attention_triton.supports(torch.zeros(1, 1, attention_triton.MAX_KEYS + 1, 16))


def test_missing_triton_warns_once_and_falls_back(monkeypatch):
    monkeypatch.setitem(sys.modules, "anisweep.extract.attention_triton", None)  # import raises ImportError
    monkeypatch.delattr(sys.modules["anisweep.extract"], "attention_triton")
    recorder._triton_or_warn.cache_clear()
    try:
        with pytest.warns(UserWarning, match="Triton does not import") as caught:
            assert recorder.attention_kernel("auto", torch.device("cuda")) is None
            assert recorder.attention_kernel("auto", torch.device("cuda")) is None
        assert len(caught) == 1
    finally:
        recorder._triton_or_warn.cache_clear()


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize(
    "kind", ["bert", pytest.param("gpt_neox", marks=pytest.mark.slow), pytest.param("llama", marks=pytest.mark.slow)]
)
def test_extract_through_the_kernel(tmp_path, kind, monkeypatch):
    """A whole extract with attention: triton (BERT with padding; GPT-NeoX causal with partial rotary; Llama with
    grouped-query attention, whose key heads the recorder repeats before the kernel) gives the torch path's
    tables and the eager reference's statistics. The kernel must decline nothing here (a fallback warning is an
    error): the fallback catches any failure of a launch, so a bug in the kernel would hide behind the torch path."""
    cls, config = {
        "bert": (transformers.BertModel, bert_config),
        "gpt_neox": (transformers.GPTNeoXModel, neox_config),
        "llama": (transformers.LlamaModel, llama_config),
    }[kind]
    path = saved(tmp_path, cls, config(), kind)
    batch = padded_batch(n=4)
    bins = {"low": -2.0, "high": 2.0, "n": 16}
    monkeypatch.setattr(attention_triton, "_fallen_back", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error", attention_triton.FallbackWarning)
        kernel, _ = run_extract(path, batch, batch_size=4, attention="triton", score_bins=bins)
    assert attention_triton._fallen_back == {}
    torch_path, _ = run_extract(path, batch, batch_size=4, attention="torch", score_bins=bins)
    for name in ("qk", "attention", "qk_sample", "score_hist"):
        for column in kernel[name].columns:
            got, expected = kernel[name][column].to_list(), torch_path[name][column].to_list()
            if isinstance(got[0], float) or isinstance(got[0], list):
                np.testing.assert_allclose(
                    np.array(got, dtype=float),
                    np.array(expected, dtype=float),
                    rtol=1e-6,
                    atol=1e-6,
                    err_msg=f"{name}.{column}",
                )
            else:
                assert got == expected, f"{name}.{column}"
    check_all(kernel, reference(path, batch, kind), batch, causal=kind != "bert")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_kernels_on_cuda():
    """The compiled kernels, not the interpreter, against the same reference: in a process that imports
    attention_triton before this module sets TRITON_INTERPRET."""
    code = (
        "import sys, torch\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from anisweep.extract import attention_triton\n"
        "import test_attention_triton as t\n"
        "assert not attention_triton.INTERPRETED\n"
        "for dtype, causal, d, n in [(torch.float32, False, 16, 13), (torch.float32, True, 64, 300),\n"
        "                            (torch.bfloat16, True, 64, 300), (torch.float16, False, 128, 13)]:\n"
        "    q, k, v, scaling, valid = t.inputs(d=d, t=n, dtype=dtype, lengths=(n, n // 2, 1))\n"
        "    got = attention_triton.attend(q.cuda(), k.cuda(), v.cuda(), scaling, valid.cuda(), causal)\n"
        "    t.assert_matches([x.cpu() for x in got], t.eager(q, k, v, scaling, valid, causal), valid, dtype)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])  # test_extract imports conftest
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
