"""The Multi-Bootstrap's cost beside extract's: a MultiBERTs group of 5 seeds x 29 steps at B = 1,000 (run by hand).

    python benchmarks/bench_bootstrap.py [--samples 2 4] [--repeat 3] [--out benchmarks/out/bootstrap.json]
    python benchmarks/bench_bootstrap.py --settings multiberts   # config/multiberts.yaml's extract settings
    python benchmarks/bench_bootstrap.py summary [--out ...]       # the table again from --out's measurements
    python benchmarks/bench_bootstrap.py --quick        # tiny shapes, seconds: checks the code (tests run it)

One step of the group, on synthetic but correctly shaped inputs: 5 seeds' hidden.parquet and extract.json as a
bert-base checkpoint's extract writes them (and metrics.parquet's rows of them, as its metrics job) at the schema's
default extract settings (n_sequences 64, seq_len 128, sample_tokens 4096; d_model 768, 15 sampled sites: the
residual stream at 13 layers and the final LayerNorm's input and output), each seed's vectors Gaussian around a mean
with a decaying spectrum. `anisweep.measures.sample_bootstrap.bootstrap_table` of that step (IsoScore and RankMe,
the config's default measures) runs in a fresh process with one BLAS thread, as a Snakemake job of one thread runs
it, at two values of B, each --repeat times: the two medians give the fixed cost (reading hidden.parquet and
metrics.parquet) and the cost per replicate, which a third B could check; the step at B = 1,000 is projected from
them. Extract of one bert-base checkpoint (random weights, no download) at the same settings runs in a fresh process
with the extract job's threads (resources.extract_threads, 2): loading the saved model, the run with every
statistic, its tables. The group: 29 bootstrap steps against 5 x 29 extracts, in job-seconds (wall seconds of each
job) and core-seconds (x the job's threads). `profile`: where one step's time goes (cProfile at the smaller B).
IsoScore's replicates are products computed once per site (anisweep.measures.unit_products), RankMe's an
eigendecomposition each. Results: printed, and written to --out (JSON) and a Markdown table beside it (.md).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
MARK = "BENCH_RESULT "
#: the schema's default extract settings and bert-base's shape; quick: tiny ones that run in seconds
FULL = {
    "shape": "bert",
    "d": 768,
    "layers": 12,
    "n_sequences": 64,
    "seq_len": 128,
    "batch_size": 8,
    "sample_tokens": 4096,
    "seeds": 5,
    "steps": 29,
}
#: config/multiberts.yaml's extract settings (the real sweep's: 128 sequences of 512, 8,192 sampled tokens)
MULTIBERTS = {**FULL, "n_sequences": 128, "seq_len": 512, "sample_tokens": 8192}
QUICK = {**FULL, "shape": "bert-tiny", "d": 64, "layers": 2, "n_sequences": 8, "seq_len": 64, "sample_tokens": 128}
GOAL_SHARE = 0.05
TARGET_SAMPLES = 1000
EXTRACT_THREADS = 2
MEASURES = ("isoscore", "rankme")


# --------------------------------------------------------------------------------------- synthetic inputs


def sampled_sites(shape: dict) -> list[tuple[int, str]]:
    """The (layer, site)s extract samples for hidden.parquet: the residual stream after the embeddings and after
    each block, and the final LayerNorm's input and output at the last layer (recorder.SAMPLED_SITES)."""
    layers = shape["layers"]
    return [(layer, "resid") for layer in range(layers + 1)] + [(layers, "final_ln_in"), (layers, "final_ln_out")]


def write_inputs(root: Path, shape: dict, seed: int = 0) -> list[Path]:
    """Each seed's checkpoint folder at one step: hidden.parquet (the same sampled tokens for every seed) and
    extract.json, as extract writes them."""
    import polars as pl

    from anisweep.tables import EXTRACT_SCHEMAS, with_identity

    rng = np.random.default_rng(seed)
    n, d, tokens = shape["n_sequences"], shape["d"], shape["sample_tokens"]
    picked = np.sort(rng.choice(n * shape["seq_len"], size=tokens, replace=False))
    seq, position = picked // shape["seq_len"], picked % shape["seq_len"]
    token_id = rng.integers(1000, 30000, size=tokens)
    scales = np.arange(1, d + 1) ** -0.5  # a decaying spectrum: anisotropic, as trained models' are
    folders = []
    for s in range(shape["seeds"]):
        folder = root / f"seed_{s}" / "step20000"
        folder.mkdir(parents=True)
        frames = []
        for layer, site in sampled_sites(shape):
            rotation = np.linalg.qr(rng.standard_normal((d, d)))[0]
            x = rng.standard_normal((tokens, d)) * scales @ rotation + rng.standard_normal(d) * 0.3
            frames.append(
                pl.DataFrame(
                    {
                        "layer": np.full(tokens, layer),
                        "site": [site] * tokens,
                        "seq": seq,
                        "position": position,
                        "token_id": token_id,
                        "vector": pl.Series(x.astype(np.float32)).cast(pl.List(pl.Float32)),
                    },
                    schema=EXTRACT_SCHEMAS["hidden"],
                )
            )
        ident = {"family": "multiberts", "model": f"seed_{s}", "seed": s, "step": 20000, "tokens_seen": 20000 * 131072}
        hidden = with_identity(pl.concat(frames), ident)
        hidden.write_parquet(folder / "hidden.parquet")
        write_metrics(folder, hidden, ident)
        settings = {k: shape[k] for k in ("n_sequences", "seq_len", "batch_size", "sample_tokens")}
        (folder / "extract.json").write_text(json.dumps({"settings": settings}))
        folders.append(folder)
    return folders


def write_metrics(folder: Path, hidden, ident: dict) -> None:
    """metrics.parquet's rows of the sampled vectors, as the metrics job writes them: the bootstrap's estimates."""
    import polars as pl

    from anisweep.measures import metrics
    from anisweep.tables import metric_rows

    frames = [
        metric_rows(ident, metrics.sample_rows(hidden), "sample_geometry"),
        metric_rows(ident, metrics.spectral_rows(hidden), "spectral_shape"),
    ]
    pl.concat(frames).write_parquet(folder / "metrics.parquet")


# --------------------------------------------------------------------------------------- workers (fresh processes)


def max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_s() -> float:
    """This process's CPU seconds (user + system, all its threads): on a shared machine, less moved by the other
    work than the wall time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def bootstrap_worker(a) -> dict:
    from anisweep.measures.sample_bootstrap import Settings, bootstrap_table

    before, cpu_before = max_rss_mb(), cpu_s()
    started = time.perf_counter()
    table = bootstrap_table([[f] for f in a.folders], Settings(samples=a.samples, measures=MEASURES), group="bench")
    seconds = time.perf_counter() - started
    return {
        "cpu_s": cpu_s() - cpu_before,
        "samples": a.samples,
        "seconds": seconds,
        "rows": table.height,
        "rss_before_mb": before,
        "peak_mb": max_rss_mb(),
    }


def profile_worker(a) -> dict:
    from anisweep.measures.sample_bootstrap import Settings, bootstrap_table, read_checkpoint

    started = time.perf_counter()
    for folder in a.folders:
        read_checkpoint(folder, MEASURES)
    read_s = time.perf_counter() - started
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    bootstrap_table([[f] for f in a.folders], Settings(samples=a.samples, measures=MEASURES), group="bench")
    profiler.disable()
    total = time.perf_counter() - started
    stats = pstats.Stats(profiler).stats
    wanted = {  # (file's ending, function) -> the row's name
        ("linalg/_linalg.py", "eigvalsh"): "np.linalg.eigvalsh (d x d, per replicate, seed and measure)",
        ("sample_bootstrap.py", "<listcomp>"): "a replicate's Gram matrix from its weighted vectors",
        ("sample_bootstrap.py", "moments"): "SiteSample.moments (all of it: weights, sums, Gram)",
        ("sample_bootstrap.py", "read_checkpoint"): "read_checkpoint (hidden.parquet, metrics.parquet's values)",
        ("sample_bootstrap.py", "metric_values"): "  of which metrics.parquet's values",
        ("spectral.py", "rankme"): "spectral.rankme of each replicate's singular values",
        ("geometry.py", "isoscore_of_variances"): "geometry.isoscore_of_variances",
    }
    parts = {}
    for (file, _, name), (_, _, tottime, cumtime, _) in stats.items():
        for (ending, function), label in wanted.items():
            if file.endswith(ending) and name == function:
                key = "cum" if function in ("moments", "read_checkpoint", "metric_values") else "tot"
                parts[label] = parts.get(label, 0.0) + (cumtime if key == "cum" else tottime)
    return {"samples": a.samples, "total_s": total, "read_s": read_s, "parts": parts}


def extract_worker(a) -> dict:
    """One checkpoint of the shape at the benchmark's extract settings: load the saved model, run, tables."""
    import torch

    sys.path.insert(0, str(HERE.parent))
    from bench_extract_parts.models import hf_model, make_batch

    from anisweep.extract import tables as extract_tables
    from anisweep.extract.model import ExtractSettings, load_model
    from anisweep.extract.run import run

    torch.set_num_threads(a.threads)
    settings = ExtractSettings(
        n_sequences=a.n_sequences, seq_len=a.seq_len, batch_size=a.batch_size, sample_tokens=a.sample_tokens,
        device="cpu", threads=a.threads,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        hf_model(a.shape).save_pretrained(tmp)
        cpu_before = cpu_s()
        started = time.perf_counter()
        parts = load_model(tmp, settings.dtype, torch.device("cpu"))
        load_s = time.perf_counter() - started
        batch = make_batch(a.shape, settings.n_sequences, settings.seq_len)
        started = time.perf_counter()
        recorder = run(parts, batch, settings, progress=False)
        run_s = time.perf_counter() - started
        started = time.perf_counter()
        extract_tables.tables(
            recorder, parts, {"family": "bench", "model": a.shape, "seed": 0, "step": 0, "tokens_seen": 0}
        )
        tables_s = time.perf_counter() - started
        used = cpu_s() - cpu_before
    sites = sorted({key for key in recorder.samples})
    return {
        "load_s": load_s,
        "run_s": run_s,
        "tables_s": tables_s,
        "seconds": load_s + run_s + tables_s,
        "cpu_s": used,
        "sampled_sites": len(sites),
        "peak_mb": max_rss_mb(),
    }


WORKERS = {
    "bootstrap": bootstrap_worker,
    "profile": profile_worker,
    "extract": extract_worker,
}


def spawn(mode: str, threads: int, **kw) -> dict:
    cmd = [sys.executable, str(HERE), mode, "--threads", str(threads)]
    for key, value in kw.items():
        cmd += [f"--{key.replace('_', '-')}", *map(str, value if isinstance(value, list) else [value])]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    env |= dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), str(threads))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} worker failed:\n{done.stderr[-3000:]}")
    # the machine's 1-minute load average as the worker ends: a shared machine's other work slows every figure
    return json.loads(done.stdout.split(MARK, 1)[1].splitlines()[0]) | {"load": os.getloadavg()[0]}


# --------------------------------------------------------------------------------------- the driver


def fit(runs: dict[int, list[float]]) -> tuple[float, float]:
    """(fixed seconds, seconds per replicate) through the medians at the two smallest Bs."""
    (b1, t1), (b2, t2) = sorted((b, statistics.median(t)) for b, t in runs.items())[:2]
    per = (t2 - t1) / (b2 - b1)
    return t1 - per * b1, per


def project(result: dict, key: str = "seconds") -> dict:
    """The group projected from the medians of `key`: "seconds" (wall) or "cpu_s" (the worker's CPU seconds, of
    the runs that measured them)."""
    shape, boot, extract = result["shape"], result["bootstrap"], result["extract"]
    fixed, per = fit({int(b): [r[key] for r in rs if key in r] for b, rs in boot.items()})
    step_s = fixed + per * TARGET_SAMPLES
    extract_s = statistics.median(r[key] for r in extract if key in r)
    group_boot = shape["steps"] * step_s  # one job, one thread
    group_extract = shape["seeds"] * shape["steps"] * extract_s  # a job per checkpoint
    threads = 1 if key == "cpu_s" else result.get("extract_threads", EXTRACT_THREADS)  # CPU-s: all threads already
    return {
        "fixed_s": fixed,
        "per_replicate_s": per,
        "step_s_at_target": step_s,
        "extract_s": extract_s,
        "group_bootstrap_job_s": group_boot,
        "group_extract_job_s": group_extract,
        "share_job_s": group_boot / group_extract,
        "share_core_s": group_boot / (group_extract * threads),
        "peak_mb": max(r["peak_mb"] for rs in boot.values() for r in rs),
        "goal_share": GOAL_SHARE,
        "replicates_within_goal": max(0.0, (GOAL_SHARE * group_extract * threads / shape["steps"] - fixed) / per),
    }


def markdown(result: dict) -> str:
    s, p = result["shape"], result["projection"]
    boot, threads = result["bootstrap"], result.get("extract_threads", EXTRACT_THREADS)
    spread = "; ".join(
        f"B = {b}: " + ", ".join(f"{r['seconds']:.1f}" for r in rs) + " s"
        for b, rs in sorted(boot.items(), key=lambda kv: int(kv[0]))
    )
    ext = ", ".join(f"{r['seconds']:.1f}" for r in result["extract"])
    cpu = result.get("projection_cpu")
    by_cpu = (
        f"| the same from CPU seconds (less moved by a busy machine) | | fixed {cpu['fixed_s']:.1f} s + "
        f"{cpu['per_replicate_s']:.2f} s a replicate; extract {cpu['extract_s']:.1f} CPU-s; the group's bootstrap "
        f"{cpu['share_core_s']:.1%} of the extracts' CPU-seconds |"
        if cpu
        else None
    )
    if result.get("parallel", 1) > 1:  # workers side by side: their wall times say nothing of a job's
        wall_rows = [
            f"| wall times | not comparable: {result['parallel']} workers ran at once on a shared machine | see the "
            "CPU seconds |"
        ]
    else:
        wall_rows = None
    lines = [
        f"Settings: {s['n_sequences']} x {s['seq_len']} tokens, {s['sample_tokens']} sampled, d_model {s['d']}, "
        f"{len(sampled_sites(s))} sampled sites, {s['seeds']} seeds x {s['steps']} steps, "
        f"measures {', '.join(MEASURES)}.",
        "",
        "| what | measured | projected |",
        "|---|---|---|",
        f"| bootstrap of one step of {s['seeds']} seeds, 1 thread | {spread} | fixed {p['fixed_s']:.1f} s + "
        f"{p['per_replicate_s']:.2f} s a replicate: {p['step_s_at_target']:.0f} s at B = {TARGET_SAMPLES} |",
        f"| its peak memory | {p['peak_mb']:.0f} MB | the same at any B and step count (one step read at a time) |",
        f"| extract of one checkpoint, {threads} threads | {ext} s | |",
        f"| the group: bootstrap job | | {p['group_bootstrap_job_s'] / 3600:.1f} h "
        f"({p['group_bootstrap_job_s']:.0f} job-s) |",
        f"| the group: {s['seeds'] * s['steps']} extract jobs | | {p['group_extract_job_s'] / 3600:.2f} h "
        f"({p['group_extract_job_s']:.0f} job-s, {p['group_extract_job_s'] * threads:.0f} core-s) |",
        f"| bootstrap / extract | | {p['share_job_s']:.1%} of the job-seconds, {p['share_core_s']:.1%} of the "
        f"core-seconds (goal {GOAL_SHARE:.0%}: B <= {p['replicates_within_goal']:.0f} at this path's cost) |",
        *([by_cpu] if by_cpu else []),
    ]
    if wall_rows and cpu:  # the CPU seconds of each run and their projection, no wall projection
        cpu_spread = "; ".join(
            f"B = {b}: " + ", ".join(f"{r['cpu_s']:.1f}" for r in rs if "cpu_s" in r) + " CPU-s"
            for b, rs in sorted(boot.items(), key=lambda kv: int(kv[0]))
        )
        ext_cpu = ", ".join(f"{r['cpu_s']:.1f}" for r in result["extract"] if "cpu_s" in r)
        steps, seeds = s["steps"], s["seeds"]
        lines = [
            *lines[:4],
            f"| bootstrap of one step of {seeds} seeds, 1 thread | {cpu_spread} | fixed {cpu['fixed_s']:.1f} + "
            f"{cpu['per_replicate_s']:.2f} CPU-s a replicate: {cpu['step_s_at_target']:.0f} CPU-s at B = "
            f"{TARGET_SAMPLES} |",
            lines[5],
            f"| extract of one checkpoint, {threads} thread(s) | {ext_cpu} CPU-s | |",
            f"| the group: bootstrap job | | {cpu['group_bootstrap_job_s'] / 3600:.1f} CPU-h |",
            f"| the group: {seeds * steps} extract jobs | | {cpu['group_extract_job_s'] / 3600:.2f} CPU-h |",
            f"| bootstrap / extract | | {cpu['share_core_s']:.0%} of the CPU-seconds (goal {GOAL_SHARE:.0%}) |",
            *wall_rows,
        ]
    return "\n".join(lines) + "\n"


def with_projections(result: dict) -> dict:
    result["projection"] = project(result)
    has_cpu = all(any("cpu_s" in r for r in rs) for rs in result["bootstrap"].values())
    if has_cpu and any("cpu_s" in r for r in result["extract"]) and len(result["bootstrap"]) >= 2:
        result["projection_cpu"] = project(result, "cpu_s")
    result["markdown"] = markdown(result)
    return result


def drive(a) -> dict:
    shape = QUICK if a.quick else {"schema": FULL, "multiberts": MULTIBERTS}[a.settings]
    shape = {**shape, "seeds": a.seeds or shape["seeds"]}
    samples = a.samples or ([20, 60] if a.quick else [2, 4])
    repeat = a.repeat or (1 if a.quick else 3)
    threads = a.extract_threads
    result = {"shape": shape, "repeat": repeat, "extract_threads": threads, "bootstrap": {}, "extract": []}
    with tempfile.TemporaryDirectory() as tmp:
        folders = sorted(str(f.parent) for f in Path(a.inputs).glob("seed_*/step*/hidden.parquet")) if a.inputs else []
        if len(folders) != shape["seeds"]:
            started = time.perf_counter()
            folders = [str(f) for f in write_inputs(Path(a.inputs or tmp), shape)]
            print(f"inputs written in {time.perf_counter() - started:.1f} s", flush=True)
        jobs = []  # (where the result goes, mode, threads, options); interleaved by repetition
        for _ in range(repeat):
            for b in samples:
                jobs.append((("bootstrap", str(b)), "bootstrap", 1, {"folders": folders, "samples": b}))
            extract = {k: shape[k] for k in ("shape", "n_sequences", "seq_len", "batch_size", "sample_tokens")}
            jobs.append((("extract",), "extract", threads, extract))
        if not a.no_profile:
            jobs.append((("profile",), "profile", 1, {"folders": folders, "samples": min(samples)}))
        with ThreadPoolExecutor(a.parallel) as pool:  # --parallel > 1: CPU seconds still hold, wall time does not
            rows = list(pool.map(lambda job: (job[0], spawn(job[1], job[2], **job[3])), jobs))
        for where, row in rows:
            if where[0] == "bootstrap":
                result["bootstrap"].setdefault(where[1], []).append(row)
            elif where[0] == "extract":
                result["extract"].append(row)
            else:
                result[where[0]] = row
            if "seconds" in row:
                cpu = row.get("cpu_s", 0.0)
                print(f"{' '.join(where)}: {row['seconds']:.1f} s, {cpu:.1f} CPU-s, load {row['load']:.1f}")
    result["parallel"] = a.parallel
    with_projections(result)
    print(result["markdown"])
    print(json.dumps({k: result[k] for k in ("projection", "projection_cpu", "profile") if k in result}, indent=1))
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="drive", choices=["drive", "summary", *WORKERS])
    ap.add_argument("--quick", action="store_true", help="tiny shapes (seconds): checks the code")
    ap.add_argument("--samples", type=int, nargs="+", help="the Bs measured (default 2 4; quick 20 60)")
    ap.add_argument("--repeat", type=int, help="repetitions of each measurement (default 3; quick 1)")
    ap.add_argument(
        "--settings",
        choices=["schema", "multiberts"],
        default="schema",
        help="extract settings: the schema's defaults, or config/multiberts.yaml's",
    )
    ap.add_argument("--seeds", type=int, help="seeds of the group (default 5)")
    ap.add_argument("--no-profile", action="store_true", help="leave out the profile")
    ap.add_argument("--inputs", help="a folder for the synthetic inputs, kept and reused (default: a temporary one)")
    ap.add_argument("--parallel", type=int, default=1, help="workers at once (wall times then mean little)")
    ap.add_argument("--extract-threads", type=int, default=EXTRACT_THREADS, help="extract's threads (the job's: 2)")
    ap.add_argument("--out", help="default benchmarks/out/bootstrap.json (quick: bootstrap_quick.json)")
    # worker options
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--folders", nargs="+")
    ap.add_argument("--shape")
    for name in ("n-sequences", "seq-len", "batch-size", "sample-tokens"):
        ap.add_argument(f"--{name}", type=int)
    a = ap.parse_args(argv)
    if a.mode in WORKERS:
        a.samples = a.samples[0] if a.samples else None
        print(MARK + json.dumps(WORKERS[a.mode](a)), flush=True)
        return None
    name = "bootstrap_quick" if a.quick else "bootstrap" if a.settings == "schema" else f"bootstrap_{a.settings}"
    out = Path(a.out or HERE.parent / "out" / f"{name}.json")
    if a.mode == "summary":  # the projections and the table again, from --out's measurements
        result = with_projections(json.loads(out.read_text()))
        print(result["markdown"])
    else:
        result = drive(a)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(result["markdown"])
    return result


if __name__ == "__main__":
    main()
