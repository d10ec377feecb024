"""The command line each Snakemake rule calls; every step also runs by hand, on a node or from a notebook.

`anisweep --help` lists every command with what it does (one per rule: train-toy, fetch, extract, metrics, sweep,
plot, ...); `anisweep COMMAND --help` gives its arguments.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from anisweep.cli import (
    bootstrap,
    checkpoints,
    explore,
    extract,
    live,
    measures,
    mechanism,
    plots,
    tangent,
    toy,
    weights,
)
from anisweep.errors import DISK_FULL

# Each stage's commands (cli/<stage>.py), in the flow's order; they import what they run only when they run, so
# that `anisweep --help` and parsing a command import no torch.
STAGES = (toy, live, checkpoints, extract, measures, bootstrap, weights, tangent, mechanism, plots, explore)


@functools.cache  # built once per process: the warm worker builds it before it forks its jobs
def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="anisweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = top.add_subparsers(dest="command", required=True)
    for stage in STAGES:
        stage.add_commands(sub)
    return top


def _checkpoint_key(args) -> str | None:
    """`{family}/{model}/step{N}` of the checkpoint a command works on, for its error message."""
    try:
        if args.command == "fetch":
            c = args.checkpoint
            return f"{c['family']}/{c['model']}/step{c['step']}"
        if args.command in ("weights", "logit-lens"):
            c = args.checkpoint
            return f"{c['family']}/{c['model']}/step{c['step']}"
        if args.command == "extract":
            m = json.loads(Path(args.manifest).read_text())
            return f"{m['family']}/{m['model']}/step{m['step']}"
    except Exception:  # an unreadable manifest is reported as the error itself
        pass
    folder = {
        "extract": getattr(args, "out", None),
        "metrics": getattr(args, "extract_dir", None),
        "measure": getattr(args, "extract_dir", None),
        "compare": getattr(args, "extract_dir", None),
        "gradients": str(Path(getattr(args, "out", None) or ".").parent),
    }.get(args.command)
    if folder and Path(folder).name.startswith("step") and len(Path(folder).parts) >= 3:
        return "/".join(Path(folder).parts[-3:])  # results/{family}/{model}/step{N}
    return None


def _causes(error: BaseException):
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def _error_line(key: str | None, error: BaseException) -> str:
    """`{key}: {type}: {message}` on one line (the key once, even where the message starts with it)."""
    text = " ".join(str(error).split()) or repr(error)
    if key and text.startswith(f"{key}: "):
        text = text[len(key) + 2 :]
    line = f"{type(error).__name__}: {text}"
    if isinstance(error, MemoryError) or "OutOfMemoryError" in type(error).__name__:
        line += " (out of memory: lower extract.batch_size, or give the job more memory)"
    full = next((e for e in _causes(error) if isinstance(e, OSError) and e.errno in DISK_FULL), None)
    if full is not None:
        where = f" holding {full.filename}" if full.filename else ""
        line += (
            f" (the disk{where} is full or over quota: free space there and run again; nothing half-written "
            "is left under a real name, and the rerun does only what is missing)"
        )
    return line if key is None else f"{key}: {line}"


def _usage_error(args) -> str | None:
    """What is wrong with a command line that parses, told before it runs (no traceback: exit status 2, as argparse
    gives a command line it cannot parse)."""
    if args.command == "audit" and args.family == "hub" and not args.config:
        return (
            f"audit hub {args.name}: a `hub` model's checkpoints are those its models entry names (revision: "
            '"step{step}", a branch each; subfolder: "checkpoint-{step}", a folder each); give --config CONFIG, a '
            "config whose models entry has that name"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one command. A failure prints its traceback, then one last line naming the checkpoint and the
    cause (`toy/toy-neox/step8: SafetensorError: ...`), which the rules repeat on the console; exit 1."""
    args = parser().parse_args(argv)
    if problem := _usage_error(args):
        print(f"anisweep: error: {problem}", file=sys.stderr, flush=True)
        return 2
    try:
        args.run(args)
    except Exception as error:  # every failure is reported the same way
        import traceback

        traceback.print_exc(file=sys.stderr)
        print(_error_line(_checkpoint_key(args), error), file=sys.stderr, flush=True)
        return 1
    return 0
