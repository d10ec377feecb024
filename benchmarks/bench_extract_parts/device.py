"""The `device` part: the goal's table, each cell (shape:batch:seq:dtype, --cells, default DEVICE_CELLS) in a fresh
process: the three HF variants (plain, extract, hf_keep_all) interleaved in it (median of --repeat, 5, CUDA
synchronised around each pass; ratios per repetition) and, one variant at a time, the peak of
torch.cuda.max_memory_allocated during a pass (weights included), as a ratio to the plain pass's. Each cell is judged
against its goal (GOALS: extract at >= 0.8x the plain tokens/s at 32 x 512, >= 0.7x for pythia-1.4b 8 x 512 and
pythia-160m 8 x 2048; peak memory <= 1.2x the plain pass's; faster than HF keep-all). On the CPU there is no memory
column.
"""

from __future__ import annotations

import gc
import statistics
import time

import torch

from .core import (
    BUDGET_SPENT,
    FAIL,
    NOT_RUN,
    PASS,
    cell_text,
    combine,
    fmt_x,
    markdown_table,
    shape_name,
    spawn_in_budget,
)
from .models import make_batch, variants_for

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
TABLE_HEAD = (
    "| shape | batch x seq | dtype | attention | plain tok/s | extract / plain | HF keep-all / plain | "
    "extract / HF keep-all | peak memory: extract / plain | HF keep-all / plain | goal | verdict |"
)
CHECKS = {"speed": "extract / plain", "memory": "peak memory extract / plain", "vs_hf": "extract / HF keep-all"}


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


def device_summary(rows: list[dict]) -> list[str]:
    return markdown_table(TABLE_HEAD, [device_line(r) for r in rows])


def device_line(r: dict) -> str:
    checks = cell_checks(r)
    head = f"| {shape_name(r['shape'])} | {r['batch']}x{r['seq_len']} | {r['dtype']} |"
    goal = f">= {speed_goal(r)}x, <= {MAX_MEMORY_RATIO}x memory, > 1x HF"
    verdict = f"{cell_verdict(checks)} ({cell_reasons(r, checks)})" if cell_verdict(checks) != PASS else PASS
    if "error" in r:
        return f"{head}{' - |' * 7} {goal} | {verdict} |"
    extract, hf = r["extract"], r["hf_keep_all"]
    return (
        f"{head} {r['attention']} | {r['plain']['tokens_per_s']:,.0f} | {fmt_x(extract['speed_ratio'])} | "
        f"{fmt_x(hf['speed_ratio'])} | {fmt_x(checks['vs_hf'][0])} | {fmt_x(extract.get('memory_ratio'))} | "
        f"{fmt_x(hf.get('memory_ratio'))} | {goal} | {verdict} |"
    )


def device_name(rows: list[dict]) -> str:
    return next((r["device"] for r in rows if "device" in r), "not run")


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
