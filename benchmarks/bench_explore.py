"""The explorer page's size and load time (run by hand, not by pytest).

    python benchmarks/bench_explore.py [--results results] [--checkpoints 2609] [--repeats 3] [--skip-browser]

1. Size: a simulated results folder of the all-Pythia sweep (8 sizes, standard and deduped: 16 models, their layers
   as published, 2,609 checkpoints in all), each checkpoint with the per-layer rows a GPT-NeoX sweep writes (per
   layer: 46 metrics at resid, 11 at attention, 9 at each of ln_attn and ln_mlp, 13 at each of their inputs and
   outputs, 2 at qk_pre and qk_post; 40 at each of final_ln_in and final_ln_out, 10 at final_ln: the counts of a
   toy-neox sweep), and rows the page leaves out (one head per layer). Reports its rows, the values the page keeps,
   the steps per model it keeps and the page's size.
2. Load: the page of `--results` (default: the default sweep's results/) opened from disk in headless Chromium:
   the wall time until Plotly has drawn it and Chromium's CPU time, beside a page holding plotly.js alone, opened
   the same way (the baseline: on a loaded machine the ratio is what carries over); each page `--repeats` times in
   a fresh browser, the median reported beside the machine's load average.
Results go to benchmarks/out/explore.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from anisweep.explore.data import MAX_VALUES, explore_data, per_layer_rows, read_sweeps, write_explore
from anisweep.explore.page import plotly_js

PYTHIA_LAYERS = {"70m": 6, "160m": 12, "410m": 24, "1b": 16, "1.4b": 24, "2.8b": 32, "6.9b": 32, "12b": 36}
PER_LAYER = {"resid": 46, "attention": 11, "ln_attn": 9, "ln_mlp": 9, "qk_pre": 2, "qk_post": 2}
PER_LAYER |= {f"ln_{s}_{io}": 13 for s in ("attn", "mlp") for io in ("in", "out")}
FINAL = {"final_ln_in": 40, "final_ln_out": 40, "final_ln": 10}


def pythia_steps(n: int) -> list[int]:
    published = [0, *(2**i for i in range(10)), *range(1000, 143001, 1000)]  # 154
    extra = [s + 500 for s in range(1000, 143000, 1000)][: max(0, n - len(published))]
    return sorted(published + extra)[:n]


def model_sweep(model: str, n_layers: int, steps: list[int], rng) -> pl.DataFrame:
    layout = [
        (site, f"{site}_m{j}", layer)
        for site, k in PER_LAYER.items()
        for j in range(k)
        for layer in range(n_layers + (site == "resid"))
    ]
    layout += [(site, f"{site}_m{j}", n_layers) for site, k in FINAL.items() for j in range(k)]
    layout += [("attention", "entropy_mean", layer) for layer in range(n_layers)]  # a head's row, left out
    sites, metrics, layers = zip(*layout, strict=True)
    heads = [0 if m == "entropy_mean" else None for m in metrics]
    one = pl.DataFrame(
        {"layer": layers, "head": heads, "site": sites, "metric": metrics},
        schema_overrides={"head": pl.Int64, "layer": pl.Int64},
    )
    grid = pl.DataFrame({"step": steps}).join(one, how="cross")
    return grid.with_columns(
        family=pl.lit("pythia"),
        model=pl.lit(model),
        seed=pl.lit(None, pl.Int64),
        tokens_seen=pl.col("step") * 2_097_152,
        value=pl.Series(rng.random(grid.height)),
        status=pl.lit("ok"),
    )


def simulated_results(root: Path, checkpoints: int) -> int:
    models = [f"pythia-{size}{suffix}" for suffix in ("", "-deduped") for size in PYTHIA_LAYERS]
    per_model = [checkpoints // len(models) + (i < checkpoints % len(models)) for i in range(len(models))]
    rng = np.random.default_rng(0)
    for model, n in zip(models, per_model, strict=True):
        layers = PYTHIA_LAYERS[model.removeprefix("pythia-").removesuffix("-deduped")]
        path = root / "pythia" / model / "sweep.parquet"
        path.parent.mkdir(parents=True)
        model_sweep(model, layers, pythia_steps(n), rng).write_parquet(path)
    return sum(per_model)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default="results", help="the default sweep's results folder (for the load time)")
    parser.add_argument("--checkpoints", type=int, default=2609)
    parser.add_argument("--repeats", type=int, default=3, help="loads of each page (the median is reported)")
    parser.add_argument("--skip-browser", action="store_true")
    args = parser.parse_args()
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "results"
        out["checkpoints"] = simulated_results(root, args.checkpoints)
        start = time.perf_counter()
        sweeps = read_sweeps([root])
        rows = per_layer_rows(sweeps)
        data = explore_data(sweeps)
        page = write_explore(sweeps, Path(tmp) / "explore.html")
        out |= {
            "sweep_rows": sweeps.height,
            "per_layer_values": rows.height,
            "values_kept": len(data["values"]) * 3 // 4 // 4,
            "max_values": MAX_VALUES,
            "steps_kept_per_model": sorted({len(m["steps"]) for m in data["models"]}),
            "steps_per_model": sorted({m["all_steps"] for m in data["models"]}),
            "page_mb": round(page.stat().st_size / 1e6, 2),
            "build_s": round(time.perf_counter() - start, 1),
        }
        print(json.dumps(out))
        if not args.skip_browser:
            default = Path(args.results)
            small = write_explore(read_sweeps([default]), Path(tmp) / "default.html")
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
