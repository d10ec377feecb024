"""The call: each part of --parts in order, within --budget, into --out (JSON, the rest of it kept) and a Markdown
file beside it (summary)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from . import checkpoint, flat, outliers, ratios, units
from .checkpoint import checkpoint_row
from .compare import comparison, comparison_summary
from .core import markdown_table
from .device import device_name, device_row, device_summary
from .flat import flat_rows
from .goal import goal_lines, goal_summary
from .kernel_tests import kernel_tests, kernel_tests_summary
from .outliers import outlier_cost
from .ratios import ratio_rows
from .units import units_cost


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
    if "units" in a.parts:
        out["units_cost"] = [units_cost(a, shape, t) for shape in a.shapes for t in a.seq_lens]
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


def summary(out: dict) -> str:
    """The Markdown of every part in `out`: the goal, then each part's table."""
    lines = goal_summary(out["goal"], out.get("call")) if out.get("goal") else []
    if out.get("device_rows"):
        lines += [
            "",
            f"### The device table ({device_name(out['device_rows'])})",
            "",
            *device_summary(out["device_rows"]),
        ]
    for key, part_summary in (("comparison", comparison_summary), ("kernel_tests", kernel_tests_summary)):
        if out.get(key):
            lines += ["", *part_summary(out[key])]
    for key, part in (
        ("rows", ratios),
        ("flat", flat),
        ("outlier_cost", outliers),
        ("units_cost", units),
        ("checkpoint", checkpoint),
    ):
        if out.get(key):
            lines += ["", *markdown_table(part.TABLE_HEAD, [part.table_line(row) for row in out[key]])]
    return "\n".join(lines).strip("\n")
