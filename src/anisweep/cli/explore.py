"""The explorer's command: explore."""

from __future__ import annotations

import sys
from pathlib import Path


def cmd_explore(args) -> None:
    """Write the page; on bad input print its one-line message alone (the traceback with --traceback), exit 1."""
    from anisweep.explore.data import INPUT_ERRORS, bootstrap_tables, scan_sweeps, write_explore

    sources = [Path(source) for source in args.sources]
    bootstrap = bootstrap_tables(sources) if args.bootstrap is None else args.bootstrap
    out = Path(args.out) if args.out else (sources[0] if sources[0].is_dir() else sources[0].parent) / "explore.html"
    limit = {} if args.max_values is None else {"max_values": args.max_values}
    try:
        print(write_explore(scan_sweeps(sources), out, bootstrap=bootstrap, **limit))
    except INPUT_ERRORS as error:
        if args.traceback:
            raise
        print(f"{type(error).__name__}: {' '.join(str(error).split())}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def add_commands(sub) -> None:
    """Add this stage's commands to `anisweep`'s sub-commands."""
    p = sub.add_parser("explore", help="one self-contained HTML page to explore every model's metrics over training")
    p.add_argument("sources", nargs="+", help="a results folder (its models' sweep.parquet), or sweep.parquet files")
    p.add_argument("--out", help="the page to write (default: explore.html in the results folder)")
    p.add_argument(
        "--max-values",
        type=int,
        help="values in the page (default 2.4 million); past them each model's steps are thinned",
    )
    p.add_argument(
        "--bootstrap",
        nargs="*",
        help="the models' bootstrap.parquet, drawn as bands (default: those beside the sweeps; none given: no bands)",
    )
    p.add_argument(
        "--traceback", action="store_true", help="on bad input, print the traceback too, not the message alone"
    )
    p.set_defaults(run=cmd_explore)
