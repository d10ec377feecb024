"""Where extract's time goes against a plain forward, on one batch (run by hand, on any device).

    python benchmarks/profile_extract.py --device cuda --shape bert --batch 32 --seq-len 512 --dtype bfloat16
        [--out benchmarks/out/profile]

The models and batch are bench_extract's (bench_extract_parts/models.py: random weights, no download). Prints, and
writes to --out as text: the median seconds of the plain forward and of extract (3 passes each, after a warm-up,
synchronised), then for one extract pass: torch.profiler's ops by their own device time and by their own host time,
the Python functions by cumulative time (cProfile), and on CUDA every place that makes the host wait for the device
(torch's sync debug mode, one line per distinct call site).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_extract_parts.core import SHAPES
from bench_extract_parts.models import make_batch, variants_for


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shape", default="bert", choices=list(SHAPES))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--rows", type=int, default=30, help="lines of each table")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "profile"))
    a = ap.parse_args(argv)
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    name = f"{a.shape}_{a.batch}x{a.seq_len}_{a.dtype}_{device.type}"
    report = io.StringIO()

    def say(text: str) -> None:
        print(text, flush=True)
        report.write(text + "\n")

    runs = variants_for(a.shape, ["plain", "extract"], device, dtype)
    cpu_batch = make_batch(a.shape, a.batch, a.seq_len)  # extract moves its mini-batches itself
    batches = {"plain": {k: v.to(device) for k, v in cpu_batch.items()}, "extract": cpu_batch}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def once(variant: str) -> float:
        sync()
        started = time.perf_counter()
        runs[variant](batches[variant])
        sync()
        return time.perf_counter() - started

    with torch.inference_mode():
        for variant in runs:
            once(variant)
        seconds = {v: statistics.median(once(v) for _ in range(3)) for v in runs}
        say(
            f"# {name}: plain {seconds['plain']:.3f} s, extract {seconds['extract']:.3f} s "
            f"({seconds['plain'] / seconds['extract']:.3f}x)"
        )

        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            once("extract")
        ops = prof.key_averages()
        if device.type == "cuda":
            say("\n## ops by their own device time\n" + ops.table(sort_by="self_device_time_total", row_limit=a.rows))
        say("\n## ops by their own host time\n" + ops.table(sort_by="self_cpu_time_total", row_limit=a.rows))

        profiler = cProfile.Profile()
        profiler.enable()
        once("extract")
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(a.rows * 2)
        say("\n## Python functions by cumulative time\n" + text.getvalue())

        if device.type == "cuda":
            say("\n## host waits for the device (torch.cuda sync debug mode)\n" + "\n".join(sync_sites(once)))

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.txt").write_text(report.getvalue())
    print(f"wrote {out / (name + '.txt')}")


def sync_sites(once) -> list[str]:
    """The distinct call sites in anisweep or transformers where one extract pass makes the host wait."""
    sites: dict[str, int] = {}

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-2] if "anisweep" in f.filename or "transformers" in f.filename]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames[-3:]))
        key = f"{str(message).splitlines()[0][:80]} at {where}"
        sites[key] = sites.get(key, 0) + 1

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():  # restores showwarning on leaving
            warnings.simplefilter("always")
            warnings.showwarning = record
            once("extract")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [f"{n} x {key}" for key, n in sorted(sites.items(), key=lambda kv: -kv[1])] or ["none"]


if __name__ == "__main__":
    main()
