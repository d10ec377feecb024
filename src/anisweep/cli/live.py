"""The live stage's commands: take-live and take-live-local, a step of a run analysed while it trained."""

from __future__ import annotations


def cmd_take_live(args) -> None:
    from anisweep.live.take import take

    take(args.live, args.step, args.names.split(","), args.out, empty=_names(args.empty))


def cmd_take_live_local(args) -> None:
    from anisweep.live.take import take

    take(args.source, args.step, args.names.split(","), args.out, run=args.name, empty=_names(args.empty))


def _names(value: str | None) -> list[str]:
    return [name for name in (value or "").split(",") if name]


def _step_arguments(p) -> None:
    """The step taken, its files and where they go: the same for a live toy and a local run."""
    p.add_argument("--step", type=int, required=True)
    p.add_argument("--names", required=True, help="comma-separated file names")
    p.add_argument("--empty", help="comma-separated pass tables written without rows where missing (uncovered step)")
    p.add_argument("--out", required=True)


def add_commands(sub) -> None:
    """Add this stage's commands to `anisweep`'s sub-commands."""
    p = sub.add_parser("take-live", help="copy one step of a live toy's analysis where extract puts a checkpoint's")
    p.add_argument("--live", required=True, help="the live toy's folder (train-toy --out)")
    _step_arguments(p)
    p.set_defaults(run=cmd_take_live)

    p = sub.add_parser("take-live-local", help="check (or copy) one step of a local run analysed while it trained")
    p.add_argument("--name", required=True, help="the run's name (the models entry's name)")
    p.add_argument("--source", required=True, help="the folder the callback wrote (the entry's path)")
    _step_arguments(p)
    p.set_defaults(run=cmd_take_live_local)
