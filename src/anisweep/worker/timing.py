"""Each command's wall time, from its process's start to its end, appended to a file that a benchmark names in
ANISWEEP_TIMINGS (benchmarks/bench_workflow.py)."""

from __future__ import annotations

import fcntl
import json
import os
import time


def process_seconds() -> float:
    """Seconds since this process started (the kernel's start time, to its clock tick)."""
    fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of proc(5): start time after boot
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started


def record(path: str, argv: list[str], status: int) -> None:
    threads = os.environ.get("OMP_NUM_THREADS")  # Snakemake's threads for the job
    line = {"argv": argv, "cwd": os.getcwd(), "threads": threads, "status": status, "wall_s": process_seconds()}
    line = json.dumps(line | {"end": time.time()}) + "\n"
    with open(path, "a") as out:
        fcntl.flock(out, fcntl.LOCK_EX)
        out.write(line)
