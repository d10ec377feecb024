"""What planning a large sweep costs: `snakemake -n` on configs naming whole published grids.

    python benchmarks/bench_planning.py [--sizes 500 1000 5000 10000] [--audit] [--profile N]
        [--workdir /tmp/bench_planning] [--out benchmarks/out/planning.json] [--checkout PATH]

Each size N is a config of the first N checkpoints of the catalogue's published grids, whole grids in this order
(Pythia's sizes, -deduped and -seed{n} runs, MultiBERTs, OLMo, OLMo 2, the Stanford GPT-2 runs, TinyLlama; the last
model named takes the first steps of its grid that make N), with the schema's defaults otherwise (the default
`compare:`), the built-in corpus, offline (`HF_HUB_OFFLINE=1`, an empty Hugging Face cache). The audit is off
unless --audit, which turns it on with `allow_unaudited: true`: offline and uncached, every step is swept
unaudited, as a user offline has it.

Each dry run is its own process in a fresh folder; reported: the jobs Snakemake plans, the planning CPU seconds
(user + system, of the process and what it waited for) in all, per checkpoint and per job, its peak resident memory
(ru_maxrss), the wall seconds, and the CPU seconds per checkpoint of the largest size against the smallest's (1.0:
linear). --checkout plans with another checkout's Snakefile and package (its src/ first on PYTHONPATH), e.g. a
baseline commit in a `git worktree`, with this script's configs. --profile N also
writes a cProfile of the dry run of N checkpoints (WORKDIR/planning-N.prof; `python -m pstats` reads it).
Written to --out as JSON and printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ORDER = ("pythia", "multiberts", "olmo", "olmo2", "gpt2", "tinyllama")


def published_grids() -> list[tuple[str, str, list[int]]]:
    """(family, model, its published steps) of every catalogued Hub model, in ORDER."""
    from anisweep.checkpoints.catalogue import FAMILIES, resolve

    grids = []
    for family in ORDER:
        for name in FAMILIES[family].names():
            steps = [c.step for c in resolve({"family": family, "name": name, "steps": "all"})]
            grids.append((family, name, steps))
    return grids


def models_of(n: int) -> list[dict]:
    """The `models:` of the first n checkpoints: whole grids, the last one cut to what makes n."""
    models, left = [], n
    for family, name, steps in published_grids():
        if left <= 0:
            break
        models.append({"family": family, "name": name, "steps": "all" if len(steps) <= left else steps[:left]})
        left -= len(steps)
    if left > 0:
        raise SystemExit(f"the catalogue's published grids hold {n - left} checkpoints, fewer than {n}")
    return models


def sweep_config(n: int, audit: bool) -> dict:
    config = {"models": models_of(n), "corpus": {"source": "builtin"}}
    config["audit"] = {"enabled": True, "allow_unaudited": True} if audit else {"enabled": False}
    return config


def dry_run(folder: Path, n: int, audit: bool, profile: Path | None, checkout: Path = ROOT) -> dict:
    """`snakemake -n` of n checkpoints in a fresh folder: its jobs, CPU seconds, peak memory and wall seconds."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    configfile = folder / "config.yaml"
    configfile.write_text(yaml.safe_dump(sweep_config(n, audit), sort_keys=False))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(folder / "hf"), ANISWEEP_WORKER="off")
    if checkout != ROOT:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout / "src"), env.get("PYTHONPATH")]))
    runner = ["-m", "cProfile", "-o", str(profile), "-m"] if profile else ["-m"]
    command = [sys.executable, *runner, "snakemake", "-s", str(checkout / "Snakefile"), "--directory", str(folder)]
    command += ["--configfile", str(configfile), "-n", "--cores", "1", "--quiet", "rules"]
    start = time.perf_counter()
    with open(folder / "snakemake.log", "w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    text = (folder / "snakemake.log").read_text()
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"the dry run of {n} checkpoints failed: {folder / 'snakemake.log'}\n{text[-3000:]}")
    return {
        "checkpoints": n,
        "jobs": planned_jobs(text),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_mb": usage.ru_maxrss / 1024,
        "wall_s": wall,
    }


def planned_jobs(text: str) -> int:
    """The `total` line of Snakemake's job counts."""
    for line in text.splitlines():
        fields = line.split()
        if fields[:1] == ["total"] and len(fields) == 2 and fields[1].isdigit():
            return int(fields[1])
    raise SystemExit(f"no job counts in the dry run's output:\n{text[-3000:]}")


def table(rows: list[dict]) -> str:
    header = ["checkpoints", "jobs", "planning CPU s", "CPU ms per checkpoint", "CPU ms per job", "peak memory MB"]
    lines = ["| " + " | ".join([*header, "wall s"]) + " |"]
    lines.append("|---|---|---|---|---|---|---|")
    for r in rows:
        per, per_job = 1000 * r["cpu_s"] / r["checkpoints"], 1000 * r["cpu_s"] / r["jobs"]
        lines.append(
            f"| {r['checkpoints']:,} | {r['jobs']:,} | {r['cpu_s']:.1f} | {per:.1f} | {per_job:.2f} "
            f"| {r['peak_mb']:.0f} | {r['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 1000, 5000, 10000])
    parser.add_argument("--audit", action="store_true", help="the audit on, allow_unaudited (else audit: off)")
    parser.add_argument("--profile", type=int, nargs="*", default=[], help="sizes whose dry run is profiled")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_planning"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "planning.json")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the checkout whose Snakefile and package plan")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    rows = []
    for n in sorted(args.sizes):
        profile = args.workdir / f"planning-{n}.prof" if n in args.profile else None
        rows.append(dry_run(args.workdir / str(n), n, args.audit, profile, checkout) | {"profiled": bool(profile)})
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    smallest, largest = rows[0], rows[-1]
    ratio = (largest["cpu_s"] / largest["checkpoints"]) / (smallest["cpu_s"] / smallest["checkpoints"])
    result = {"audit": args.audit, "checkout": str(checkout), "rows": rows, "per_checkpoint_ratio": ratio}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(table(rows))
    print(
        f"\nCPU per checkpoint at {largest['checkpoints']:,} over that at {smallest['checkpoints']:,}: {ratio:.2f}"
        f" (audit {'on, allow_unaudited' if args.audit else 'off'})"
    )


if __name__ == "__main__":
    main()
