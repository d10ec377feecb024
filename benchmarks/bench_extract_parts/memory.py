"""The `memory` worker: one variant in a fresh process, two measures of its memory.

- peak RSS: after one warm-up pass and malloc_trim, the kernel's high-water mark is reset (/proc/self/clear_refs)
  and read back after the measured pass (VmHWM); it includes the interpreter, libraries and weights, as a user sees
  it.
- live tensors: the peak of torch's CPU allocations (allocated minus freed) during the pass, from torch.profiler's
  memory events, on ONE thread (the profiler sees only the calling thread, and with one thread extract's statistics
  run inline), plus the weights; unlike RSS it ignores the allocator's retained free memory.
"""

from __future__ import annotations

import ctypes
import gc
import resource
from pathlib import Path

import torch

from .models import make_batch, variants_for


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


def ratios(mem: dict, plain: dict) -> dict:
    live = lambda m: m["weights_mb"] + m["live_peak_mb"]  # noqa: E731
    return {
        "rss_ratio": mem["rss_hwm_mb"] / plain["rss_hwm_mb"],
        "live_ratio": live(mem) / live(plain),
        "live_activation_ratio": mem["live_peak_mb"] / max(plain["live_peak_mb"], 1e-9),
    }
