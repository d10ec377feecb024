"""Benchmark extract against a plain forward pass and the usual ways of reading activations (run by hand).

    python benchmarks/bench_extract.py [--threads 2] [--batch 8] [--seq-lens 128 512] [--shapes bert pythia]
        [--repeat 7] [--flat-n 8 32 128] [--tl-python /work/benchvenv/bin/python] [--out benchmarks/out/extract.json]
    python benchmarks/bench_extract.py --device cuda [--parts tests compare device checkpoint] [--budget 540]
        [--cells bert:32:512:float32 ...] [--repeat 5] [--out benchmarks/out/extract_cuda.json]
    python benchmarks/bench_extract.py --device cpu --parts tests compare device --cells bert-tiny:4:64:float32
        --compare-shapes bert-tiny pythia-tiny --repeat 3     # the same code on the CPU, to check it

Models are built from config with random weights (no download), bert-base shape (BertModel) and
pythia-160m shape (GPTNeoXModel: rotary 0.25, parallel residual). Every figure is a ratio to a plain
base-model forward (sdpa attention, no hooks) on the same batch:

* speed: plain seconds / variant seconds, per repetition, all variants interleaved in ONE process
  (order rotated every repetition); the median over repetitions is reported (wall clock; the ratio
  of process CPU times is kept too, as a check that is less sensitive to other jobs on the machine).
* memory, two measures, each variant in a fresh process:
  - peak RSS: after one warm-up pass and malloc_trim, the kernel's high-water mark is reset
    (/proc/self/clear_refs) and read back after the measured pass (VmHWM); it includes the
    interpreter, libraries and weights, as a user sees it.
  - live tensors: the peak of torch's CPU allocations (allocated minus freed) during the pass, from
    torch.profiler's memory events, on ONE thread (the profiler sees only the calling thread, and with
    one thread extract's statistics run inline), plus the weights; unlike RSS it ignores the allocator's
    retained free memory.

* the outlier statistics' cost (`--parts outliers`): extract against extract without what it measures of rogue
  dimensions, massive activations and attention sinks (without_outlier_statistics: no per-dimension squares or top
  tokens at the sampled sites, no column sums in the attention pass), both interleaved with the plain forward in
  each of --processes fresh processes (3; 11 repetitions each): the ratios are medians over all the repetitions,
  each process's own beside them; the drop of extract's ratio is the median of the paired differences.

On a GPU (`--device cuda`, one call, about 6 minutes on one H200; it stops at once where torch sees no GPU), in
this order, each part in fresh processes without TRITON_INTERPRET, so that Triton compiles its kernels:

1. `tests`: the kernel tests (KERNEL_TESTS, `python -m pytest -q`; conftest sets TRITON_INTERPRET for the
   interpreter's tests, the CUDA ones run in processes of their own without it): how many ran, passed, failed
   and were skipped, read from pytest's JUnit XML. A skipped test counts as NOT run, never as passed; the part
   passes only if every test ran and passed, the CUDA-only ones (CUDA_TESTS) included.
2. `compare`: one random-weight checkpoint of each --compare-shapes shape (bert-base and pythia-160m), saved,
   extracted over a padded batch of 8 x 512 (every table, the score histogram included) on the CPU in float32, then
   on the device in float32 (attention auto: the Triton kernel) and in bfloat16; every table against the CPU's:
   the largest |device - cpu| over each numeric column, relative to that column's largest |cpu| (at least 0.01),
   other columns equal. float32 passes at 1e-5 (COMPARE_RTOL) through the kernel with no fallback; bfloat16 is
   reported, not judged. Beside it, the same measure of HF's own eager float32 hidden states, device against CPU:
   the rounding that any float32 forward on another device brings (on an H200, 1.7e-6 for bert-base and 2.3e-6
   for pythia-160m). Values are not judged one by one: a single hidden value, a sum over thousands of tokens or a
   histogram bin's count near its edge differ by 1e-3 of itself between two float32 forwards, HF's as much.
3. `device`: the goal's table, each cell (shape:batch:seq:dtype, DEVICE_CELLS) in a fresh process: the three HF
   variants below interleaved in it (median of --repeat, 5, CUDA synchronised around each pass; ratios per
   repetition) and, one variant at a time, the peak of torch.cuda.max_memory_allocated during a pass (weights
   included), as a ratio to the plain pass's. Each cell is judged against its goal (GOALS: extract at >= 0.8x
   the plain tokens/s at 32 x 512, >= 0.7x for pythia-1.4b 8 x 512 and pythia-160m 8 x 2048; peak memory
   <= 1.2x the plain pass's; faster than HF keep-all).
4. `checkpoint`: one checkpoint at each sweep config's settings on the device, if time is left.

Then every goal line with its measured value and verdict, the kernel tests' counts, the comparison's verdict and
the call's wall time, printed and written with the rest to the JSON (--out) and a Markdown file beside it (.md).
Time, measured once on an H200 (16 cores; --budget 450): 362 s in all; tests 83 s (the kernel compiles spread
over the cores), the comparison 70 s, the six table cells 21-27 s each (139 s), the two checkpoints 65 s.
--budget (540 s) bounds it whatever happens: tests get at most PART_CAPS["tests"] s, the
comparison PART_CAPS["compare"] s, the table and then the checkpoints what is left; a part or cell that runs past it
is killed (FAIL), one the budget leaves no time for is NOT RUN. `--device cpu` runs the same parts on the CPU (no
memory column; the comparison then the CPU's tables against themselves), with the tiny shapes to check the code.

Variants: `plain`; `extract` (anisweep.extract.run.run with every statistic, the score histogram left out as
both sweep configs leave it, and the hidden-state sample
drawn at the rate of the shape's real sweep config, 1 token in 8 for config/multiberts.yaml and 3 in 16
for config/pythia.yaml, which is what one mini-batch of those sweeps contributes; memory over growing
n_sequences keeps the config's whole sample: the forward and its accumulators, not the writing of tables);
`hf_keep_all` (eager attention, output_attentions + output_hidden_states, all outputs kept); `tl`
(TransformerLens 3.9 `run_with_cache` on a HookedEncoder / HookedTransformer of the same shape, base
model only: the HookedTransformer runs with return_type=None, which stops after ln_final;
HookedEncoder.forward always applies its MLM head, so its cache is filled with the same caching hooks
that run_with_cache installs, around `encoder_output`). TransformerLens is an optional benchmark extra,
never a runtime dependency: its part runs in a separate venv (--tl-python) with its own plain baseline
in the same process.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import gc
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

HERE = Path(__file__).resolve()
MARK = "BENCH_RESULT "
ROOT = HERE.parents[1]
SHAPES = {  # shape -> vocabulary, width, layers, heads (bert*: BertModel, the rest GPTNeoXModel); tiny: CPU checks
    "bert": (30522, 768, 12, 12),
    "pythia": (50304, 768, 12, 12),
    "pythia-1.4b": (50304, 2048, 24, 16),
    "bert-tiny": (2048, 64, 2, 4),
    "pythia-tiny": (2048, 64, 2, 4),
}
VOCAB = {shape: dims[0] for shape, dims in SHAPES.items()}
NAMES = {"bert": "bert-base", "pythia": "pythia-160m"}  # as the tables print them; the rest by their own name
DEVICE_CELLS = [
    "bert:32:512:float32",
    "pythia:32:512:float32",
    "bert:32:512:bfloat16",
    "pythia:32:512:bfloat16",
    "pythia-1.4b:8:512:bfloat16",
    "pythia:8:2048:bfloat16",
]  # the goal's table: shapes, batch x seq, dtypes
GOALS = {("bert", 32, 512): 0.8, ("pythia", 32, 512): 0.8, ("pythia-1.4b", 8, 512): 0.7, ("pythia", 8, 2048): 0.7}
DEFAULT_GOAL = 0.8  # extract / plain tokens/s of a cell outside GOALS (any dtype)
MAX_MEMORY_RATIO = 1.2  # extract's peak device memory / the plain pass's
PASS, FAIL, NOT_RUN = "pass", "FAIL", "NOT RUN"
KERNEL_TESTS = [
    "tests/extract/test_attention_triton.py",
    "tests/extract/test_host_sync.py",
    "tests/extract/test_kernel_compile.py",
]
CUDA_TESTS = ("test_compiled_kernels_on_cuda", "test_on_a_gpu_no_op_of_a_run_synchronises")  # skipped without one
FAILURE_CHARS = 1500  # of each failed kernel test's report kept in the JSON and the Markdown
COMPARE_RTOL = 1e-5  # float32 tables on the device against the CPU's
REL_FLOOR = 0.01  # a column's scale at least: COMPARE_RTOL * REL_FLOOR = 1e-7 absolute, the tests' atol
SCORE_BINS = {"low": -20.0, "high": 20.0, "n": 80}  # config/config.yaml's: the comparison covers score_hist too
BUDGET_S = 540  # one --device cuda call, all parts
PART_CAPS = {"tests": 180, "compare": 120}  # seconds at most; the table and the checkpoints share what is left
TIME_GOAL_S = 600
SWEEPS = {  # the real sweep of each shape: its config, and for the projection its checkpoints and the
    # bytes per weight in the files fetched
    "bert": {
        "sweep": "MultiBERTs seed 0",
        "config": "config/multiberts.yaml",
        "checkpoints": 29,
        "file": "pytorch_model.bin",
        "bytes_per_param": 4,
    },
    "pythia": {
        "sweep": "Pythia-160m",
        "config": "config/pythia.yaml",
        "checkpoints": 154,
        "file": "model.safetensors (float16)",
        "bytes_per_param": 2,
    },
}


@functools.cache  # read once: sample_size runs inside the timed extract calls
def sweep_settings(shape: str) -> dict:
    """The `extract` section of the shape's real sweep config."""
    import yaml

    return yaml.safe_load((HERE.parents[1] / SWEEPS[sweep_of(shape)]["config"]).read_text())["extract"]


def sweep_of(shape: str) -> str:
    return "bert" if shape.startswith("bert") else "pythia"


def sample_size(shape: str, n_sequences: int, seq_len: int) -> int:
    """The hidden-state sample of the shape's sweep config, in proportion for fewer tokens than its
    evaluation set: what one mini-batch of the sweep contributes to it."""
    s = sweep_settings(shape)
    rate = s["sample_tokens"] / (s["n_sequences"] * s["seq_len"])
    return min(s["sample_tokens"], round(rate * n_sequences * seq_len))


# ----------------------------------------------------------------------------------------- models


def hf_model_config(shape: str):
    import transformers

    vocab, width, layers, heads = SHAPES[shape]
    if shape.startswith("bert"):
        return transformers.BertConfig(
            vocab_size=vocab,
            hidden_size=width,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=4 * width,
            max_position_embeddings=512,
        )
    return transformers.GPTNeoXConfig(
        vocab_size=vocab,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        max_position_embeddings=2048,
        rotary_pct=0.25,
        use_parallel_residual=True,
        tie_word_embeddings=False,
    )


def hf_model(shape: str, device="cpu", dtype=torch.float32):
    import transformers

    torch.manual_seed(0)
    cls = transformers.BertModel if shape.startswith("bert") else transformers.GPTNeoXModel
    with torch.device(device):  # initialised where it runs: pythia-1.4b takes minutes on the CPU
        return cls(hf_model_config(shape)).to(dtype).eval()


def tl_model(shape: str):
    from transformer_lens import HookedEncoder, HookedTransformer, HookedTransformerConfig

    torch.manual_seed(0)
    common = dict(
        n_layers=12,
        d_model=768,
        n_heads=12,
        d_head=64,
        d_mlp=3072,
        act_fn="gelu",
        normalization_type="LN",
        device="cpu",
        dtype=torch.float32,
    )
    if shape == "bert":
        cfg = HookedTransformerConfig(
            **common, d_vocab=VOCAB["bert"], n_ctx=512, original_architecture="BertForMaskedLM"
        )
        model = HookedEncoder(cfg)
        with torch.no_grad():  # built from a config its weights are torch.empty: initialise them as BERT does
            for name, p in model.named_parameters():
                leaf = name.rsplit(".", 1)[-1]
                if leaf == "w":
                    p.fill_(1.0)
                elif leaf == "b" or leaf.startswith("b_"):
                    p.zero_()
                else:
                    p.normal_(0.0, 0.02)
    else:
        cfg = HookedTransformerConfig(
            **common,
            d_vocab=VOCAB["pythia"],
            n_ctx=2048,
            positional_embedding_type="rotary",
            rotary_dim=16,
            parallel_attn_mlp=True,
            original_architecture="GPTNeoXForCausalLM",
        )
        model = HookedTransformer(cfg)
    return model.eval()


def make_batch(shape: str, n: int, seq_len: int) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, VOCAB[shape] - 1, (n, seq_len), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones(n, seq_len, dtype=torch.long)}


# --------------------------------------------------------------------------------------- variants


@contextlib.contextmanager
def without_outlier_statistics():
    """extract without what it measures of the few directions and keys that carry the anisotropy: no per-dimension
    squares or top tokens at the sampled sites (rogue dimensions, massive activations), no column sums in the
    attention pass (attention sinks). The statistics' cost is extract's speed ratio with them against without."""
    from anisweep.extract import attention_torch, streaming

    attend, update, partial = attention_torch.attend, streaming.SinkStats.update, streaming.VectorStats.partial
    attention_torch.attend = lambda *args, **kw: attend(*args, **{**kw, "valid": None})
    streaming.SinkStats.update = lambda self, colsum, *args, **kw: None
    streaming.VectorStats.partial = staticmethod(
        lambda x, valid, wait_free=None, outliers=False: partial(x, valid, wait_free)
    )
    try:
        yield
    finally:
        attention_torch.attend, streaming.SinkStats.update = attend, update
        streaming.VectorStats.partial = staticmethod(partial)


def variants_for(shape: str, names: list[str], device="cpu", dtype=torch.float32) -> dict:
    """name -> (run(batch) -> kept outputs). HF variants share one model, switching its attention."""
    runs = {}
    if any(n in ("plain", "extract", "hf_keep_all") for n in names):
        model = hf_model(shape, device, dtype)

        def plain(batch):
            model.set_attn_implementation("sdpa")
            return model(**batch)

        def hf_keep_all(batch):
            model.set_attn_implementation("eager")
            return model(**batch, output_attentions=True, output_hidden_states=True)

        runs.update(plain=plain, hf_keep_all=hf_keep_all)
        if "extract" in names:
            from anisweep.adapters import adapter_for
            from anisweep.extract import recorder
            from anisweep.extract.model import ExtractSettings, LoadedModel
            from anisweep.extract.run import run

            recorder.register_attention()
            adapter = adapter_for(model.config)
            parts = LoadedModel(model, adapter.base_model(model), adapter, adapter.geometry(model.config))

            def run_extract(batch, batch_size=None, sample_tokens=None):
                model.set_attn_implementation(recorder.ATTENTION_NAME)
                n, t = batch["input_ids"].shape
                settings = ExtractSettings(
                    n_sequences=n,
                    seq_len=t,
                    batch_size=batch_size or n,
                    sample_tokens=sample_tokens or sample_size(shape, n, t),
                    device=str(device),
                )
                return run(parts, batch, settings, progress=False)

            runs["extract"] = run_extract

            def run_extract_without_outliers(batch):
                with without_outlier_statistics():
                    return run_extract(batch)

            runs["extract_without_outliers"] = run_extract_without_outliers
    if "tl" in names:
        tl = tl_model(shape)

        def run_tl(batch):
            ids = batch["input_ids"]
            if shape == "pythia":
                return tl.run_with_cache(ids, return_type=None)
            cache, fwd, _ = tl.get_caching_hooks()  # what run_with_cache installs
            with tl.hooks(fwd_hooks=fwd):
                tl.encoder_output(ids)
            return cache

        runs["tl"] = run_tl
    return {name: runs[name] for name in names}


# ---------------------------------------------------------------------------------------- workers


def speed(args) -> dict:
    torch.set_num_threads(args.threads)
    runs = variants_for(args.shape, args.variants)
    batch = make_batch(args.shape, args.batch, args.seq_len)
    names = list(runs)
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    with torch.inference_mode():
        for n in names:  # warm-up
            runs[n](batch)
        for rep in range(args.repeat):
            for n in names[rep % len(names) :] + names[: rep % len(names)]:
                gc.collect()
                w, c = time.perf_counter(), time.process_time()
                out = runs[n](batch)
                wall[n].append(time.perf_counter() - w)
                cpu[n].append(time.process_time() - c)
                del out
    tokens = args.batch * args.seq_len
    res = {}
    for n in names:
        speed_ratios = [p / v for p, v in zip(wall["plain"], wall[n])]
        cpu_ratios = [p / v for p, v in zip(cpu["plain"], cpu[n])]
        res[n] = {
            "seconds": wall[n],
            "tokens_per_s": tokens / statistics.median(wall[n]),
            "speed_ratio": statistics.median(speed_ratios),
            "speed_ratios": speed_ratios,
            "cpu_speed_ratio": statistics.median(cpu_ratios),
        }
    return res


def _malloc_trim():
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _live_peak_bytes(fn) -> tuple[int, object]:
    """Peak of torch CPU bytes allocated and not yet freed while fn runs (only this thread's allocations)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        kept = fn()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch._C._autograd.DeviceType.CPU
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak, kept


def memory(args) -> dict:
    """One variant in this fresh process: peak RSS at --threads, then live-tensor peak on one thread."""
    torch.set_num_threads(args.threads)
    for module in ("transformers", "transformer_lens" if args.tl_env else "anisweep.extract"):
        __import__(module)  # the same libraries in every process of one venv, so that RSS compares like with like
    name = args.variants[0]
    runs = variants_for(args.shape, [name])
    run = runs[name]
    batch = make_batch(args.shape, args.n_sequences, args.seq_len)
    call = (lambda: run(batch, args.batch, args.sample_tokens)) if name == "extract" else (lambda: run(batch))
    with torch.inference_mode():
        if name == "extract":  # warm up on one mini-batch, whatever the number of sequences measured
            run(make_batch(args.shape, args.batch, args.seq_len), args.batch)
        else:
            call()
        gc.collect()
        _malloc_trim()
        rss_before = _status_kb("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        kept = call()
        hwm = _status_kb("VmHWM")
        del kept
        gc.collect()
        torch.set_num_threads(1)
        live_peak, kept = _live_peak_bytes(call)
        del kept
    weights = sum(p.numel() * p.element_size() for p in _params(runs))
    return {
        "variant": name,
        "rss_hwm_mb": hwm / 1024,
        "rss_before_mb": rss_before / 1024,
        "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "live_peak_mb": live_peak / 2**20,
        "weights_mb": weights / 2**20,
    }


def _params(runs):
    seen = set()
    for fn in runs.values():
        for cell in fn.__closure__ or ():
            obj = cell.cell_contents
            if isinstance(obj, torch.nn.Module):
                for p in obj.parameters():
                    if id(p) not in seen:
                        seen.add(id(p))
                        yield p


def device_cell(args) -> dict:
    """One cell of the device table in this fresh process: speed of every variant, interleaved, then the peak
    device memory of each (CUDA only)."""
    from anisweep.extract import recorder
    from anisweep.extract.model import DTYPES

    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    runs = variants_for(args.shape, ["plain", "extract", "hf_keep_all"], device, dtype)
    cpu_batch = make_batch(args.shape, args.batch, args.seq_len)  # run moves its mini-batches itself
    batches = {n: cpu_batch if n == "extract" else {k: v.to(device) for k, v in cpu_batch.items()} for n in runs}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(name) -> float:
        sync()
        started = time.perf_counter()
        out = runs[name](batches[name])
        sync()
        del out
        return time.perf_counter() - started

    names = list(runs)
    seconds = {n: [] for n in names}
    with torch.inference_mode():
        for n in names:  # warm-up: kernels compiled and the allocator's pools grown
            timed(n)
        for rep in range(args.repeat):
            for n in names[rep % len(names) :] + names[: rep % len(names)]:
                seconds[n].append(timed(n))
        peak = {}
        if device.type == "cuda":
            for n in names:
                gc.collect()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                timed(n)
                peak[n] = torch.cuda.max_memory_allocated()
    tokens = args.batch * args.seq_len
    row = {
        "shape": args.shape,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "dtype": args.dtype,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "attention": "triton" if recorder.attention_kernel("auto", device) else "torch",
    }
    for n in names:
        ratios = [p / v for p, v in zip(seconds["plain"], seconds[n])]
        row[n] = {
            "seconds": seconds[n],
            "tokens_per_s": tokens / statistics.median(seconds[n]),
            "speed_ratio": statistics.median(ratios),
            "peak_bytes": peak.get(n),
            "memory_ratio": peak[n] / peak["plain"] if peak else None,
        }
    return row


def checkpoint(args) -> dict:
    """Wall time of one checkpoint at the extract settings of the shape's sweep config: loading the saved
    model, run, building the tables; and a plain forward over the same sequences."""
    from anisweep.extract import tables as extract_tables
    from anisweep.extract.model import ExtractSettings, load_model
    from anisweep.extract.run import run

    torch.set_num_threads(args.threads)
    settings = ExtractSettings(**{**sweep_settings(args.shape), "device": args.device})  # as the sweep's jobs
    device = settings.torch_device()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        hf_model(args.shape).save_pretrained(tmp)
        started = time.perf_counter()
        parts = load_model(tmp, settings.dtype, device)
        sync()
        load_s = time.perf_counter() - started
        batch = make_batch(args.shape, settings.n_sequences, settings.seq_len)
        started = time.perf_counter()
        recorder = run(parts, batch, settings, progress=False)
        sync()
        run_s = time.perf_counter() - started
        started = time.perf_counter()
        extract_tables.tables(
            recorder, parts, {"family": "bench", "model": args.shape, "seed": 0, "step": 0, "tokens_seen": 0}
        )
        tables_s = time.perf_counter() - started
        model = parts.model
        model.set_attn_implementation("sdpa")
        started = time.perf_counter()
        with torch.inference_mode():
            for first in range(0, settings.n_sequences, settings.batch_size):
                model(**{k: v[first : first + settings.batch_size].to(device) for k, v in batch.items()})
        sync()
        plain_s = time.perf_counter() - started
    return {
        "shape": args.shape,
        "device": str(device),
        "n_sequences": settings.n_sequences,
        "seq_len": settings.seq_len,
        "batch": settings.batch_size,
        "sample_tokens": settings.sample_tokens,
        "threads": args.threads,
        "load_s": load_s,
        "extract_run_s": run_s,
        "tables_s": tables_s,
        "plain_forward_s": plain_s,
    }


def padded_batch(shape: str, n: int, seq_len: int) -> dict:
    """make_batch with padding, as an evaluation batch of texts of different lengths has: seq_len down to about
    half of it."""
    batch = make_batch(shape, n, seq_len)
    lengths = torch.tensor([seq_len - i * seq_len // (2 * n) for i in range(n)])
    batch["attention_mask"] = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
    batch["input_ids"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 0)
    return batch


def extract_tables_on(path: str, batch: dict, device: str, dtype: str, threads: int) -> tuple[dict, dict]:
    """Every table extract writes for the checkpoint at `path` over `batch`, on `device` in `dtype`; and how it
    ran (the attention path, any warning: a FallbackWarning means the kernel declined a shape)."""
    import warnings

    from anisweep.extract import recorder as extract_recorder
    from anisweep.extract import tables as extract_tables
    from anisweep.extract.model import ExtractSettings, load_model
    from anisweep.extract.run import run

    n, t = batch["input_ids"].shape
    settings = ExtractSettings(
        n_sequences=n,
        seq_len=t,
        batch_size=max(1, n // 2),
        sample_tokens=min(n * t, 2048),  # more than d_model: the hidden table's statistics are full rank
        device=device,
        dtype=dtype,
        score_bins=SCORE_BINS,
    )
    torch.set_num_threads(threads)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parts = load_model(path, dtype, settings.torch_device())
        kernel = extract_recorder.attention_kernel(settings.attention, settings.torch_device())
        started = time.perf_counter()
        recorder = run(parts, batch, settings, progress=False)
        seconds = time.perf_counter() - started
        ident = {"family": "bench", "model": "compare", "seed": 0, "step": 0, "tokens_seen": 0}
        tables = extract_tables.tables(recorder, parts, ident)
    said = sorted({f"{type(w.message).__name__}: {w.message}" for w in caught})
    return tables, {
        "device": device,
        "dtype": dtype,
        "attention": "torch" if kernel is None else "triton",
        "fallbacks": [w for w in said if w.startswith("FallbackWarning")],
        "warnings": said,
        "run_s": seconds,
    }


def compare(args) -> dict:
    """extract's tables of one random-weight checkpoint per shape on the CPU in float32, and on --device in
    float32 (judged) and bfloat16 (reported), each against the CPU's: table_difference per table."""
    shapes = []
    for shape in args.compare_shapes:
        batch = padded_batch(shape, args.n_sequences, args.seq_len)
        with tempfile.TemporaryDirectory() as tmp:
            model = hf_model(shape)
            model.save_pretrained(tmp)
            reference, ref_info = extract_tables_on(tmp, batch, "cpu", "float32", args.threads)
            runs = []
            for dtype in ("float32", "bfloat16"):
                tables, info = extract_tables_on(tmp, batch, args.device, dtype, args.threads)
                differences = {name: table_difference(tables[name], reference[name]) for name in reference}
                runs.append({**info, "judged": dtype == "float32", "tables": differences})
        hf = hf_hidden_difference(model, batch, args.device)
        shapes.append({"shape": shape, "reference": ref_info, "runs": runs, "hf_hidden": hf})
        print(f"  {shape}: " + "  ".join(f"{r['dtype']} {max_difference(r):.1e}" for r in runs), file=sys.stderr)
    return {
        "device": args.device,
        "n_sequences": args.n_sequences,
        "seq_len": args.seq_len,
        "rtol": COMPARE_RTOL,
        "rel_floor": REL_FLOOR,
        "shapes": shapes,
    }


def hf_hidden_difference(cpu, batch: dict, device: str) -> float:
    """HF's own eager float32 forward of the CPU model `cpu` on `device` against the CPU's, on the same weights and
    batch: the largest |device - cpu| over the hidden states of every layer, relative to their largest |cpu|
    (column_difference)."""
    import copy

    import numpy as np

    cpu.set_attn_implementation("eager")
    on_device = copy.deepcopy(cpu).to(device)
    with torch.inference_mode():
        ref = cpu(**batch, output_hidden_states=True).hidden_states
        got = on_device(**{k: v.to(device) for k, v in batch.items()}, output_hidden_states=True).hidden_states
    a = np.concatenate([h.cpu().double().numpy().ravel() for h in got])
    b = np.concatenate([h.double().numpy().ravel() for h in ref])
    return column_difference(a, b)


def column_difference(a, b) -> float:
    """The largest |a - b| relative to the column's scale, its largest finite |b| (at least REL_FLOOR); NaN against
    NaN is equal, NaN or inf against a number infinitely far."""
    import numpy as np

    finite = np.abs(b[np.isfinite(b)])
    scale = max(float(finite.max(initial=0.0)), REL_FLOOR)
    with np.errstate(invalid="ignore"):
        rel = np.abs(a - b) / scale
    rel[(a == b) | (np.isnan(a) & np.isnan(b))] = 0.0
    return float(np.nan_to_num(rel, nan=np.inf).max(initial=0.0))


def table_difference(got, ref) -> dict:
    """The largest column_difference over the numeric columns of two tables (list columns value by value), and its
    column; non-numeric columns must be equal, as must the columns, rows and list lengths (inf where they are
    not)."""
    import numpy as np
    import polars as pl

    if got.columns != ref.columns or got.height != ref.height:
        return {"max_rel": float("inf"), "column": "(columns or rows)"}
    worst, where = 0.0, None
    for column in ref.columns:
        x, y = got[column], ref[column]
        if isinstance(y.dtype, pl.List):
            if not isinstance(x.dtype, pl.List) or x.list.len().to_list() != y.list.len().to_list():
                return {"max_rel": float("inf"), "column": column}
            x, y = x.explode(), y.explode()
        if x.dtype.is_numeric() and y.dtype.is_numeric():
            rel = column_difference(*(np.array(v.to_list(), dtype=np.float64) for v in (x, y)))
        else:
            rel = 0.0 if x.to_list() == y.to_list() else float("inf")
        if rel > worst:
            worst, where = rel, column
    return {"max_rel": worst, "column": where}


def max_difference(run: dict) -> float:
    return max((t["max_rel"] for t in run["tables"].values()), default=0.0)


# ------------------------------------------------------------------------------------------ driver


def spawn(python: str, mode: str, timeout: float | None = None, **kw) -> dict:
    """A worker in a fresh process, without TRITON_INTERPRET (the kernels compiled, as a sweep runs them); raises
    RuntimeError where it fails, subprocess.TimeoutExpired (and kills it) where it runs past `timeout`."""
    cmd = [python, str(HERE), mode]
    for key, value in kw.items():
        flag = f"--{key.replace('_', '-')}"
        if value is True:
            cmd.append(flag)
        else:
            cmd += [flag, *map(str, value if isinstance(value, list) else [value])]
    env = {**clean_env(), "OMP_NUM_THREADS": str(kw["threads"]), "TOKENIZERS_PARALLELISM": "false"}
    proc = run_limited(cmd, env, timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(MARK) :])


def clean_env() -> dict:
    return {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}


def run_limited(cmd: list[str], env: dict, timeout: float | None, cwd=None) -> subprocess.CompletedProcess:
    """cmd in a process group of its own, the whole group killed past `timeout` (pytest's CUDA tests start
    processes of their own), then subprocess.TimeoutExpired."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:  # the timeout, or ^C: nothing of it may outlive the driver
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def seconds_left(a) -> float | None:
    return None if a.deadline is None else a.deadline - time.monotonic()


def part_timeout(a, part: str) -> float | None:
    """Seconds the part may take: what the budget leaves, at most its cap."""
    left = seconds_left(a)
    return left if left is None or part not in PART_CAPS else min(left, PART_CAPS[part])


BUDGET_SPENT = {"error": "not run: time budget spent"}


def spawn_in_budget(a, part: str, mode: str, announce: str, **kw) -> dict | None:
    """`spawn`'s result for `part` within what the budget leaves it, announced first, or {"error": ...}: how it
    failed, or that it was killed at the budget; with `seconds`, its wall time. None where the budget was spent
    before it."""
    timeout = part_timeout(a, part)
    if timeout is not None and timeout <= 0:
        return None
    print(announce, flush=True)
    started = time.perf_counter()
    try:
        res = spawn(sys.executable, mode, timeout, **kw)
    except subprocess.TimeoutExpired:
        res = {"error": f"killed at the time budget, after {time.perf_counter() - started:.0f} s"}
    except RuntimeError as error:
        res = {"error": str(error)[-1500:]}
    return {**res, "seconds": time.perf_counter() - started}


def process_seconds() -> float:
    """Seconds since this process started, imports included (Linux)."""
    start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    return float(Path("/proc/uptime").read_text().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")


def cuda_or_exit(device: str) -> None:
    """Stop at once, saying why, where --device names a GPU that torch does not see."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise SystemExit(
            f"bench_extract: --device {device} needs a GPU, and torch sees none on {platform.node()} (torch "
            f"{torch.__version__}, {build}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); nothing "
            "was run. Run it where there is one, or check the code path on the CPU: --device cpu --parts tests "
            "compare device --cells bert-tiny:4:64:float32 --compare-shapes bert-tiny pythia-tiny --repeat 3"
        )


def ratios(mem: dict, plain: dict) -> dict:
    live = lambda m: m["weights_mb"] + m["live_peak_mb"]  # noqa: E731
    return {
        "rss_ratio": mem["rss_hwm_mb"] / plain["rss_hwm_mb"],
        "live_ratio": live(mem) / live(plain),
        "live_activation_ratio": mem["live_peak_mb"] / max(plain["live_peak_mb"], 1e-9),
    }


def drive(a) -> None:
    cuda_or_exit(a.device)
    a.deadline = None if a.budget is None else time.monotonic() + a.budget - process_seconds()
    out_path = Path(a.out)
    out = json.loads(out_path.read_text()) if out_path.exists() else {}
    out["settings"] = vars(a)
    out.setdefault("machine", {}).update(
        {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
        }
    )
    out["machine"][f"load_average_start_{'_'.join(a.parts)}"] = os.getloadavg()
    if "ratios" in a.parts:
        out["rows"] = [row for shape in a.shapes for t in a.seq_lens for row in ratio_rows(a, shape, t)]
    if "flat" in a.parts:
        out["flat"] = [f for shape in a.shapes for f in flat_rows(a, shape, out["rows"])]
    if "outliers" in a.parts:
        out["outlier_cost"] = [outlier_cost(a, shape, t) for shape in a.shapes for t in a.seq_lens]
    part_s = {}
    for part, key, measure in (
        ("tests", "kernel_tests", kernel_tests),
        ("compare", "comparison", comparison),
        ("device", "device_rows", lambda a: [device_row(a, cell) for cell in a.cells]),
        ("checkpoint", "checkpoint", lambda a: [checkpoint_row(a, shape) for shape in a.shapes]),
    ):
        if part in a.parts:
            started = time.perf_counter()
            out[key] = measure(a)
            part_s[part] = time.perf_counter() - started
    out["machine"][f"load_average_end_{'_'.join(a.parts)}"] = os.getloadavg()
    out["call"] = {"parts": a.parts, "device": a.device, "budget_s": a.budget, "part_s": part_s}
    out["call"]["wall_s"] = process_seconds()
    if {"tests", "compare", "device"} & set(a.parts):
        out["goal"] = goal_lines(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2))
    text = summary(out)
    out_path.with_suffix(".md").write_text(text + "\n")
    print(text)
    print(f"wrote {a.out} and {out_path.with_suffix('.md')}")


def outlier_cost(a, shape: str, t: int) -> dict:
    """extract's speed ratio to the plain forward with and without the outlier statistics, interleaved in each of
    --processes fresh processes (a process's ratio differs from the next one's by up to 0.1 on a 2-core machine):
    each ratio is the median over all their repetitions, the drop the median of the paired differences."""
    print(f"[{shape} {a.batch}x{t}] outlier statistics' cost, {a.processes} processes ...", flush=True)
    variants = ["plain", "extract", "extract_without_outliers"]
    runs = [spawn_speed(a, shape, t, variants, a.repeat or 11) for _ in range(a.processes)]
    with_, without = pooled(runs, "extract"), pooled(runs, "extract_without_outliers")
    drops = [w - x for w, x in zip(without["speed_ratios"], with_["speed_ratios"])]
    return {
        "shape": shape,
        "batch": a.batch,
        "seq_len": t,
        "with": with_["speed_ratio"],
        "without": without["speed_ratio"],
        "with_per_process": with_["per_process"],
        "without_per_process": without["per_process"],
        "drop": statistics.median(drops),
        "drops": drops,
        "added_seconds": statistics.median(w - x for w, x in zip(with_["seconds"], without["seconds"])),
    }


def pooled(runs: list[dict], variant: str) -> dict:
    """One variant's figures from several `speed` processes: their repetitions together, the speed ratio as the
    median over all of them, and each process's own median."""
    ratios = [r for run in runs for r in run[variant]["speed_ratios"]]
    return {
        "seconds": [s for run in runs for s in run[variant]["seconds"]],
        "speed_ratios": ratios,
        "speed_ratio": statistics.median(ratios),
        "per_process": [run[variant]["speed_ratio"] for run in runs],
    }


def spawn_speed(a, shape: str, t: int, variants: list[str], repeat: int, python: str = sys.executable) -> dict:
    """The `speed` worker on --batch sequences of t tokens of `shape`, on --threads, in a fresh process of `python`."""
    return spawn(
        python, "speed", shape=shape, seq_len=t, repeat=repeat, variants=variants, threads=a.threads, batch=a.batch
    )


def ratio_rows(a, shape: str, t: int) -> list[dict]:
    """Speed (one process per venv) and memory (one process per variant) of every variant at batch x t."""
    common = dict(threads=a.threads, batch=a.batch)
    tl_ok = a.tl_python and Path(a.tl_python).exists()
    print(f"[{shape} {a.batch}x{t}] speed ...", flush=True)
    sp = spawn_speed(a, shape, t, ["plain", "extract", "hf_keep_all"], a.repeat or 7)
    if tl_ok:
        sp_tl = spawn_speed(a, shape, t, ["plain", "tl"], a.repeat or 7, python=a.tl_python)
        sp["tl"] = sp_tl["tl"]
        sp["tl"]["plain_tokens_per_s_same_process"] = sp_tl["plain"]["tokens_per_s"]
    mem = {}
    for name in ("plain", "extract", "hf_keep_all"):
        print(f"[{shape} {a.batch}x{t}] memory {name} ...", flush=True)
        mem[name] = spawn(
            sys.executable, "memory", shape=shape, seq_len=t, n_sequences=a.batch, variants=[name], **common
        )
    if tl_ok:
        for name in ("plain", "tl"):
            print(f"[{shape} {a.batch}x{t}] memory {name} (TransformerLens venv) ...", flush=True)
            mem[f"tl_{name}"] = spawn(
                a.tl_python,
                "memory",
                shape=shape,
                seq_len=t,
                n_sequences=a.batch,
                variants=[name],
                tl_env=True,
                **common,
            )
    rows = []
    for name in sp:
        if name == "plain":
            continue
        m, base = (mem["tl_tl"], mem["tl_plain"]) if name == "tl" else (mem[name], mem["plain"])
        row = {
            "shape": shape,
            "batch": a.batch,
            "seq_len": t,
            "variant": name,
            "speed_ratio": sp[name]["speed_ratio"],
            "cpu_speed_ratio": sp[name]["cpu_speed_ratio"],
            "tokens_per_s": sp[name]["tokens_per_s"],
            "plain_tokens_per_s": sp["plain"]["tokens_per_s"],
            **ratios(m, base),
            "memory": m,
            "plain_memory": base,
            "speed": sp[name],
        }
        rows.append(row)
        print(
            f"  {name:12s} speed {row['speed_ratio']:.2f}x (cpu {row['cpu_speed_ratio']:.2f}x)  "
            f"peak RSS {row['rss_ratio']:.2f}x  live {row['live_ratio']:.2f}x "
            f"(activations {row['live_activation_ratio']:.2f}x)",
            flush=True,
        )
    return rows


def flat_rows(a, shape: str, rows: list[dict]) -> list[dict]:
    """extract's memory as n_sequences grows (batches of --batch), against the plain forward of one batch."""
    t = max(a.seq_lens)
    plain = next(
        r["plain_memory"] for r in rows if r["shape"] == shape and r["seq_len"] == t and r["variant"] == "extract"
    )
    out = []
    for n in a.flat_n:
        print(f"[{shape}] extract memory, {n} sequences of {t} in batches of {a.batch} ...", flush=True)
        m = spawn(
            sys.executable,
            "memory",
            shape=shape,
            seq_len=t,
            n_sequences=n,
            variants=["extract"],
            sample_tokens=sweep_settings(shape)["sample_tokens"],
            threads=a.threads,
            batch=a.batch,
        )
        out.append({"shape": shape, "seq_len": t, "n_sequences": n, **ratios(m, plain), "memory": m})
        print(
            f"  n={n:4d}  peak RSS {m['rss_hwm_mb']:.0f} MB ({out[-1]['rss_ratio']:.2f}x plain)  "
            f"live {m['live_peak_mb']:.0f} MB",
            flush=True,
        )
    return out


def device_row(a, cell: str) -> dict:
    """One cell of the device table, or the cell with an `error`: how it failed, or `not run` where the budget
    was spent before it."""
    shape, batch, seq_len, dtype = cell.split(":")
    row = {"shape": shape, "batch": int(batch), "seq_len": int(seq_len), "dtype": dtype}
    announce = f"[{shape} {batch}x{seq_len} {dtype} on {a.device}] speed and memory ..."
    kw = dict(shape=shape, batch=int(batch), seq_len=int(seq_len), dtype=dtype, device=a.device)
    res = spawn_in_budget(a, "device", "device", announce, **kw, repeat=a.repeat or 5, threads=a.threads)
    if res is None:
        return {**row, **BUDGET_SPENT}
    seconds = res.pop("seconds")
    row = {**row, **res} if "error" in res else res
    row["wall_s"] = seconds
    checks = cell_checks(row)
    print(f"  {cell_verdict(checks)}: " + "  ".join(f"{k} {fmt_x(v)}" for k, (v, _) in checks.items()), flush=True)
    return row


def kernel_tests(a) -> dict:
    """KERNEL_TESTS in a pytest process without TRITON_INTERPRET; its JUnit XML's counts (junit_outcomes)."""
    timeout = part_timeout(a, "tests")
    command = ["python", "-m", "pytest", "-q", *KERNEL_TESTS]
    if timeout is not None and timeout <= 0:
        return {"command": " ".join(command), **BUDGET_SPENT}
    print(f"[kernel tests] {' '.join(command)} ...", flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        cmd = [sys.executable, *command[1:], "-p", "no:cacheprovider", f"--junitxml={report}"]
        try:
            proc = run_limited(cmd, clean_env(), timeout, cwd=ROOT)
            res, tail = {"returncode": proc.returncode}, (proc.stdout + proc.stderr)[-3000:]
        except subprocess.TimeoutExpired:
            res, tail = {"error": f"killed at the time budget, after {time.perf_counter() - started:.0f} s"}, ""
        xml = report.read_text() if report.exists() else None
    res = {"command": " ".join(command), **res, **junit_outcomes(xml), "seconds": time.perf_counter() - started}
    res["tail"] = tail
    print(f"  {kernel_tests_line(res)['measured']}", flush=True)
    return res


def junit_outcomes(xml: str | None) -> dict:
    """Every test's outcome from pytest's JUnit XML: passed, failed, error or skipped (with pytest's reason), and
    each failure's or error's message with the end of its report (the process's own output tail can be all
    warnings)."""
    outcomes, reasons, failures = {}, {}, {}
    for case in ET.fromstring(xml).iter("testcase") if xml else ():
        test = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag: child for child in case}
        outcome = next((k for k in ("error", "failure", "skipped") if k in kinds), "passed")
        outcomes[test] = {"failure": "failed"}.get(outcome, outcome)
        if outcome == "skipped":
            reasons[test] = kinds["skipped"].get("message", "")
        elif outcome != "passed":
            report = kinds[outcome]
            failures[test] = f"{report.get('message', '')}\n{(report.text or '')[-FAILURE_CHARS:]}".strip()
    return {"outcomes": outcomes, "skip_reasons": reasons, "failures": failures}


def comparison(a) -> dict:
    res = spawn_in_budget(
        a,
        "compare",
        "compare",
        f"[compare] {', '.join(a.compare_shapes)}: tables on the CPU and on {a.device} ...",
        compare_shapes=a.compare_shapes,
        device=a.device,
        n_sequences=a.compare_n,
        seq_len=a.compare_seq,
        threads=os.cpu_count() or a.threads,  # the CPU's reference, no ratio: every core
    )
    if res is None:
        return dict(BUDGET_SPENT)
    print(f"  {comparison_line(res)['measured']}", flush=True)
    return res


def checkpoint_row(a, shape: str) -> dict:
    """One checkpoint at the settings of the shape's sweep config, and the projection of the sweep from it."""
    import transformers

    announce = f"[{shape}] one checkpoint at the settings of {SWEEPS[shape]['config']} ..."
    row = spawn_in_budget(a, "checkpoint", "checkpoint", announce, shape=shape, threads=a.threads, device=a.device)
    if row is None:
        return {"shape": shape, **BUDGET_SPENT}
    if "error" in row:
        return {"shape": shape, "error": row["error"]}
    del row["seconds"]
    with torch.device("meta"):  # parameter counts of the checkpoints' own classes, without allocating them
        if shape == "bert":
            lm = transformers.BertForPreTraining(hf_model_config(shape))
        else:
            lm = transformers.GPTNeoXForCausalLM(hf_model_config(shape))
    sweep = SWEEPS[shape]
    n_params = sum(p.numel() for p in lm.parameters())  # tied weights once, as the weight files store them
    per_checkpoint_s = row["load_s"] + row["extract_run_s"] + row["tables_s"]
    row["projection"] = {
        **sweep,
        "params": n_params,
        "gb_per_checkpoint": n_params * sweep["bytes_per_param"] / 1e9,
        "gb_total": n_params * sweep["bytes_per_param"] * sweep["checkpoints"] / 1e9,
        "seconds_per_checkpoint": per_checkpoint_s,
        "wall_hours": per_checkpoint_s * sweep["checkpoints"] / 3600,
        "cpu_core_hours": per_checkpoint_s * sweep["checkpoints"] * a.threads / 3600,
        "gpu_hours": per_checkpoint_s * sweep["checkpoints"] / 3600 if a.device != "cpu" else None,
    }
    print(
        f"  {sweep['sweep']}: {per_checkpoint_s:.1f} s per checkpoint (run {row['extract_run_s']:.1f} s, "
        f"plain forward {row['plain_forward_s']:.1f} s), {row['projection']['gb_total']:.1f} GB",
        flush=True,
    )
    return row


def summary(out: dict) -> str:
    lines = goal_summary(out["goal"], out.get("call")) if out.get("goal") else []
    if out.get("device_rows"):
        lines += [
            "",
            f"### The device table ({device_name(out['device_rows'])})",
            "",
            *device_summary(out["device_rows"]),
        ]
    if out.get("comparison"):
        lines += ["", *comparison_summary(out["comparison"])]
    if out.get("kernel_tests"):
        lines += ["", *kernel_tests_summary(out["kernel_tests"])]
    if out.get("rows"):
        lines += [
            "",
            "| model | batch x seq | variant | speed vs plain | peak RSS vs plain | live tensors vs plain |",
            "|---|---|---|---|---|---|",
        ]
    names = {
        "extract": "anisweep extract",
        "hf_keep_all": "HF keep-all (eager)",
        "tl": "TransformerLens run_with_cache",
    }
    for r in out.get("rows", []):
        lines.append(
            f"| {r['shape']} | {r['batch']}x{r['seq_len']} | {names[r['variant']]} | "
            f"{r['speed_ratio']:.2f}x | {r['rss_ratio']:.2f}x | {r['live_ratio']:.2f}x |"
        )
    if out.get("flat"):
        lines += [
            "",
            "| model | n_sequences x seq | extract peak RSS (MB) | vs plain batch | live tensors (MB) |",
            "|---|---|---|---|---|",
        ]
        for f in out["flat"]:
            lines.append(
                f"| {f['shape']} | {f['n_sequences']}x{f['seq_len']} | {f['memory']['rss_hwm_mb']:.0f} | "
                f"{f['rss_ratio']:.2f}x | {f['memory']['live_peak_mb']:.0f} |"
            )
    if out.get("outlier_cost"):
        lines += [
            "",
            "| model | batch x seq | extract vs plain | each process | without the outlier statistics | "
            "drop (median of pairs) |",
            "|---|---|---|---|---|---|",
        ]
        for c in out["outlier_cost"]:
            each = " / ".join(f"{r:.3f}" for r in c.get("with_per_process", [c["with"]]))
            lines.append(
                f"| {c['shape']} | {c['batch']}x{c['seq_len']} | {c['with']:.3f}x | {each} | {c['without']:.3f}x | "
                f"{c['drop']:.3f} ({c['added_seconds'] * 1e3:.0f} ms per batch) |"
            )
    if out.get("checkpoint"):
        lines += [
            "",
            "| sweep | checkpoints | GB downloaded | s per checkpoint (load + extract + tables) | "
            "plain forward s | wall h | CPU core-h |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in out["checkpoint"]:
            if "error" in c:
                lines.append(f"| {SWEEPS[c['shape']]['sweep']}: {cell_text(c['error'])} | | | | | | |")
                continue
            p = c["projection"]
            lines.append(
                f"| {p['sweep']} ({c['n_sequences']}x{c['seq_len']}, {c.get('device', 'cpu')}, "
                f"{c['threads']} threads) | "
                f"{p['checkpoints']} | {p['gb_total']:.1f} | {p['seconds_per_checkpoint']:.1f} "
                f"({c['load_s']:.1f} + {c['extract_run_s']:.1f} + {c['tables_s']:.1f}) | "
                f"{c['plain_forward_s']:.1f} | {p['wall_hours']:.2f} | {p['cpu_core_hours']:.2f} |"
            )
    return "\n".join(lines).strip("\n")


def device_summary(rows: list[dict]) -> list[str]:
    lines = [
        "| shape | batch x seq | dtype | attention | plain tok/s | extract / plain | HF keep-all / plain | "
        "extract / HF keep-all | peak memory: extract / plain | HF keep-all / plain | goal | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        checks = cell_checks(r)
        head = f"| {shape_name(r['shape'])} | {r['batch']}x{r['seq_len']} | {r['dtype']} |"
        goal = f">= {speed_goal(r)}x, <= {MAX_MEMORY_RATIO}x memory, > 1x HF"
        verdict = f"{cell_verdict(checks)} ({cell_reasons(r, checks)})" if cell_verdict(checks) != PASS else PASS
        if "error" in r:
            lines.append(f"{head}{' - |' * 7} {goal} | {verdict} |")
            continue
        extract, hf = r["extract"], r["hf_keep_all"]
        lines.append(
            f"{head} {r['attention']} | {r['plain']['tokens_per_s']:,.0f} | {fmt_x(extract['speed_ratio'])} | "
            f"{fmt_x(hf['speed_ratio'])} | {fmt_x(checks['vs_hf'][0])} | {fmt_x(extract.get('memory_ratio'))} | "
            f"{fmt_x(hf.get('memory_ratio'))} | {goal} | {verdict} |"
        )
    return lines


def shape_name(shape: str) -> str:
    return NAMES.get(shape, shape)


def device_name(rows: list[dict]) -> str:
    return next((r["device"] for r in rows if "device" in r), "not run")


# -------------------------------------------------------------------------------------- the goal's verdicts

CHECKS = {"speed": "extract / plain", "memory": "peak memory extract / plain", "vs_hf": "extract / HF keep-all"}


def fmt_x(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def cell_text(text: str, width: int = 160) -> str:
    """One line of a message (its last: an exception's), fit for a Markdown cell."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:width].replace("|", "\\|")


def speed_goal(row: dict) -> float:
    return GOALS.get((row["shape"], row["batch"], row["seq_len"]), DEFAULT_GOAL)


def vs_hf(row: dict) -> float:
    """extract's tokens/s over HF keep-all's: the median over repetitions of their seconds' ratio."""
    return statistics.median(h / e for h, e in zip(row["hf_keep_all"]["seconds"], row["extract"]["seconds"]))


def cell_checks(row: dict) -> dict[str, tuple[float | None, str]]:
    """Each goal of one cell of the device table (CHECKS): its measured value and verdict. A memory ratio that was
    not measured (on the CPU) is NOT RUN, a cell that failed or was cut off FAIL, one the budget left out NOT RUN."""
    if "error" in row:
        verdict = NOT_RUN if row["error"].startswith("not run") else FAIL
        return {name: (None, verdict) for name in CHECKS}
    speed, memory, ahead = row["extract"]["speed_ratio"], row["extract"].get("memory_ratio"), vs_hf(row)
    return {
        "speed": (speed, PASS if speed >= speed_goal(row) else FAIL),
        "memory": (memory, NOT_RUN if memory is None else PASS if memory <= MAX_MEMORY_RATIO else FAIL),
        "vs_hf": (ahead, PASS if ahead > 1 else FAIL),
    }


def combine(verdicts) -> str:
    verdicts = list(verdicts)
    return FAIL if FAIL in verdicts else NOT_RUN if NOT_RUN in verdicts or not verdicts else PASS


def cell_verdict(checks: dict) -> str:
    return combine(verdict for _, verdict in checks.values())


def cell_reasons(row: dict, checks: dict) -> str:
    if "error" in row:
        return cell_text(row["error"].removeprefix("not run: "))
    wants = {"speed": f">= {speed_goal(row)}x", "memory": f"<= {MAX_MEMORY_RATIO}x", "vs_hf": "> 1x"}
    return "; ".join(
        f"{CHECKS[name]} not measured" if value is None else f"{CHECKS[name]} {fmt_x(value, 3)}, goal {wants[name]}"
        for name, (value, verdict) in checks.items()
        if verdict != PASS
    )


def cell_label(row: dict) -> str:
    return f"{shape_name(row['shape'])} {row['batch']}x{row['seq_len']} {row['dtype']}"


def criterion_line(goal: str, rows: list[dict], name: str) -> dict:
    checks = [(row, cell_checks(row)[name]) for row in rows]
    return {
        "goal": goal,
        "measured": ", ".join(f"{cell_label(row)} {fmt_x(value)}" for row, (value, _) in checks) or "not run",
        "verdict": combine(verdict for _, (_, verdict) in checks),
    }


def goal_lines(out: dict) -> list[dict]:
    """Every line of the goal: its measured values and verdict (PASS, FAIL, NOT_RUN), then all of them."""
    rows = out.get("device_rows") or []
    lines = [
        criterion_line(
            f"extract >= {goal}x the tokens/s of a plain sdpa forward",
            [r for r in rows if speed_goal(r) == goal],
            "speed",
        )
        for goal in sorted({speed_goal(r) for r in rows} or {DEFAULT_GOAL}, reverse=True)
    ]
    lines += [
        criterion_line(f"peak device memory <= {MAX_MEMORY_RATIO}x the plain pass's", rows, "memory"),
        criterion_line("extract ahead of HF keep-all (tokens/s), every cell", rows, "vs_hf"),
        comparison_line(out.get("comparison")),
        kernel_tests_line(out.get("kernel_tests")),
    ]
    wall = (out.get("call") or {}).get("wall_s")
    lines.append(
        {
            "goal": f"one call under {TIME_GOAL_S // 60} minutes",
            "measured": "-" if wall is None else f"{wall:.0f} s, parts {' '.join(out['call']['parts'])}",
            "verdict": NOT_RUN if wall is None else PASS if wall < TIME_GOAL_S else FAIL,
        }
    )
    verdicts = [line["verdict"] for line in lines]
    lines.append(
        {
            "goal": "all of the above",
            "measured": f"{verdicts.count(PASS)} of {len(verdicts)} pass",
            "verdict": combine(verdicts),
        }
    )
    return lines


def goal_summary(lines: list[dict], call: dict | None) -> list[str]:
    budget = "none" if not call or call["budget_s"] is None else f"{call['budget_s']:.0f} s"
    where = f" ({call['device']}, budget {budget})" if call else ""
    rows = [f"| {line['goal']} | {cell_text(line['measured'], 2000)} | {line['verdict']} |" for line in lines]
    return [f"### The goal{where}", "", "| goal | measured | verdict |", "|---|---|---|", *rows]


def compare_run_verdict(run: dict, rtol: float) -> tuple[str, str]:
    """A float32 run on the device against the CPU's tables: every table within rtol, through the Triton kernel on
    CUDA (torch ops on the CPU), with no fallback to the torch path."""
    if not run["judged"]:
        return "reported", ""
    wants = "triton" if run["device"].startswith("cuda") else "torch"
    reasons = [
        f"{name} {t['max_rel']:.1e} in {t['column']}" for name, t in run["tables"].items() if not t["max_rel"] <= rtol
    ]
    if run["attention"] != wants:
        reasons.append(f"attention ran as {run['attention']}, not {wants}")
    reasons += [cell_text(w, 200) for w in run["fallbacks"]]
    return (FAIL if reasons else PASS), "; ".join(reasons)


def comparison_line(res: dict | None) -> dict:
    goal = (
        f"{(res or {}).get('device', 'device')} tables equal CPU tables (float32: {rtol_text(COMPARE_RTOL)} relative)"
    )
    if not res or "error" in res:
        error = (res or {}).get("error", "not run")
        return {"goal": goal, "measured": cell_text(error), "verdict": NOT_RUN if error.startswith("not run") else FAIL}
    judged = [(shape, run) for shape in res["shapes"] for run in shape["runs"] if run["judged"]]
    measured = ", ".join(
        f"{shape_name(shape['shape'])} {run['device']} {max_difference(run):.1e} over {len(run['tables'])} tables"
        for shape, run in judged
    )
    verdicts = [compare_run_verdict(run, res["rtol"])[0] for _, run in judged]
    return {"goal": goal, "measured": measured or "no table", "verdict": combine(verdicts)}


def rtol_text(rtol: float) -> str:
    return f"{rtol:.0e}".replace("e-0", "e-")


def comparison_summary(res: dict) -> list[str]:
    line = comparison_line(res)
    if "error" in res:
        return [
            "### Device tables against the CPU's",
            "",
            f"{line['verdict']}: {line['measured'].removeprefix('not run: ')}",
        ]
    names = list(res["shapes"][0]["runs"][0]["tables"]) if res["shapes"] else []
    lines = [
        "### Device tables against the CPU's",
        "",
        "Largest |device - cpu| of each table against the CPU's float32 tables, relative to its column's largest "
        f"|cpu| (at least {res['rel_floor']}); {res['n_sequences']} x {res['seq_len']} tokens, padded; float32 judged "
        f"at {rtol_text(res['rtol'])}, bfloat16 reported. HF's own eager float32 hidden states, {res['device']} "
        "against the CPU, by the same measure: "
        + ", ".join(f"{shape_name(s['shape'])} {s['hf_hidden']:.1e}" for s in res["shapes"] if "hf_hidden" in s)
        + ".",
        "",
        f"| shape | run | path | {' | '.join(names)} | verdict |",
        "|---|---|---|" + "---|" * len(names) + "---|",
    ]
    for shape in res["shapes"]:
        for run in shape["runs"]:
            verdict, why = compare_run_verdict(run, res["rtol"])
            values = " | ".join(f"{run['tables'][name]['max_rel']:.1e}" for name in names)
            lines.append(
                f"| {shape_name(shape['shape'])} | {run['device']} {run['dtype']} | {run['attention']} | "
                f"{values} | {verdict + (f' ({cell_text(why, 400)})' if why else '')} |"
            )
    return lines


def tally_tests(res: dict) -> dict:
    outcomes = res.get("outcomes", {})
    tally = {
        kind: sorted(t for t, o in outcomes.items() if o == kind) for kind in ("passed", "failed", "error", "skipped")
    }
    tally["cuda"] = {
        name: next((o for t, o in outcomes.items() if t.split("::")[-1].split("[")[0] == name), "missing")
        for name in CUDA_TESTS
    }
    return tally


def kernel_tests_line(res: dict | None) -> dict:
    """The kernel tests' counts; pass only if every test ran and passed, the CUDA-only ones too: a skipped test
    is NOT run."""
    goal = "CUDA kernel tests run and pass (" + ", ".join(Path(t).name for t in KERNEL_TESTS) + ")"
    if not res or "error" in res and not res.get("outcomes"):
        error = (res or {}).get("error", "not run")
        return {"goal": goal, "measured": error, "verdict": NOT_RUN if error.startswith("not run") else FAIL}
    tally = tally_tests(res)
    ran = len(tally["passed"]) + len(tally["failed"]) + len(tally["error"])
    cuda = ", ".join(
        f"{name} {'passed' if o == 'passed' else 'NOT run' if o in ('skipped', 'missing') else o}"
        for name, o in tally["cuda"].items()
    )
    measured = (
        f"{ran} ran: {len(tally['passed'])} passed, {len(tally['failed'])} failed, {len(tally['error'])} errors; "
        f"{len(tally['skipped'])} skipped (NOT run); CUDA-only: {cuda}"
    )
    if res.get("error"):
        measured += f"; {res['error']}"
    if tally["failed"] or tally["error"] or res.get("error") or res.get("returncode") not in (0, None) or not ran:
        verdict = FAIL
    elif tally["skipped"] or any(o != "passed" for o in tally["cuda"].values()):
        verdict = NOT_RUN
    else:
        verdict = PASS
    return {"goal": goal, "measured": measured, "verdict": verdict}


def kernel_tests_summary(res: dict) -> list[str]:
    line = kernel_tests_line(res)
    lines = [
        "### Kernel tests",
        "",
        f"`{res['command']}`: {line['measured']} ({res.get('seconds', 0):.0f} s): **{line['verdict']}**",
    ]
    tally = tally_tests(res) if res.get("outcomes") else {"failed": [], "error": [], "skipped": []}
    for kind in ("failed", "error"):
        for test in tally[kind]:
            lines.append(f"- {kind}: {test}")
            said = res.get("failures", {}).get(test)
            lines += ["", "  ```", *(f"  {line}" for line in said.splitlines()[-12:]), "  ```"] if said else []
    lines += [f"- skipped, NOT run: {test} ({res['skip_reasons'].get(test, '')})" for test in tally["skipped"]]
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "mode",
        nargs="?",
        default="drive",
        choices=["drive", "speed", "memory", "checkpoint", "device", "compare", "summary"],
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--shapes", nargs="+", default=["bert", "pythia"], choices=["bert", "pythia"])
    ap.add_argument("--repeat", type=int, help="repetitions: default 7 (CPU ratios), 5 (the device table)")
    ap.add_argument("--processes", type=int, default=3, help="fresh processes of the outlier statistics' cost")
    ap.add_argument("--flat-n", type=int, nargs="*", default=[8, 32, 128])
    ap.add_argument("--tl-python", default="/work/benchvenv/bin/python")
    ap.add_argument("--out", help="default benchmarks/out/extract.json, or extract_<device>.json off the CPU")
    ap.add_argument(
        "--parts",
        nargs="+",
        choices=["ratios", "flat", "outliers", "checkpoint", "tests", "compare", "device"],
        help="what to (re)measure, the rest of --out is kept; default ratios flat checkpoint on the "
        "CPU, tests compare device checkpoint elsewhere (run in that order)",
    )
    ap.add_argument("--device", default="cpu", help="cpu, cuda: where the device table and the checkpoint run")
    ap.add_argument("--cells", nargs="+", default=DEVICE_CELLS, help="the device table's shape:batch:seq:dtype")
    ap.add_argument(
        "--budget", type=float, help=f"seconds for the whole call (default {BUDGET_S} off the CPU, none on it)"
    )
    ap.add_argument("--compare-shapes", nargs="+", default=["bert", "pythia"], choices=list(SHAPES))
    ap.add_argument("--compare-n", type=int, default=8, help="sequences of the comparison's batch")
    ap.add_argument("--compare-seq", type=int, default=512, help="tokens per sequence of the comparison's batch")
    # worker options
    ap.add_argument("--shape", choices=list(SHAPES))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--n-sequences", type=int)
    ap.add_argument("--sample-tokens", type=int, help="extract's hidden-state sample (default: sample_size)")
    ap.add_argument("--variants", nargs="+")
    ap.add_argument("--tl-env", action="store_true", help="load transformer_lens instead of anisweep (memory)")
    a = ap.parse_args(argv)
    on_cpu = a.device == "cpu"
    cpu_parts, device_parts = ["ratios", "flat", "outliers", "checkpoint"], ["tests", "compare", "device", "checkpoint"]
    a.parts = a.parts or (cpu_parts if on_cpu else device_parts)
    a.budget = a.budget if a.budget is not None or on_cpu else BUDGET_S
    a.out = a.out or str(HERE.parent / "out" / ("extract.json" if on_cpu else f"extract_{a.device}.json"))
    if a.mode == "drive":
        drive(a)
    elif a.mode == "summary":
        print(summary(json.loads(Path(a.out).read_text())))
    else:
        worker = {"speed": speed, "memory": memory, "checkpoint": checkpoint, "device": device_cell, "compare": compare}
        worker = worker[a.mode]
        print(MARK + json.dumps(worker(a)), flush=True)


if __name__ == "__main__":
    main()
