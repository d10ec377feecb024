"""Benchmark extract against a plain forward pass and the usual ways of reading activations (run by hand).

    python benchmarks/bench_extract.py [--threads 2] [--batch 8] [--seq-lens 128 512] [--shapes bert pythia]
        [--repeat 7] [--flat-n 8 32 128] [--tl-python /work/benchvenv/bin/python] [--out benchmarks/out/extract.json]
    python benchmarks/bench_extract.py --device cuda [--parts tests compare device checkpoint] [--budget 540]
        [--cells bert:32:512:float32 ...] [--repeat 5] [--out benchmarks/out/extract_cuda.json]
    python benchmarks/bench_extract.py --device cpu --parts tests compare device --cells bert-tiny:4:64:float32
        --compare-shapes bert-tiny pythia-tiny --repeat 3     # the same code on the CPU, to check it

Models are built from config with random weights (no download), bert-base shape (BertModel) and pythia-160m shape
(GPTNeoXModel: rotary 0.25, parallel residual). Every figure is a ratio to a plain base-model forward (sdpa
attention, no hooks) on the same batch. This file is the command and its worker modes; each part lives in a module
of bench_extract_parts/, which says what it measures and how:

* on the CPU (default --parts ratios flat outliers checkpoint): `ratios` (ratios.py: the speed, speed.py, and the
  memory, memory.py, of every variant, models.py), `flat` (flat.py: extract's memory as n_sequences grows),
  `outliers` (outliers.py: the outlier statistics' cost), `units` (units.py: the resampling units' sums' cost),
  `checkpoint` (checkpoint.py: one checkpoint at a sweep
  config's settings and the projection of the sweep).
* on a GPU (`--device cuda`, one call, about 6 minutes on one H200; it stops at once where torch sees no GPU), in
  this order, each part in fresh processes without TRITON_INTERPRET, so that Triton compiles its kernels:
  1. `tests` (kernel_tests.py): the kernel tests, a skipped test counted as NOT run;
  2. `compare` (compare.py): every table on the device against the CPU's, float32 judged at 1e-5;
  3. `device` (device.py): the goal's table, speed and peak memory of each cell against the plain pass;
  4. `checkpoint` (checkpoint.py): one checkpoint at each sweep config's settings on the device, if time is left.

Then every goal line (goal.py) with its measured value and verdict, the kernel tests' counts, the comparison's
verdict and the call's wall time, printed and written with the rest to the JSON (--out) and a Markdown file beside it
(.md) (driver.py; the shared shapes, processes and budget are core.py's). Time, measured once on an H200 (16 cores;
--budget 450): 362 s in all; tests 83 s (the kernel compiles spread over the cores), the comparison 70 s, the six
table cells 21-27 s each (139 s), the two checkpoints 65 s. --budget (540 s) bounds it whatever happens: tests get
at most PART_CAPS["tests"] s, the comparison PART_CAPS["compare"] s, the table and then the checkpoints what is
left; a part or cell that runs past it is killed (FAIL), one the budget leaves no time for is NOT RUN. `--device
cpu` runs the same parts on the CPU (no memory column; the comparison then the CPU's tables against themselves),
with the tiny shapes to check the code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_extract_parts.checkpoint import checkpoint
from bench_extract_parts.compare import compare
from bench_extract_parts.core import BUDGET_S, MARK, SHAPES
from bench_extract_parts.device import DEVICE_CELLS, device_cell
from bench_extract_parts.driver import drive, summary
from bench_extract_parts.memory import memory
from bench_extract_parts.speed import speed

HERE = Path(__file__).resolve()


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
        choices=["ratios", "flat", "outliers", "units", "checkpoint", "tests", "compare", "device"],
        help="what to (re)measure, the rest of --out is kept; default ratios flat outliers checkpoint on the "
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
