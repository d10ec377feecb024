"""Shared test helpers and markers.

Markers (registered in pyproject.toml): ``slow`` for whole-DAG Snakemake runs and any test over about a second
(its fixture's setup included), ``slurm`` for the real SLURM cluster test. ``pytest -m "not slow and not slurm"``
is the quick subset to run while changing code; plain ``pytest`` runs everything.

The tiny-model helpers below are shared by test_extract.py and test_metrics.py (``from conftest import
...``; pytest puts this folder on ``sys.path``, as it does for hubcache.py and slurm_cluster.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Triton reads this when it is first imported (torch and transformers may import it before any test module
# runs): the kernels of anisweep.extract.attention_triton then run on CPU tensors in Triton's interpreter.
os.environ.setdefault("TRITON_INTERPRET", "1")
# One thread for torch (and OpenBLAS) here and in the commands the tests start: the tests' tensors are tiny, and a
# second OpenMP thread spins at every op's barrier, which more than doubled the quick subset's CPU time on 2 cores
# (test_extract.py: 40 CPU-s with torch's default 2 threads, 12 with 1). Snakemake sets each job's own count;
# the tests of thread counts set theirs.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import polars as pl
import pytest
import torch
from transformers import (
    AlbertConfig,
    BertConfig,
    CanineConfig,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    Olmo2Config,
    OlmoConfig,
    RobertaConfig,
    T5Config,
)

from anisweep.extract import tables as extract_tables
from anisweep.extract.model import ExtractSettings, load_model
from anisweep.extract.run import run
from anisweep.worker import address as worker_address

from slurm_cluster import slurm_cluster  # noqa: F401 - the session fixture test_slurm.py uses

# The test files that take longest (minutes each: whole Snakemake runs, the SLURM cluster, the kernel compile),
# slowest first, from a full run's --durations=0 summed per file. They are collected first, so that pytest-xdist
# (--dist loadfile --no-loadscope-reorder hands out whole files in collection order) starts them at once and the
# short files fill in around them, rather than one worker finishing a long file alone at the end.
SLOWEST_FILES = [
    "workflow/test_reruns.py",
    "extract/test_kernel_compile.py",
    "workflow/test_slurm.py",
    "workflow/test_workflow.py",
    "workflow/test_measures.py",
    "live/test_live_local.py",
    "test_docs.py",
    "workflow/test_media_run.py",
    "workflow/test_hub_pipeline.py",
    "checkpoints/test_hub_family_run.py",
    "workflow/test_survey.py",
    "live/test_toy_live.py",
    "workflow/test_unmeasurable_run.py",
    "test_bad_input.py",
    "tangent/test_seminmf.py",
]


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    rank = {here / name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path, len(SLOWEST_FILES)))  # stable: the rest keep their order


# The dimensions every tiny test model shares (GPT-2 names them its own way).
TINY_DIMS = {
    "vocab_size": 60,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 32,
}


def bert_config(**kw):
    return BertConfig(
        **TINY_DIMS,
        **kw,
    )


def roberta_config(**kw):
    """RoBERTa's positions start at pad_token_id + 1 (= 2): room for them beyond the 12 tokens of padded_batch."""
    return RobertaConfig(**TINY_DIMS, **kw)


def albert_config(**kw):
    """One shared block applied 3 times, over an embedding of 16 projected to the hidden size 32."""
    return AlbertConfig(**{**TINY_DIMS, "num_hidden_layers": 3}, embedding_size=16, **kw)


def t5_config(**kw):
    """2 encoder and 3 decoder blocks, d_kv (6) unlike d_model / heads (8), relative position buckets that the 12
    tokens of padded_batch span (8 buckets, max distance 16)."""
    return T5Config(
        **{
            "vocab_size": 60,
            "d_model": 32,
            "d_kv": 6,
            "d_ff": 64,
            "num_layers": 2,
            "num_decoder_layers": 3,
            "num_heads": 4,
            "relative_attention_num_buckets": 8,
            "relative_attention_max_distance": 16,
            "decoder_start_token_id": 0,
            "pad_token_id": 0,
            **kw,
        }
    )


def canine_config(**kw):
    """Molecules of 4 characters, local attention over chunks of 8 characters in the first shallow layer."""
    return CanineConfig(
        **{
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
            "downsampling_rate": 4,
            "upsampling_kernel_size": 4,
            "num_hash_functions": 4,
            "num_hash_buckets": 64,
            "local_transformer_stride": 8,
            **kw,
        }
    )


def neox_config(**kw):
    return GPTNeoXConfig(
        **TINY_DIMS,
        rotary_pct=0.25,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        **kw,
    )


def llama_config(**kw):
    """Grouped-query attention: 4 query heads share 2 key/value heads."""
    return LlamaConfig(
        **TINY_DIMS,
        num_key_value_heads=2,
        **kw,
    )


def olmo_config(**kw):
    """clip_qkv small enough that the clamp before the rotation changes some q and k entries."""
    return OlmoConfig(
        **TINY_DIMS,
        clip_qkv=kw.pop("clip_qkv", 0.5),
        pad_token_id=0,
        **kw,
    )


def olmo2_config(**kw):
    return Olmo2Config(
        **TINY_DIMS,
        num_key_value_heads=2,
        pad_token_id=0,
        **kw,
    )


def gpt2_config(**kw):
    """The Mistral runs' attention scaling: 1/sqrt(d_head) and 1/(layer + 1)."""
    return GPT2Config(
        vocab_size=60,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=32,
        scale_attn_by_inverse_layer_idx=True,
        **kw,
    )


def padded_batch(n=5, t=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 60, (n, t), generator=g)
    mask = torch.ones(n, t, dtype=torch.long)
    for i, length in enumerate([t, 7, t, 3, 10][:n]):
        mask[i, length:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask}


def saved(tmp_path, cls, config, name):
    torch.manual_seed(1)
    model = cls(config)
    with torch.no_grad():  # make LayerNorm affine parameters non-trivial
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
            elif type(module).__name__.endswith("RMSNorm"):
                module.weight.uniform_(0.5, 1.5)
    model.save_pretrained(tmp_path / name)
    return tmp_path / name


def tiny_neox_lm(tmp_path):
    """(model, adapter, batch): a saved and reloaded tiny GPT-NeoX LM in eval mode, its adapter, padded_batch()."""
    from transformers import GPTNeoXForCausalLM

    from anisweep.adapters import adapter_for

    model = GPTNeoXForCausalLM.from_pretrained(saved(tmp_path, GPTNeoXForCausalLM, neox_config(), "n")).eval()
    return model, adapter_for(model.config), padded_batch()


def run_extract(path, batch, **settings):
    settings = ExtractSettings(**{"batch_size": 2, "sample_tokens": 10_000, "device": "cpu", **settings})
    parts = load_model(path, device="cpu")
    recorder = run(parts, batch, settings, progress=False)
    ident = {"family": "test", "model": "m", "seed": 0, "step": 3, "tokens_seen": 30}
    return extract_tables.tables(recorder, parts, ident), parts


def job_stats(done: subprocess.CompletedProcess) -> dict[str, int]:
    """Snakemake's `Job stats` table (what a run or a dry run schedules), without `all` and `total`."""
    text = done.stdout + done.stderr
    if "Job stats:" not in text:
        assert "Nothing to be done" in text, text[-3000:]
        return {}
    counts = {}
    for line in text.split("Job stats:", 1)[1].splitlines()[3:]:
        name, count = line.split()
        if name == "total":
            break
        counts[name] = int(count)
    counts.pop("all", None)
    return counts


@pytest.fixture(scope="module")
def shared_worker():
    """One warm worker for all the Snakemake runs of a module that asks for it
    (`pytest.mark.usefixtures("shared_worker")`), instead of one per run, each importing torch, transformers and
    the stages again (seconds of CPU a run): a stand-in owner named in the environment the runs inherit
    (anisweep.worker.address.offer keeps a live owner), whose end at the module's end ends the worker."""
    if worker_address.turned_off():
        yield None  # turned off for this session
        return
    owner = subprocess.Popen(["sleep", "infinity"])
    previous = os.environ.get(worker_address.OWNER_VARIABLE)
    os.environ[worker_address.OWNER_VARIABLE] = str(owner.pid)
    try:
        yield owner.pid
    finally:
        if previous is None:
            del os.environ[worker_address.OWNER_VARIABLE]
        else:
            os.environ[worker_address.OWNER_VARIABLE] = previous
        owner.kill()
        owner.wait()


def snakemake_command(workdir: Path, *args: str) -> list[str]:
    """Snakemake on the project's Snakefile in `workdir`, as a user runs it from another directory."""
    snakefile = Path(__file__).resolve().parents[1] / "Snakefile"
    return [sys.executable, "-m", "snakemake", "-s", str(snakefile), "--directory", str(workdir), *args]


def assert_tables_equal(a: pl.DataFrame, b: pl.DataFrame, name: str, rtol: float = 1e-5) -> None:
    """Same columns, rows and values: floats to `rtol` (a forward pass on another number of threads sums in
    another order), everything else exactly."""
    assert a.columns == b.columns, name
    assert a.height == b.height, name
    for column in a.columns:
        x, y = a[column], b[column]
        if isinstance(x.dtype, pl.List) and x.dtype.inner.is_float():  # ragged: the lengths, then every value
            assert x.list.len().to_list() == y.list.len().to_list(), f"{name}.{column}"
            x, y = x.explode(), y.explode()
        if x.dtype.is_float():
            xs, ys = (np.array(v.to_list(), dtype=np.float64) for v in (x, y))
            np.testing.assert_allclose(xs, ys, rtol=rtol, atol=1e-7, equal_nan=True, err_msg=f"{name}.{column}")
        else:
            assert x.to_list() == y.to_list(), f"{name}.{column}"
