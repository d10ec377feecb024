"""The `speed` worker, and its fresh process (spawn_speed) for the parts that time variants on the CPU.

Speed: plain seconds / variant seconds, per repetition, all variants interleaved in ONE process (order rotated every
repetition); the median over repetitions is reported (wall clock; the ratio of process CPU times is kept too, as a
check that is less sensitive to other jobs on the machine).
"""

from __future__ import annotations

import gc
import statistics
import sys
import time

import torch

from .core import spawn
from .models import make_batch, variants_for


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


def spawn_speed(a, shape: str, t: int, variants: list[str], repeat: int, python: str = sys.executable) -> dict:
    """The `speed` worker on --batch sequences of t tokens of `shape`, on --threads, in a fresh process of `python`."""
    return spawn(
        python, "speed", shape=shape, seq_len=t, repeat=repeat, variants=variants, threads=a.threads, batch=a.batch
    )
