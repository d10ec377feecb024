"""What every part of bench_extract shares: the model shapes and the sweeps they stand for, the verdict words, the
workers' fresh processes (spawn: bench_extract.py run again with a worker mode, its result on one line after MARK)
within the call's time budget, and the text helpers of the tables."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench_extract.py"  # the command, run again for each worker
MARK = "BENCH_RESULT "
ROOT = SCRIPT.parents[1]
SHAPES = {  # shape -> vocabulary, width, layers, heads (bert*: BertModel, the rest GPTNeoXModel); tiny: CPU checks
    "bert": (30522, 768, 12, 12),
    "pythia": (50304, 768, 12, 12),
    "pythia-1.4b": (50304, 2048, 24, 16),
    "bert-tiny": (2048, 64, 2, 4),
    "pythia-tiny": (2048, 64, 2, 4),
}
VOCAB = {shape: dims[0] for shape, dims in SHAPES.items()}
NAMES = {"bert": "bert-base", "pythia": "pythia-160m"}  # as the tables print them; the rest by their own name
PASS, FAIL, NOT_RUN = "pass", "FAIL", "NOT RUN"
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
BUDGET_S = 540  # one --device cuda call, all parts
PART_CAPS = {"tests": 180, "compare": 120}  # seconds at most; the table and the checkpoints share what is left


@functools.cache  # read once: sample_size runs inside the timed extract calls
def sweep_settings(shape: str) -> dict:
    """The `extract` section of the shape's real sweep config."""
    import yaml

    return yaml.safe_load((ROOT / SWEEPS[sweep_of(shape)]["config"]).read_text())["extract"]


def sweep_of(shape: str) -> str:
    return "bert" if shape.startswith("bert") else "pythia"


def sample_size(shape: str, n_sequences: int, seq_len: int) -> int:
    """The hidden-state sample of the shape's sweep config, in proportion for fewer tokens than its
    evaluation set: what one mini-batch of the sweep contributes to it."""
    s = sweep_settings(shape)
    rate = s["sample_tokens"] / (s["n_sequences"] * s["seq_len"])
    return min(s["sample_tokens"], round(rate * n_sequences * seq_len))


def spawn(python: str, mode: str, timeout: float | None = None, **kw) -> dict:
    """A worker in a fresh process, without TRITON_INTERPRET (the kernels compiled, as a sweep runs them); raises
    RuntimeError where it fails, subprocess.TimeoutExpired (and kills it) where it runs past `timeout`."""
    cmd = [python, str(SCRIPT), mode]
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


def fmt_x(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def cell_text(text: str, width: int = 160) -> str:
    """One line of a message (its last: an exception's), fit for a Markdown cell."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:width].replace("|", "\\|")


def shape_name(shape: str) -> str:
    return NAMES.get(shape, shape)


def markdown_table(head: str, rows: list[str]) -> list[str]:
    """A Markdown table: its head ("| a | b |"), the line under it, and its rows, each one line already."""
    return [head, "|" + "---|" * (head.count("|") - 1), *rows]


def combine(verdicts) -> str:
    verdicts = list(verdicts)
    return FAIL if FAIL in verdicts else NOT_RUN if NOT_RUN in verdicts or not verdicts else PASS
