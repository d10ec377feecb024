"""The bootstrap stage's command: bootstrap."""

from __future__ import annotations


def cmd_bootstrap(args) -> None:
    from anisweep.measures.sample_bootstrap import bootstrap_table
    from anisweep.tables import write_atomic

    write_atomic(bootstrap_table(args.checkpoints, _settings_of(args), group=args.group), args.out)


def cmd_bootstrap_compare(args) -> None:
    from anisweep.measures.group_bootstrap import comparison_table
    from anisweep.tables import write_atomic

    table = comparison_table(
        args.base, args.other, design=args.design, settings=_settings_of(args), name=args.name,
        base_group=args.base_group, other_group=args.other_group,
    )  # fmt: skip
    write_atomic(table, args.out)


def _settings_of(args):
    from anisweep.measures.sample_bootstrap import Settings

    return Settings(
        level=args.level, samples=args.samples, seed=args.seed, measures=tuple(args.measures),
        sink_epsilon=args.sink_epsilon, svcca_variance=args.svcca_variance, cca_max_width=args.cca_max_width or None,
    )  # fmt: skip


def _settings(p) -> None:
    p.add_argument("--level", type=float, default=0.95, help="the intervals' confidence level")
    p.add_argument("--samples", type=int, default=1000, help="B, the bootstrap replicates")
    p.add_argument("--seed", type=int, default=0, help="the seed of the draws of sequences and seeds")
    p.add_argument(
        "--measures",
        nargs="+",
        default=["isoscore", "avg_cos", "entropy_mean", "qk_cos"],
        help="of the sampled vectors (anisweep.measures.sample_bootstrap.MEASURES: isoscore, rankme, alpha_req, ...), "
        "the comparisons of two steps (pair_bootstrap.MEASURES: cka, svcca, pwcca) and built of sums "
        "(anisweep.measures.sum_bootstrap.MEASURES: avg_cos, entropy_mean, qk_cos, ...)",
    )
    p.add_argument("--sink-epsilon", type=float, default=0.3, help="sink1_eps's threshold (config sinks.epsilon)")
    p.add_argument(
        "--svcca-variance", type=float, default=0.99, help="SVCCA's share of variance (compare.svcca_variance)"
    )
    p.add_argument(
        "--cca-max-width", type=int, default=1024,
        help="SVCCA and PWCCA only at layers at most this wide (compare.cca_max_width; 0: every width)",
    )  # fmt: skip
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
