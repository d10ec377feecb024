"""Benchmark the comparative jobs of a Pythia-160m-shaped sweep against its final step (run by hand, not by pytest).

    python benchmarks/bench_compare.py [--steps 154] [--timed 4] [--sample-tokens 6144] [--d-model 768] [--layers 13]

A 154-step grid (config/pythia.yaml's sample of 6,144 tokens per site, d_model 768, the embedding output and 12
blocks at `resid`) is simulated by writing `--distinct` checkpoint folders of random hidden.parquet (the folders of
the other steps are the same files under their own identity: a pair's cost does not depend on the numbers), then
`--timed` of its `final` pairs are run through the job's own command (`anisweep compare`, in a fresh process each,
as a job without the warm worker runs it: the import, both Parquet reads, CKA, SVCCA and PWCCA per layer); the
grid's 153 pairs cost 153 times their median. The parts of one pair are timed in process too: reading the two
tables, the cross-products, and each measure over the 13 layers. One BLAS thread (a job's, as Snakemake gives it
OMP_NUM_THREADS=1) unless the environment says otherwise. Results go to benchmarks/out/compare.json. No model is read.
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

from anisweep.measures import compare  # noqa: E402

OUT = Path(__file__).resolve().parent / "out" / "compare.json"


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
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    steps = grid(args.steps)
    shape = (args.layers, args.sample_tokens, args.d_model)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        drift = rng.normal(size=args.d_model) * 3
        for i, step in enumerate([*steps[: args.distinct - 1], steps[-1]]):
            write_checkpoint(root / f"step{step}", step, rng.normal(size=shape) + drift * i)
        final = root / f"step{steps[-1]}"
        job_seconds = []
        for i in range(args.timed):
            step = steps[i % (args.distinct - 1)]
            out = root / f"pair{i}.parquet"
            command = [sys.executable, "-m", "anisweep", "compare", "--extract-dir", str(root / f"step{step}")]
            command += ["--ref-dir", str(final), "--out", str(out)]
            started = time.perf_counter()
            subprocess.run(command, check=True)
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


if __name__ == "__main__":
    main()
