"""Benchmark the point-cloud metrics on a large float32 cloud (run by hand, not by pytest).

    python benchmarks/bench_geometry.py [--n 1000000] [--d 768] [--iso-n 100000 1000000] [--repeat 3]

Each metric's time is reported with a baseline measured in the same process on the same array:
one ``x.sum(axis=0)`` pass (float32, memory-bound), so the figures are ratios that survive a
change of machine. Peak memory is the tracemalloc peak of the call alone (numpy reports its
buffers to tracemalloc), compared with x.nbytes. Results go to benchmarks/out/geometry.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
import tracemalloc
from pathlib import Path

import numpy as np

from anisweep.measures import geometry as M


def timed(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def bench(name, fn, x, repeat, base_s):
    s, value = timed(fn, repeat)
    peak = peak_bytes(fn)
    row = {
        "metric": name,
        "n": int(x.shape[0]),
        "d": int(x.shape[1]),
        "seconds": s,
        "x_sum_seconds": base_s,
        "ratio_to_x_sum": s / base_s,
        "peak_mb": peak / 2**20,
        "x_mb": x.nbytes / 2**20,
        "peak_over_x": peak / x.nbytes,
        "value": value if isinstance(value, float) else list(value),
    }
    print(
        f"{name:>20} n={x.shape[0]:>8} d={x.shape[1]}  {s:8.3f} s  = {s / base_s:7.1f} x sum-pass"
        f"  peak {peak / 2**20:7.1f} MB ({peak / x.nbytes:.3f} of x)  value {row['value']}",
        flush=True,
    )
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument(
        "--iso-n",
        type=int,
        nargs="+",
        default=[100_000, 1_000_000],
        help="IsoScore sample sizes (first rows of the cloud); must be >= d",
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "out" / "geometry.json"))
    a = ap.parse_args(argv)

    t = time.perf_counter()
    r = np.random.default_rng(0)
    x = r.standard_normal((a.n, a.d), dtype=np.float32)
    x += r.standard_normal(a.d, dtype=np.float32)  # a common drift, as in trained models
    print(
        f"generated {a.n} x {a.d} float32 ({x.nbytes / 2**30:.2f} GiB) in {time.perf_counter() - t:.1f} s", flush=True
    )

    rows = []
    base, _ = timed(lambda: x.sum(axis=0), a.repeat)
    print(f"baseline x.sum(axis=0): {base:.3f} s", flush=True)
    rows.append(bench("avg_cos", lambda: M.avg_cos(x), x, a.repeat, base))
    rows.append(bench("drift", lambda: M.drift(x), x, a.repeat, base))
    rows.append(bench("centred_avg_cos", lambda: M.centred_avg_cos(x), x, a.repeat, base))
    for n in a.iso_n:
        xs = x[:n]  # a view: no copy
        b, _ = timed(lambda xs=xs: xs.sum(axis=0), a.repeat)
        rows.append(bench("isoscore", lambda xs=xs: M.isoscore(xs), xs, 1 if n > 200_000 else a.repeat, b))
    wn = min(50_000, a.n)
    xw = x[:wn]
    b, _ = timed(lambda: xw.sum(axis=0), a.repeat)
    rows.append(bench("partition_isotropy", lambda: M.partition_isotropy(xw), xw, 1, b))

    out = {
        "rows": rows,
        "process_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "machine": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
        },
        "note": "seconds = best of --repeat (1 for n > 200k); ratio = seconds / one x.sum(axis=0) pass "
        "over the same rows; peak = tracemalloc peak of the call alone",
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2))
    print(f"max RSS {out['process_max_rss_mb']:.0f} MB; wrote {a.out}")


if __name__ == "__main__":
    main()
