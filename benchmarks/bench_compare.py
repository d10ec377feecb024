"""Benchmark the comparative jobs of a Pythia-160m-shaped sweep against its final step (run by hand, not by pytest).

    python benchmarks/bench_compare.py [--steps 154] [--timed 4] [--sample-tokens 6144] [--d-model 768] [--layers 13]
    python benchmarks/bench_compare.py --widths 512 768 1024 2048 [--sample-tokens 6144]

A 154-step grid (config/pythia.yaml's sample of 6,144 tokens per site, d_model 768, the embedding output and 12
blocks at `resid`) is simulated by writing `--distinct` checkpoint folders of random hidden.parquet (the folders of
the other steps are the same files under their own identity: a pair's cost does not depend on the numbers), then
`--timed` of its `final` pairs are run through the job's own command (`anisweep compare`, in a fresh process each,
as a job without the warm worker runs it: the import, both Parquet reads, CKA, SVCCA and PWCCA per layer); the
grid's 153 pairs cost 153 times their median. The parts of one pair are timed in process too: reading the two
tables, the cross-products, and each measure over the 13 layers. One BLAS thread (a job's, as Snakemake gives it
OMP_NUM_THREADS=1) unless the environment says otherwise. Results go to benchmarks/out/compare.json. No model is read.

`--widths`: the CPU-seconds of one layer of a pair at each width (both reads, the products, CKA, and SVCCA and PWCCA
with the eigen-decompositions they share), then a 154-step grid of each Pythia size against its final and previous
step (306 pairs) projected from them: n d^2 parts (reads, products, CKA) scaled by the width squared from the widest
measured, the decompositions by the width cubed, a job's start measured as an `anisweep compare` of a one-layer
pair at the narrowest width less that layer. Results go to benchmarks/out/compare_widths.json.
"""

from __future__ import annotations

import os

# one BLAS thread, as Snakemake runs a job of one thread (OMP_NUM_THREADS=1); before numpy is imported
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from anisweep.checkpoints.hub import Pythia  # noqa: E402
from anisweep.measures import compare  # noqa: E402

OUT = Path(__file__).resolve().parent / "out" / "compare.json"
WIDTHS_OUT = OUT.with_name("compare_widths.json")
#: Pythia's sizes: residual layers compared (the embedding output and every block) and d_model, from each model's
#: config.json on the Hub; extract's CPU-seconds per checkpoint (docs/hub.md: measured at 160m, scaled by
#: non-embedding parameters for the others).
EXTRACT_SECONDS = {"70m": 12, "160m": 54, "410m": 191, "1b": 508, "1.4b": 762, "2.8b": 1589, "6.9b": 4066, "12b": 7147}
PYTHIA = {
    f"pythia-{size}": (Pythia.shapes[size].n_layers + 1, Pythia.shapes[size].d_model, seconds)
    for size, seconds in EXTRACT_SECONDS.items()
}


def write_checkpoint(folder: Path, step: int, vectors: np.ndarray) -> None:
    """A checkpoint folder: extract.json and hidden.parquet of `vectors` (layers, n, d) at `resid`."""
    folder.mkdir(parents=True, exist_ok=True)
    ident = {"family": "pythia", "model": "pythia-160m", "seed": None, "step": step, "tokens_seen": step * 2097152}
    (folder / "extract.json").write_text(json.dumps({"checkpoint": ident}))
    layers, n, d = vectors.shape
    sample = np.random.default_rng(0).choice(64 * 512, size=n, replace=False)  # one sample at every step
    seq, position = np.divmod(np.sort(sample), 512)
    frames = [
        pl.DataFrame(
            {
                "family": "pythia",
                "model": "pythia-160m",
                "seed": pl.Series([None] * n, dtype=pl.Int64),
                "step": step,
                "tokens_seen": ident["tokens_seen"],
                "layer": layer,
                "site": "resid",
                "seq": seq,
                "position": position,
                "token_id": (seq * 7 + position) % 50000,
                "vector": pl.Series(vectors[layer]).cast(pl.List(pl.Float32)),
            }
        )
        for layer in range(layers)
    ]
    pl.concat(frames).write_parquet(folder / "hidden.parquet")


def grid(steps: int) -> list[int]:
    """Pythia's published steps: 0, 1, 2, 4, ..., 512, then 1000, 2000, ..., the first `steps` of them."""
    published = [0] + [2**i for i in range(10)] + list(range(1000, 143001, 1000))
    return published[:steps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=154)
    parser.add_argument("--timed", type=int, default=4, help="pairs run as jobs and timed")
    parser.add_argument("--distinct", type=int, default=3, help="checkpoint folders with their own random numbers")
    parser.add_argument("--sample-tokens", type=int, default=6144)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--layers", type=int, default=13)
    parser.add_argument("--widths", type=int, nargs="+", help="time one layer at each width and project Pythia's grids")
    parser.add_argument("--repeat", type=int, default=2, help="--widths: each part's least of this many runs")
    args = parser.parse_args()
    if args.widths:
        return widths(sorted(args.widths), args.sample_tokens, args.repeat)
    rng = np.random.default_rng(0)
    steps = grid(args.steps)
    shape = (args.layers, args.sample_tokens, args.d_model)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        drift = rng.normal(size=args.d_model) * 3
        for i, step in enumerate([*steps[: args.distinct - 1], steps[-1]]):
            write_checkpoint(root / f"step{step}", step, rng.normal(size=shape) + drift * i)
        final = root / f"step{steps[-1]}"
        job_seconds, job_cpu_seconds = [], []
        for i in range(args.timed):
            step = steps[i % (args.distinct - 1)]
            out = root / f"pair{i}.parquet"
            command = [sys.executable, "-m", "anisweep", "compare", "--extract-dir", str(root / f"step{step}")]
            command += ["--ref-dir", str(final), "--out", str(out)]
            started = time.perf_counter()
            job_cpu_seconds.append(job_cpu(command))
            job_seconds.append(time.perf_counter() - started)
        parts = time_parts(root / f"step{steps[0]}", final)
        mib = (root / f"step{steps[0]}" / "hidden.parquet").stat().st_size / 2**20
    per_job = statistics.median(job_seconds)
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "blas_threads": os.environ["OMP_NUM_THREADS"],
        "grid": {"steps": len(steps), "pairs_against_final": len(steps) - 1, "shape_per_checkpoint": list(shape)},
        "hidden_parquet_mib": round(mib, 1),
        "job_seconds": [round(s, 2) for s in job_seconds],
        "job_seconds_median": round(per_job, 2),
        "job_cpu_seconds": [round(s, 2) for s in job_cpu_seconds],
        "grid_job_seconds": round(per_job * (len(steps) - 1), 1),
        "parts_seconds": {k: round(v, 3) for k, v in parts.items()},
    }
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def time_parts(folder: Path, final: Path) -> dict[str, float]:
    """One pair's parts in this process, each summed over the layers: both reads, the d x d cross-products (and the
    two eigen-decompositions SVCCA and PWCCA share), then each measure from them."""
    started = time.perf_counter()
    a, b = (compare.Checkpoint.read(f, ["resid"]) for f in (folder, final))
    parts = dict.fromkeys(("read_both", "cross_products", "eigh", "cka", "svcca", "pwcca"), 0.0)
    parts["read_both"] = time.perf_counter() - started
    measures = {
        "cka": lambda p: compare.cka_of(p, False),
        "svcca": lambda p: compare.svcca_of(p, 0.99),
        "pwcca": compare.pwcca_of,
    }
    for key in compare.check_same_sample(a, b):
        started = time.perf_counter()
        products = compare.CrossProducts.of(a.vectors[key], b.vectors[key])
        parts["cross_products"] += time.perf_counter() - started
        started = time.perf_counter()
        products.principal_x, products.principal_y  # noqa: B018 - computed once, shared by SVCCA and PWCCA
        parts["eigh"] += time.perf_counter() - started
        for name, measure in measures.items():
            started = time.perf_counter()
            measure(products)
            parts[name] += time.perf_counter() - started
    return parts


def cpu(function) -> tuple[float, object]:
    started = time.process_time()
    found = function()
    return time.process_time() - started, found


def layer_parts(root: Path, n: int, d: int, repeat: int) -> dict[str, float]:
    """CPU-seconds of one (layer, site) of a pair at width d, each part's least of `repeat` runs (the machine's
    load only adds): both reads, the products, CKA, and SVCCA and PWCCA with the two eigen-decompositions they
    share."""
    rng = np.random.default_rng(d)
    x = rng.normal(size=(n, d))
    y = x @ rng.normal(size=(d, d)) / np.sqrt(d) + rng.normal(size=(n, d))
    for step, vectors in ((0, x), (1, y)):
        write_checkpoint(root / f"w{d}.step{step}", step, vectors[None].astype(np.float32))
    folders = [root / f"w{d}.step{step}" for step in (0, 1)]
    runs = [layer_run(folders) for _ in range(repeat)]
    return {part: min(run[part] for run in runs) for part in runs[0]}


def layer_run(folders: list[Path]) -> dict[str, float]:
    parts = {}
    parts["read_both"], (a, b) = cpu(lambda: [compare.Checkpoint.read(folder, ["resid"]) for folder in folders])
    x, y = a.vectors[(0, "resid")], b.vectors[(0, "resid")]
    parts["products"], products = cpu(lambda: compare.CrossProducts.of(x, y))
    parts["cka"], _ = cpu(lambda: compare.cka_of(products, False))
    parts["eigh"], _ = cpu(lambda: (products.principal_x, products.principal_y))
    parts["svcca"], _ = cpu(lambda: compare.svcca_of(products, 0.99))
    parts["pwcca"], _ = cpu(lambda: compare.pwcca_of(products))
    return parts


def job_cpu(command: list[str]) -> float:
    """CPU-seconds of a command run as a child process (user and system, its threads included)."""
    before = os.times()
    subprocess.run(command, check=True)
    after = os.times()
    return after.children_user + after.children_system - before.children_user - before.children_system


def job_start(root: Path, d: int, repeat: int) -> float:
    """CPU-seconds of an `anisweep compare` job of the one-layer pair at width d, the least of `repeat`."""
    command = [sys.executable, "-m", "anisweep", "compare", "--extract-dir", str(root / f"w{d}.step0")]
    command += ["--ref-dir", str(root / f"w{d}.step1"), "--out", str(root / "pair.parquet")]
    return min(job_cpu(command) for _ in range(repeat))


def widths(measured: list[int], n: int, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        per_layer = {d: layer_parts(root, n, d, repeat) for d in measured}
        start = job_start(root, measured[0], repeat) - sum(per_layer[measured[0]].values())
    widest = measured[-1]
    squared, cubed = ("read_both", "products", "cka"), ("eigh", "svcca", "pwcca")

    def layer_seconds(d: int, parts: tuple[str, ...]) -> float:
        if d in per_layer:
            return sum(per_layer[d][p] for p in parts)
        return sum(per_layer[widest][p] * (d / widest) ** (2 if p in squared else 3) for p in parts)

    pairs = 2 * 153  # each of 154 steps against the final step and the previous one
    grids = {}
    for model, (layers, d, extract) in PYTHIA.items():
        cka = start + layers * layer_seconds(d, squared)
        every = cka + layers * layer_seconds(d, cubed)
        grids[model] = {
            "layers": layers,
            "d_model": d,
            "pair_cpu_s_cka": round(cka, 1),
            "pair_cpu_s_every_measure": round(every, 1),
            "grid_cpu_s_cka": round(pairs * cka),
            "grid_cpu_s_every_measure": round(pairs * every),
            "extract_grid_cpu_s": 154 * extract,
            "measured": d in per_layer,
        }
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "load_average": os.getloadavg(),
        "blas_threads": os.environ["OMP_NUM_THREADS"],
        "sample_tokens": n,
        "repeat": repeat,
        "job_start_cpu_s": round(start, 2),
        "layer_cpu_s": {d: {k: round(v, 3) for k, v in parts.items()} for d, parts in per_layer.items()},
        "pythia_grid_154_steps_final_and_previous": grids,
    }
    WIDTHS_OUT.parent.mkdir(exist_ok=True)
    WIDTHS_OUT.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
