"""Benchmark extract against a plain forward pass and the usual ways of reading activations (run by hand).

    python benchmarks/bench_extract.py [--threads 2] [--batch 8] [--seq-lens 128 512] [--shapes bert pythia]
        [--repeat 7] [--flat-n 8 32 128] [--tl-python /work/benchvenv/bin/python] [--out benchmarks/out/extract.json]
    python benchmarks/bench_extract.py --device cuda [--cells bert:8:512:float32 ...] [--repeat 5]
        [--out benchmarks/out/extract_cuda.json]

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

On a GPU (`--device cuda`, parts `device` and `checkpoint`): each cell (shape:batch:seq:dtype, by default
the GPU table of the README) in a fresh process, the three HF variants below interleaved in it (median of --repeat,
CUDA synchronised around each pass) and, one variant at a time, the peak of torch.cuda.max_memory_allocated
during a pass (weights included), as a ratio to the plain pass's; then one checkpoint at each sweep
config's settings on the device. Shapes there include pythia-1.4b. `--device cpu --parts device` runs the
same code on the CPU (speed only), to check it.

Variants: `plain`; `extract` (anisweep.extract.run.run with every statistic and the hidden-state sample
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
import ctypes
import functools
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve()
MARK = "BENCH_RESULT "
VOCAB = {"bert": 30522, "pythia": 50304, "pythia-1.4b": 50304}
DEVICE_CELLS = [
    "bert:8:512:float32",
    "pythia:8:512:float32",
    "bert:32:512:float32",
    "pythia:32:512:float32",
    "bert:32:512:bfloat16",
    "pythia:32:512:bfloat16",
    "pythia-1.4b:8:512:bfloat16",
    "pythia:8:2048:bfloat16",
]  # the GPU table: shapes, batch x seq, dtypes
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
    return "bert" if shape == "bert" else "pythia"


def sample_size(shape: str, n_sequences: int, seq_len: int) -> int:
    """The hidden-state sample of the shape's sweep config, in proportion for fewer tokens than its
    evaluation set: what one mini-batch of the sweep contributes to it."""
    s = sweep_settings(shape)
    rate = s["sample_tokens"] / (s["n_sequences"] * s["seq_len"])
    return min(s["sample_tokens"], round(rate * n_sequences * seq_len))


# ----------------------------------------------------------------------------------------- models


def hf_model_config(shape: str):
    import transformers

    if shape == "bert":
        return transformers.BertConfig(
            vocab_size=VOCAB["bert"],
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=512,
        )
    width, layers, heads = (2048, 24, 16) if shape == "pythia-1.4b" else (768, 12, 12)
    return transformers.GPTNeoXConfig(
        vocab_size=VOCAB[shape],
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
    cls = transformers.BertModel if shape == "bert" else transformers.GPTNeoXModel
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
    import tempfile

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


# ------------------------------------------------------------------------------------------ driver


def spawn(python: str, mode: str, **kw) -> dict:
    cmd = [python, str(HERE), mode]
    for key, value in kw.items():
        flag = f"--{key.replace('_', '-')}"
        if value is True:
            cmd.append(flag)
        else:
            cmd += [flag, *map(str, value if isinstance(value, list) else [value])]
    env = {**os.environ, "OMP_NUM_THREADS": str(kw["threads"]), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(MARK) :])


def ratios(mem: dict, plain: dict) -> dict:
    live = lambda m: m["weights_mb"] + m["live_peak_mb"]  # noqa: E731
    return {
        "rss_ratio": mem["rss_hwm_mb"] / plain["rss_hwm_mb"],
        "live_ratio": live(mem) / live(plain),
        "live_activation_ratio": mem["live_peak_mb"] / max(plain["live_peak_mb"], 1e-9),
    }


def drive(a) -> None:
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
    if "device" in a.parts:
        out["device_rows"] = [device_row(a, cell) for cell in a.cells]
    if "checkpoint" in a.parts:
        out["checkpoint"] = [checkpoint_row(a, shape) for shape in a.shapes]
    out["machine"][f"load_average_end_{'_'.join(a.parts)}"] = os.getloadavg()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2))
    print(summary(out))
    print(f"wrote {a.out}")


def ratio_rows(a, shape: str, t: int) -> list[dict]:
    """Speed (one process per venv) and memory (one process per variant) of every variant at batch x t."""
    common = dict(threads=a.threads, batch=a.batch)
    tl_ok = a.tl_python and Path(a.tl_python).exists()
    print(f"[{shape} {a.batch}x{t}] speed ...", flush=True)
    sp = spawn(
        sys.executable,
        "speed",
        shape=shape,
        seq_len=t,
        repeat=a.repeat,
        variants=["plain", "extract", "hf_keep_all"],
        **common,
    )
    if tl_ok:
        sp_tl = spawn(a.tl_python, "speed", shape=shape, seq_len=t, repeat=a.repeat, variants=["plain", "tl"], **common)
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
    shape, batch, seq_len, dtype = cell.split(":")
    print(f"[{shape} {batch}x{seq_len} {dtype} on {a.device}] speed and memory ...", flush=True)
    row = spawn(
        sys.executable,
        "device",
        shape=shape,
        batch=int(batch),
        seq_len=int(seq_len),
        dtype=dtype,
        device=a.device,
        repeat=a.repeat,
        threads=a.threads,
    )
    print("  " + "  ".join(f"{n} {row[n]['speed_ratio']:.2f}x" for n in ("extract", "hf_keep_all")), flush=True)
    return row


def checkpoint_row(a, shape: str) -> dict:
    """One checkpoint at the settings of the shape's sweep config, and the projection of the sweep from it."""
    import transformers

    print(f"[{shape}] one checkpoint at the settings of {SWEEPS[shape]['config']} ...", flush=True)
    row = spawn(sys.executable, "checkpoint", shape=shape, threads=a.threads, device=a.device)
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
    lines = device_summary(out["device_rows"]) if out.get("device_rows") else []
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
    if out.get("checkpoint"):
        lines += [
            "",
            "| sweep | checkpoints | GB downloaded | s per checkpoint (load + extract + tables) | "
            "plain forward s | wall h | CPU core-h |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in out["checkpoint"]:
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
    ratio = lambda v, key: "-" if v.get(key) is None else f"{v[key]:.2f}x"  # noqa: E731
    lines = [
        "| shape | batch x seq | dtype | attention | plain tok/s | extract speed / mem | HF keep-all speed / mem |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [f"{ratio(r[n], 'speed_ratio')} / {ratio(r[n], 'memory_ratio')}" for n in ("extract", "hf_keep_all")]
        lines.append(
            f"| {r['shape']} | {r['batch']}x{r['seq_len']} | {r['dtype']} | {r['attention']} | "
            f"{r['plain']['tokens_per_s']:,.0f} | {cells[0]} | {cells[1]} |"
        )
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "mode", nargs="?", default="drive", choices=["drive", "speed", "memory", "checkpoint", "device", "summary"]
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--shapes", nargs="+", default=["bert", "pythia"], choices=["bert", "pythia"])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--flat-n", type=int, nargs="*", default=[8, 32, 128])
    ap.add_argument("--tl-python", default="/work/benchvenv/bin/python")
    ap.add_argument("--out", help="default benchmarks/out/extract.json, or extract_<device>.json off the CPU")
    ap.add_argument(
        "--parts",
        nargs="+",
        choices=["ratios", "flat", "checkpoint", "device"],
        help="what to (re)measure, the rest of --out is kept; default ratios flat checkpoint on the "
        "CPU, device checkpoint elsewhere",
    )
    ap.add_argument("--device", default="cpu", help="cpu, cuda: where the device table and the checkpoint run")
    ap.add_argument("--cells", nargs="+", default=DEVICE_CELLS, help="the device table's shape:batch:seq:dtype")
    # worker options
    ap.add_argument("--shape", choices=list(VOCAB))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--n-sequences", type=int)
    ap.add_argument("--sample-tokens", type=int, help="extract's hidden-state sample (default: sample_size)")
    ap.add_argument("--variants", nargs="+")
    ap.add_argument("--tl-env", action="store_true", help="load transformer_lens instead of anisweep (memory)")
    a = ap.parse_args(argv)
    on_cpu = a.device == "cpu"
    a.parts = a.parts or (["ratios", "flat", "checkpoint"] if on_cpu else ["device", "checkpoint"])
    a.out = a.out or str(HERE.parent / "out" / ("extract.json" if on_cpu else f"extract_{a.device}.json"))
    if a.mode == "drive":
        drive(a)
    elif a.mode == "summary":
        print(summary(json.loads(Path(a.out).read_text())))
    else:
        worker = {"speed": speed, "memory": memory, "checkpoint": checkpoint, "device": device_cell}[a.mode]
        print(MARK + json.dumps(worker(a)), flush=True)


if __name__ == "__main__":
    main()
