"""The measures stage's commands: metrics, measure, glossary, sweep and phases."""

from __future__ import annotations

from pathlib import Path

from anisweep.arguments import json_value, step_list


def cmd_metrics(args) -> None:
    from anisweep.measures.metrics import checkpoint_metrics
    from anisweep.tables import write_atomic

    metrics = checkpoint_metrics(args.extract_dir, args.gradients, args.measure_table or [], args.sink_epsilon)
    write_atomic(metrics, args.out)
    if args.spectra_out:
        from anisweep.measures.spectra import checkpoint_spectra

        write_atomic(checkpoint_spectra(args.extract_dir), args.spectra_out)


def cmd_measure(args) -> None:
    from anisweep.measures.registry import MeasureError, load, run_table_measure
    from anisweep.tables import write_atomic

    measure = load(args.entry)
    if measure.kind != "table":
        raise MeasureError(f"measure {args.entry!r} is a stream measure: extract runs it (--stream-measure)")
    write_atomic(run_table_measure(measure, args.extract_dir), args.out)


def cmd_glossary(args) -> None:
    from anisweep.atomic import write_text
    from anisweep.measures.glossary import glossary_markdown
    from anisweep.measures.registry import measures_of

    text = glossary_markdown(measures_of(args.measure or []))
    if args.out:
        write_text(text, Path(args.out))
    else:
        print(text)


def cmd_sweep(args) -> None:
    from anisweep.checkpoints.audit import with_audit
    from anisweep.measures.sweep import aggregate
    from anisweep.tables import write_atomic

    sweep = aggregate(
        [Path(p) for p in args.metrics],
        expected_steps=args.expected_steps,
        final_step=args.final_step,
        gradient_fixed_shares=args.gradient_fixed_shares,
    )
    if args.audit:
        sweep = with_audit(sweep, args.audit, args.flagged_steps, args.seed)
    write_atomic(sweep, args.out)


def cmd_phases(args) -> None:
    from anisweep.measures.phases import model_phases
    from anisweep.measures.sweep import read_complete_sweeps
    from anisweep.tables import write_atomic

    write_atomic(model_phases(read_complete_sweeps([args.sweep]), args.settings), args.out)


def cmd_compare(args) -> None:
    import json

    from anisweep.measures.compare import ComparisonError, Settings, compare_pair, layer_matrix
    from anisweep.measures.registry import measures_of
    from anisweep.tables import write_atomic

    settings = Settings.of(json.loads(args.settings))
    if args.layers:
        table = layer_matrix(args.extract_dir, settings)
    else:
        user = measures_of(args.measure or [])
        wrong = [m.entry for m in user if m.kind != "comparative"]
        if wrong:
            raise ComparisonError(f"--measure {wrong}: not comparative measures (@comparative_measure)")
        table = compare_pair(args.extract_dir, args.ref_dir, settings, user)
    write_atomic(table, args.out)


def cmd_compare_sweep(args) -> None:
    from anisweep.measures.compare import aggregate
    from anisweep.tables import write_atomic

    pairs = [tuple(item.split("=", 1)) for item in args.pairs]
    write_atomic(aggregate(pairs), args.out)


def add_commands(sub) -> None:
    """Add this stage's commands to `anisweep`'s sub-commands."""
    p = sub.add_parser("metrics", help="every metric of one checkpoint from extract's Parquet")
    p.add_argument("--extract-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--spectra-out", help="spectra.parquet: normalised singular values of the sampled vectors")
    p.add_argument("--gradients", help="the checkpoint's gradients.parquet: its shares become metric rows too")
    p.add_argument("--measure-table", nargs="*", help="tables of the user's measures (measures/{name}.parquet)")
    p.add_argument(
        "--sink-epsilon", type=float, default=0.3, help="the first-key importance above which a head sinks (Sink_1^eps)"
    )
    p.set_defaults(run=cmd_metrics)

    p = sub.add_parser("measure", help="one table measure of one checkpoint, from extract's Parquet")
    p.add_argument("--entry", required=True, help="module:attribute of the measure")
    p.add_argument("--extract-dir", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_measure)

    p = sub.add_parser("glossary", help="every measure, metric, site and column with its definition (markdown)")
    p.add_argument("--measure", action="append", help="module:attribute of a user's measure to list too")
    p.add_argument("--out", help="write here instead of printing")
    p.set_defaults(run=cmd_glossary)

    p = sub.add_parser("sweep", help="one tidy table per model's sweep, from its checkpoints' metrics")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--expected-steps",
        type=step_list,
        default=[],
        help="comma-separated steps the config names; absent ones are listed as missing",
    )
    p.add_argument(
        "--final-step", type=int, help="the step trusted when several steps share weights (the published final model)"
    )
    p.add_argument("--gradient-fixed-shares", help="the model's gradient_fixed_shares.parquet: its rows become metrics")
    p.add_argument("--audit", help="the model's grid.parquet: each step's audit, and a row per step it left out")
    p.add_argument("--flagged-steps", type=step_list, default=[], help="comma-separated steps the audit left out")
    p.add_argument("--seed", type=int, help="the model's seed, for the rows of the steps left out")
    p.add_argument("metrics", nargs="*")
    p.set_defaults(run=cmd_sweep)

    p = sub.add_parser("phases", help="the phases RankMe and alpha-ReQ trace over one model's sweep (Li et al. 2025)")
    p.add_argument("--sweep", required=True)
    p.add_argument("--out", required=True)
    p.add_argument(
        "--settings", type=json_value, default={}, help='JSON {"smooth": .., "tolerance": .., "min_steps": ..}'
    )
    p.set_defaults(run=cmd_phases)

    p = sub.add_parser("compare", help="comparative measures of two checkpoints (or a checkpoint's layers)")
    p.add_argument("--extract-dir", required=True, help="the checkpoint's folder (hidden.parquet, extract.json)")
    p.add_argument("--ref-dir", help="the reference checkpoint's folder")
    p.add_argument("--layers", action="store_true", help="every layer of --extract-dir against every other")
    p.add_argument("--settings", default="{}", help="the config's compare section (JSON)")
    p.add_argument("--measure", action="append", help="module:attribute of a user's comparative measure")
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_compare)

    p = sub.add_parser("compare-sweep", help="one table of every comparison of a model (compare.parquet)")
    p.add_argument("--out", required=True)
    p.add_argument("pairs", nargs="*", help="ROLE=PATH of each pair's table")
    p.set_defaults(run=cmd_compare_sweep)
