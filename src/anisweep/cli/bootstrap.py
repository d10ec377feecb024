"""The bootstrap stage's command: bootstrap."""

from __future__ import annotations


def cmd_bootstrap(args) -> None:
    from anisweep.measures.sample_bootstrap import Settings, bootstrap_table
    from anisweep.tables import write_atomic

    settings = Settings(level=args.level, samples=args.samples, seed=args.seed, measures=tuple(args.measures))
    write_atomic(bootstrap_table(args.checkpoints, settings, group=args.group), args.out)


def cmd_bootstrap_compare(args) -> None:
    from anisweep.measures.group_bootstrap import comparison_table
    from anisweep.measures.sample_bootstrap import Settings
    from anisweep.tables import write_atomic

    settings = Settings(level=args.level, samples=args.samples, seed=args.seed, measures=tuple(args.measures))
    table = comparison_table(
        args.base, args.other, design=args.design, settings=settings, name=args.name, base_group=args.base_group,
        other_group=args.other_group,
    )  # fmt: skip
    write_atomic(table, args.out)


def _settings(p) -> None:
    p.add_argument("--level", type=float, default=0.95, help="the intervals' confidence level")
    p.add_argument("--samples", type=int, default=1000, help="B, the bootstrap replicates")
    p.add_argument("--seed", type=int, default=0, help="the seed of the draws of sequences and seeds")
    p.add_argument("--measures", nargs="+", default=["isoscore", "rankme"], help="isoscore, top_eig_share, rankme")
    p.add_argument("--out", required=True)


def add_commands(sub) -> None:
    """Add this stage's commands to `anisweep`'s sub-commands."""
    p = sub.add_parser(
        "bootstrap",
        help="Multi-Bootstrap intervals and step tests of the sampled vectors' measures (a model, or a group of seeds)",
    )
    p.add_argument(
        "--checkpoints",
        nargs="+",
        action="append",
        required=True,
        metavar="DIR",
        help="one seed's checkpoint folders (hidden.parquet, extract.json) in step order; once per seed of a group",
    )
    p.add_argument("--group", help="the group's name (left out: a model alone)")
    _settings(p)
    p.set_defaults(run=cmd_bootstrap)

    p = sub.add_parser(
        "bootstrap-compare",
        help="Multi-Bootstrap test of one group of seeds against another at the steps they share (other - base)",
    )
    for side in ("base", "other"):
        p.add_argument(
            f"--{side}",
            nargs="+",
            action="append",
            required=True,
            metavar="DIR",
            help=f"one seed of the {side} group: its checkpoint folders in step order; once per seed",
        )
        p.add_argument(f"--{side}-group", help=f"the {side} group's name")
    p.add_argument(
        "--design",
        choices=("paired", "unpaired"),
        default="unpaired",
        help="paired: seed i of the base with seed i of the other, drawn together; unpaired: independent seeds",
    )
    p.add_argument("--name", help="the comparison's name")
    _settings(p)
    p.set_defaults(run=cmd_bootstrap_compare)
