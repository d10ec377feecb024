"""What a sweep's jobs cost beyond their work: the workflow against a one-process loop of the same commands.

    python benchmarks/bench_workflow.py [--configfile config/config.yaml] [--cores 1] [--without-worker]
        [--workdir /tmp/bench_workflow] [--out benchmarks/out/workflow.json]

In one sitting, each arm in a fresh folder:

1. `workflow`: `snakemake --cores N` on the config, as a user runs it (the warm worker on: anisweep.worker). Every
   command records its wall time, from its process's start to its end (ANISWEEP_TIMINGS).
2. `without worker` (--without-worker): the same with ANISWEEP_WORKER=off, every command in a fresh process.
3. `loop`: one Python process that imports the package's stages once, then calls `anisweep.cli.main` on the same
   command lines in the order the workflow finished them, each on its job's threads, its stderr to a log as
   the rule's is; each call's time is the job's work.

Reported: each arm's wall time; the loop's over the workflow's (1.0: the workflow costs nothing beyond the work;
the goal is 0.8 or more, on --cores 1, where both have the same cores); each job's overhead, its wall time in the
workflow minus its work in the loop (median, 90th percentile, per rule); and the loop's import time. Written to
--out as JSON and printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_workflow(folder: Path, configfile: Path, cores: int, worker: bool) -> dict:
    folder.mkdir(parents=True)
    shutil.copy(configfile, folder / "config.yaml")
    env = dict(os.environ, ANISWEEP_TIMINGS=str(folder / "timings.jsonl"))
    if not worker:
        env["ANISWEEP_WORKER"] = "off"
    command = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--directory", str(folder)]
    command += ["--cores", str(cores), "--configfile", str(folder / "config.yaml")]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    (folder / "snakemake.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"the workflow failed in {folder}: see {folder / 'snakemake.log'}")
    jobs = [json.loads(line) for line in (folder / "timings.jsonl").read_text().splitlines()]
    return {"wall_s": wall, "jobs": sorted(jobs, key=lambda job: job["end"])}


def replay(jobs_file: Path, folder: Path, source: Path) -> None:
    """The loop arm, in this process: import once, then every command in order."""
    import torch

    start = time.perf_counter()
    from anisweep.cli import main
    from anisweep.worker import server

    for module in server.PRELOAD:
        server.preload(module)
    imports = time.perf_counter() - start
    folder.mkdir(parents=True)
    shutil.copy(source / "config.yaml", folder / "config.yaml")
    if (source / "resources").is_dir():  # what the Snakefile itself writes, not a job
        shutil.copytree(source / "resources", folder / "resources")
    os.chdir(folder)
    (folder / "logs").mkdir()
    results = []
    for i, job in enumerate(json.loads(jobs_file.read_text())):
        torch.set_num_threads(int(job["threads"] or 1))
        log = os.open(folder / "logs" / f"{i}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        saved = os.dup(2)
        os.dup2(log, 2)
        begin = time.perf_counter()
        try:
            status = main(job["argv"])
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(log)
            os.close(saved)
        results.append({"argv": job["argv"], "status": status, "work_s": time.perf_counter() - begin})
        if status:
            raise SystemExit(f"{' '.join(job['argv'][:1])} failed in the loop: see {folder / 'logs' / f'{i}.log'}")
    total = time.perf_counter() - start
    (folder / "loop.json").write_text(json.dumps({"imports_s": imports, "wall_s": total, "jobs": results}))


def run_loop(folder: Path, workflow_folder: Path, jobs: list[dict]) -> dict:
    jobs_file = folder.parent / "loop_jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    command = [sys.executable, __file__, "--replay", str(jobs_file), "--workdir", str(folder)]
    command += ["--source", str(workflow_folder)]
    start = time.perf_counter()
    done = subprocess.run(command, env=dict(os.environ, ANISWEEP_WORKER="off"), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"the loop failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    loop = json.loads((folder / "loop.json").read_text())
    return loop | {"process_wall_s": wall}


def overheads(workflow: dict, loop: dict) -> dict:
    work = {json.dumps(job["argv"]): job["work_s"] for job in loop["jobs"]}
    per_job = [(job["argv"][0], job["wall_s"] - work[json.dumps(job["argv"])]) for job in workflow["jobs"]]
    values = sorted(value for _, value in per_job)
    by_command = {}
    for command, value in per_job:
        by_command.setdefault(command, []).append(value)
    return {
        "median_s": statistics.median(values),
        "p90_s": values[int(0.9 * (len(values) - 1))],
        "by_command": {command: statistics.median(v) for command, v in sorted(by_command.items())},
    }


def table(report: dict) -> str:
    rows = [
        "| arm | wall s | loop / arm | median job overhead s | 90th pct s |",
        "|---|---|---|---|---|",
    ]
    loop = report["loop"]["process_wall_s"]
    rows.append(f"| one-process loop (imports {report['loop']['imports_s']:.1f} s once) | {loop:.1f} | 1.00 | | |")
    for arm in ("workflow", "without_worker"):
        if arm in report:
            o = report[arm]["overhead"]
            rows.append(
                f"| {arm.replace('_', ' ')} | {report[arm]['wall_s']:.1f} | {loop / report[arm]['wall_s']:.2f} | "
                f"{o['median_s']:.2f} | {o['p90_s']:.2f} |"
            )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configfile", type=Path, default=ROOT / "config" / "config.yaml")
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--without-worker", action="store_true", help="also the workflow with ANISWEEP_WORKER=off")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_workflow"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "workflow.json")
    parser.add_argument("--replay", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--source", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay:
        replay(args.replay, args.workdir, args.source)
        return
    if args.workdir.exists():
        shutil.rmtree(args.workdir)
    report = {"configfile": str(args.configfile), "cores": args.cores, "cpus": os.cpu_count()}
    report["workflow"] = run_workflow(args.workdir / "workflow", args.configfile, args.cores, worker=True)
    report["loop"] = run_loop(args.workdir / "loop", args.workdir / "workflow", report["workflow"]["jobs"])
    report["workflow"]["overhead"] = overheads(report["workflow"], report["loop"])
    if args.without_worker:
        report["without_worker"] = run_workflow(args.workdir / "without", args.configfile, args.cores, worker=False)
        report["without_worker"]["overhead"] = overheads(report["without_worker"], report["loop"])
    report["table"] = table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(report["table"])
    print(json.dumps({arm: report[arm]["overhead"]["by_command"] for arm in ("workflow",)}, indent=1))


if __name__ == "__main__":
    main()
