"""The mechanism stage's commands: untrained (Godey et al. Sec. 4) and qk-svd."""

from __future__ import annotations

from pathlib import Path

from anisweep.arguments import json_value


def cmd_untrained(args) -> None:
    import torch

    from anisweep.mechanism.untrained import UntrainedSettings, run
    from anisweep.tables import UNTRAINED_TABLES, write_atomic

    if args.threads:
        torch.set_num_threads(args.threads)
    settings = UntrainedSettings.from_dict(args.settings)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {}
    for item in args.weights:
        init, sep, path = item.partition("=")
        if not sep:
            raise ValueError(f"--weights {item}: expected LABEL=PATH, e.g. toy-bert@step0=weights/toy/toy-bert/step0")
        weights[init] = Path(path)
    tables = run(settings, weights=weights)
    for name in UNTRAINED_TABLES:
        write_atomic(tables[name], out_dir / f"{name}.parquet")


def cmd_qk_svd(args) -> None:
    from anisweep.mechanism.qk_svd import qk_svd
    from anisweep.plots.distributions import qk_svd_figures
    from anisweep.tables import write_atomic

    table, extras = qk_svd([Path(d) for d in args.extract_dirs], args.fraction, args.seed)
    write_atomic(table, args.out)
    qk_svd_figures(table, extras, args.heads, Path(args.figures_dir))


def add_commands(sub) -> None:
    """Add this stage's commands to `anisweep`'s sub-commands."""
    p = sub.add_parser("untrained", help="the untrained block with an injected common bias (Godey et al. Sec. 4)")
    p.add_argument(
        "--settings",
        type=json_value,
        default={},
        help="JSON of the config's untrained section (keys left out: defaults)",
    )
    p.add_argument("--out-dir", required=True, help="writes untrained.parquet, histogram.parquet, summary.parquet")
    p.add_argument(
        "--weights",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="a checkpoint init's folder, e.g. toy-bert@step0=weights/toy/toy-bert/step0 (once per such init)",
    )
    p.add_argument("--threads", type=int)
    p.set_defaults(run=cmd_untrained)

    p = sub.add_parser("qk-svd", help="one model's queries and keys across training on their singular directions")
    p.add_argument("--out", required=True, help="qk_svd.parquet")
    p.add_argument("--figures-dir", required=True)
    p.add_argument("--fraction", type=float, default=1.0, help="share of the q/k sample the SVD is computed on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--heads", type=json_value, default='"auto"', help='JSON: "auto" or [[layer, head], ...] to plot')
    p.add_argument("extract_dirs", nargs="+", help="the model's per-step extract folders")
    p.set_defaults(run=cmd_qk_svd)
