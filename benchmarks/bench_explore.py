"""The explorer page's memory, size and load time (run by hand, not by pytest).

    python benchmarks/bench_explore.py [--layout results/toy/toy-neox/sweep.parquet] [--steps 2,4] [--results results]
        [--repeats 3] [--skip-browser] [--skip-eager]

1. Memory: a simulated all-Pythia results folder (8 sizes, standard and deduped: 16 models), each checkpoint with
   the rows a real sweep holds: the layout of one checkpoint of `--layout` (a toy-neox sweep.parquet, the default
   sweep's; a checkpoint without the gradient analysis) scaled to each size, its rows over the blocks over each
   size's blocks, its heads over its heads, its per-head ranks (the circuits' singular values) over its d_head
   (pythia-160m: 26,188 rows a checkpoint, 1,316 of them drawn). At each of `--steps` checkpoints per model:
   `anisweep explore` in a fresh process, its peak resident memory (ru_maxrss) and CPU seconds, beside a fresh
   process that reads every sweep row eagerly (what the explorer did before it read lazily). From the last two
   sizes, the peak's slope per drawn row of the largest model (the explorer holds one model's drawn rows at a
   time), and the peak extrapolated to all of Pythia: 154 steps of each of the 16 models.
2. Load: the page of `--results` (default: the default sweep's results/) opened from disk in headless Chromium:
   the wall time until Plotly has drawn it and Chromium's CPU time, beside a page holding plotly.js alone, opened
   the same way (the baseline: on a loaded machine the ratio is what carries over); each page `--repeats` times in
   a fresh browser, the median reported beside the machine's load average; and the simulated folder's page.
Results go to benchmarks/out/explore.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from anisweep.checkpoints.hub import Pythia
from anisweep.explore.data import MAX_VALUES, drawn_rows, scan_sweeps, write_explore
from anisweep.explore.page import plotly_js

#: blocks, heads, d_head of each Pythia size from 70m (the catalogue's shapes, from each size's config.json).
PYTHIA = {
    size: (shape.n_layers, shape.n_heads, shape.d_model // shape.n_heads)
    for size, shape in Pythia.shapes.items()
    if size in Pythia.deduped_sizes
}
PUBLISHED_STEPS = 154
_GROUP = ("site", "measure", "metric", "subspace", "fit", "stratum")
_INDEX = ("layer", "head", "rank")
_IDENTITY = ("family", "model", "seed", "step", "tokens_seen")


def template(layout: Path) -> pl.DataFrame:
    """One checkpoint's rows of a real sweep: the first of the checkpoints with the most common row count (one
    without the gradient analysis)."""
    sweep = pl.read_parquet(layout)
    counts = sweep.group_by("step").len().sort("step")
    mode = counts["len"].mode().min()
    step = counts.filter(pl.col("len") == mode)["step"][0]
    return sweep.filter(pl.col("step") == step).drop(*_IDENTITY)


def scaled(one: pl.DataFrame, blocks: int, heads: int, d_head: int) -> pl.DataFrame:
    """`one` (a checkpoint's rows) for a model of `blocks` blocks, `heads` heads of `d_head`: a row group over the
    template's blocks (0..L-1, 1..L or 0..L) or at its last (L) runs over the new model's; over its heads, over
    the new heads; over the ranks 1..d_head, over the new d_head. Other indices (the gradient analysis' layers and
    rank) stay as they are."""
    last = one["layer"].max()
    old_heads = one["head"].max() + 1
    old_d_head = one.filter(pl.col("head").is_not_null())["rank"].max()
    layer_maps = {
        tuple(range(last)): range(blocks),
        tuple(range(1, last + 1)): range(1, blocks + 1),
        tuple(range(last + 1)): range(blocks + 1),
        (last,): (blocks,),
    }
    index_maps = {
        "layer": lambda values: layer_maps.get(values, values),
        "head": lambda values: range(heads) if values == tuple(range(old_heads)) else values,
        "rank": lambda values: range(1, d_head + 1) if values == tuple(range(1, old_d_head + 1)) else values,
    }
    flags = [pl.col(c).is_null().alias(f"{c}_null") for c in _INDEX]
    groups = []
    for _, rows in one.group_by(*_GROUP, *flags, maintain_order=True):
        values = {c: tuple(sorted(rows[c].unique().drop_nulls())) or (None,) for c in _INDEX}
        if len(rows) != np.prod([len(v) for v in values.values()]):
            raise ValueError(f"{rows.head(1).to_dicts()}: its group is not a whole grid of layers, heads and ranks")
        grid = pl.DataFrame({"_": [0]})
        for c in _INDEX:
            grid = grid.join(pl.DataFrame({c: list(index_maps[c](values[c]))}, schema={c: pl.Int64}), how="cross")
        groups.append(grid.drop("_").join(rows.drop(*_INDEX).head(1), how="cross"))
    return pl.concat(groups).select(one.columns)


def drawn(rows: pl.DataFrame) -> int:
    return drawn_rows(rows.with_columns(**{c: pl.lit(0) for c in _IDENTITY})).collect().height


def model_sweep(model: str, checkpoint: pl.DataFrame, steps: list[int], rng) -> pl.DataFrame:
    grid = pl.DataFrame({"step": steps}).join(checkpoint, how="cross")
    return grid.with_columns(
        family=pl.lit("pythia"),
        model=pl.lit(model),
        seed=pl.lit(None, pl.Int64),
        tokens_seen=pl.col("step") * 2_097_152,
        value=pl.Series(rng.random(grid.height)),
        status=pl.lit("ok"),
        weights_sha256=pl.format("{}", pl.col("step").hash()),
    ).select(*_IDENTITY, *checkpoint.columns)


def pythia_steps(n: int) -> list[int]:
    published = [0, *(2**i for i in range(10)), *range(1000, 143001, 1000)]  # 154
    extra = [s + 500 for s in range(1000, 143000, 1000)][: max(0, n - len(published))]
    return sorted(published + extra)[:n]


def simulated_results(root: Path, layouts: dict[str, pl.DataFrame], steps: int) -> dict:
    """A results folder of `steps` checkpoints for each Pythia model, standard and deduped; its rows."""
    rng = np.random.default_rng(0)
    rows = 0
    for suffix in ("", "-deduped"):
        for size, checkpoint in layouts.items():
            model = f"pythia-{size}{suffix}"
            path = root / "pythia" / model / "sweep.parquet"
            path.parent.mkdir(parents=True)
            sweep = model_sweep(model, checkpoint, pythia_steps(steps), rng)
            sweep.write_parquet(path)
            rows += sweep.height
    return {"checkpoints": 2 * len(layouts) * steps, "sweep_rows": rows}


_EAGER = (
    "import sys; from anisweep.explore.data import drawn_rows, scan_sweeps; "
    "sweeps = scan_sweeps(sys.argv[1:]).collect(); drawn_rows(sweeps).collect()"
)


#: Runs its arguments as a command and prints the command's resource usage: a small process's child, so that
#: ru_maxrss is the command's own peak (a child forked from a large process starts with that process's pages).
_RUNNER = (
    "import json, os, subprocess, sys; child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL); "
    "_, status, usage = os.wait4(child.pid, 0); "
    "print(json.dumps([os.waitstatus_to_exitcode(status), usage.ru_maxrss, usage.ru_utime + usage.ru_stime]))"
)


def fresh(command: list[str]) -> dict:
    """Peak resident memory (MB), CPU and wall seconds of `command` run in a fresh process."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _RUNNER, *command], capture_output=True, text=True, check=True)
    code, peak_kb, cpu = json.loads(done.stdout)
    if code:
        raise RuntimeError(f"{command} failed ({code}): {done.stderr[-2000:]}")
    return {"peak_mb": round(peak_kb / 1024), "cpu_s": round(cpu, 1), "wall_s": round(time.perf_counter() - start, 1)}


def chromium_load(page: Path) -> dict:
    """Wall seconds until the page opened from disk is drawn, and the CPU seconds Chromium's processes spent."""
    import psutil
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get("about:blank")
        browser = psutil.Process(driver.service.process.pid)

        def cpu() -> float:
            total = 0.0
            for process in [browser, *browser.children(recursive=True)]:
                try:
                    times = process.cpu_times()
                except psutil.NoSuchProcess:
                    continue
                total += times.user + times.system
            return total

        before = cpu()
        start = time.perf_counter()
        driver.get(page.as_uri())
        while not driver.execute_script("return window.exploreDrawnAt || window.plotlyLoadedAt || null"):
            time.sleep(0.02)
        wall = time.perf_counter() - start
        drawn_ms = driver.execute_script("return window.exploreDrawnAt || window.plotlyLoadedAt")
        spent = cpu() - before
    finally:
        driver.quit()
    return {"wall_s": round(wall, 3), "drawn_ms_after_navigation": round(drawn_ms), "chromium_cpu_s": round(spent, 3)}


def median_load(page: Path, repeats: int) -> dict:
    """chromium_load's figures, each the median of `repeats` loads."""
    loads = [chromium_load(page) for _ in range(repeats)]
    return {key: float(np.median([load[key] for load in loads])) for key in loads[0]}


def plotly_only(folder: Path) -> Path:
    page = folder / "plotly_only.html"
    page.write_text(
        f"<html><body><script>{plotly_js()}</script>"
        "<script>window.plotlyLoadedAt = performance.now();</script></body></html>"
    )
    return page


def projected(a: dict, b: dict, all_pythia: dict) -> dict:
    """The explorer's peak memory and CPU seconds on all of Pythia, from runs `a` and `b`: the rise of the peak from
    a to b put down either to the sweep rows (what is scanned) or to the largest model's drawn rows (what is held),
    the larger of the two projections kept; CPU seconds in proportion to the sweep rows."""
    rise = (b["explore"]["peak_mb"] - a["explore"]["peak_mb"]) * 2**20
    per_row = max(0.0, rise / (b["sweep_rows"] - a["sweep_rows"]))
    per_drawn = max(0.0, rise / (b["largest_model_drawn"] - a["largest_model_drawn"]))
    by_rows = b["explore"]["peak_mb"] + per_row * (all_pythia["rows"] - b["sweep_rows"]) / 2**20
    by_drawn = (
        b["explore"]["peak_mb"] + per_drawn * (all_pythia["largest_model_drawn"] - b["largest_model_drawn"]) / 2**20
    )
    out = {
        "peak_bytes_per_sweep_row": round(per_row, 1),
        "peak_bytes_per_largest_model_drawn_row": round(per_drawn),
        "peak_mb": round(max(by_rows, by_drawn)),
        "cpu_s": round(b["explore"]["cpu_s"] * all_pythia["rows"] / b["sweep_rows"]),
    }
    if "eager" in a and "eager" in b:  # every row held: its slope per sweep row
        eager = (b["eager"]["peak_mb"] - a["eager"]["peak_mb"]) * 2**20 / (b["sweep_rows"] - a["sweep_rows"])
        out |= {"eager_bytes_per_row": round(eager), "eager_gb": round(eager * all_pythia["rows"] / 1e9)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layout", default="results/toy/toy-neox/sweep.parquet", help="a real toy-neox sweep.parquet")
    parser.add_argument("--steps", default="2,4", help="checkpoints per model of each simulated folder")
    parser.add_argument("--results", default="results", help="the default sweep's results folder (for the load time)")
    parser.add_argument("--repeats", type=int, default=3, help="loads of each page (the median is reported)")
    parser.add_argument("--skip-browser", action="store_true")
    parser.add_argument("--skip-eager", action="store_true", help="leave out the eager reader's run")
    args = parser.parse_args()
    if not Path(args.layout).is_file():
        raise SystemExit(f"--layout {args.layout}: no such file; run the default sweep first, or name a toy-neox sweep")
    one = template(Path(args.layout))
    layouts = {size: scaled(one, *shape) for size, shape in PYTHIA.items()}
    per_checkpoint = {size: {"rows": len(rows), "drawn": drawn(rows)} for size, rows in layouts.items()}
    largest = max(n["drawn"] for n in per_checkpoint.values())
    drawn_per_step = 2 * sum(n["drawn"] for n in per_checkpoint.values())
    out: dict = {
        "layout": args.layout,
        "per_checkpoint": per_checkpoint,
        "all_pythia": {
            "checkpoints": 2 * len(PYTHIA) * PUBLISHED_STEPS,
            "rows": 2 * sum(n["rows"] for n in per_checkpoint.values()) * PUBLISHED_STEPS,
            "drawn": drawn_per_step * PUBLISHED_STEPS,
            "largest_model_drawn": largest * PUBLISHED_STEPS,
        },
        "runs": [],
    }
    print(json.dumps(out))
    with tempfile.TemporaryDirectory() as tmp:
        for steps in map(int, args.steps.split(",")):
            root = Path(tmp) / f"results{steps}"
            run = simulated_results(root, layouts, steps)
            # The page thinned in the proportion all of Pythia's is: the same two passes over each model.
            limit = max(1, round(MAX_VALUES * steps / PUBLISHED_STEPS))
            page = Path(tmp) / f"explore{steps}.html"
            command = [sys.executable, "-m", "anisweep", "explore", "--max-values", str(limit), "--out", str(page)]
            run |= {"drawn": drawn_per_step * steps, "largest_model_drawn": largest * steps, "max_values": limit}
            run["explore"] = fresh([*command, str(root)])
            run["page_mb"] = round(page.stat().st_size / 1e6, 2)
            if not args.skip_eager:
                run["eager"] = fresh([sys.executable, "-c", _EAGER, str(root)])
            out["runs"].append(run)
            print(json.dumps(run))
            shutil.rmtree(root)
        if len(out["runs"]) >= 2:
            out["all_pythia"] |= projected(*out["runs"][-2:], out["all_pythia"])
        if not args.skip_browser:
            default = Path(args.results)
            small = write_explore(scan_sweeps([default]), Path(tmp) / "default.html")
            out["default_page_mb"] = round(small.stat().st_size / 1e6, 2)
            out["load_average_before"] = os.getloadavg()[0]
            out["default_load"] = median_load(small, args.repeats)
            out["plotly_only_load"] = median_load(plotly_only(Path(tmp)), args.repeats)
            out["pythia_load"] = median_load(page, args.repeats)
            out["load_average_after"] = os.getloadavg()[0]
    print(json.dumps(out))
    target = Path(__file__).parent / "out" / "explore.json"
    target.parent.mkdir(exist_ok=True)
    target.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
