"""The weights stage's commands: weights (a weight measure) and logit-lens, read from a checkpoint's weights."""

from __future__ import annotations

from anisweep.arguments import json_value


def _releasing_the_shared_copy(command):
    """`command`, then the copy of the weights fetch shared with this job removed, whether or not it succeeded."""

    def run(args) -> None:
        from anisweep.weights.fetched import release

        try:
            command(args)
        finally:
            release(args.fetched)

    run.__doc__ = command.__doc__
    return run


@_releasing_the_shared_copy
def cmd_weights(args) -> None:
    """A weight measure of one checkpoint from its weights (the built-in `circuits` and `weight_matrices` without
    --entry)."""
    from anisweep.checkpoints.base import Checkpoint
    from anisweep.measures.registry import MeasureError, load
    from anisweep.tables import write_atomic
    from anisweep.weights.run import identity, pair_frame, run_weight_measure

    ckpt = Checkpoint.from_dict(args.checkpoint)
    if args.entry:
        measure = load(args.entry)
        if measure.kind != "weight":
            raise MeasureError(f"measure {args.entry!r} is a {measure.kind} measure, not a weight measure")
        write_atomic(run_weight_measure(measure, ckpt, fetched=args.fetched), args.out)
        return
    from anisweep.weights.builtin import builtin_weight_tables

    metrics, pairs = builtin_weight_tables(ckpt, args.probe_tokens, args.fetched)
    write_atomic(pair_frame(identity(ckpt), pairs), args.pairs_out)
    write_atomic(metrics, args.out)


@_releasing_the_shared_copy
def cmd_logit_lens(args) -> None:
    """The logit lens of one checkpoint from extract's samples and its head's weights (no forward pass)."""
    from anisweep.checkpoints.base import Checkpoint
    from anisweep.corpus import read_corpus
    from anisweep.extract.model import ExtractSettings
    from anisweep.tables import write_atomic
    from anisweep.weights.lens import lens_not_measured, logit_lens_table
    from anisweep.weights.run import identity, open_weights
    from anisweep.weights.source import Unmeasurable

    ckpt = Checkpoint.from_dict(args.checkpoint)
    try:
        weights = open_weights(ckpt, fetched=args.fetched)
    except Unmeasurable as error:  # an image or audio model, an encoder-decoder: the row that says so
        write_atomic(lens_not_measured(identity(ckpt), ckpt.key, error), args.out)
        return
    table = logit_lens_table(args.extract_dir, weights, ExtractSettings(**args.settings), read_corpus(args.texts))
    write_atomic(table, args.out)


def _fetched_argument(p) -> None:
    p.add_argument(
        "--fetched",
        help="the copy of the checkpoint's weights its fetch shared in this run: read there, then removed (else the "
        "weights are read where they are, or by range requests)",
    )


def add_commands(sub) -> None:
    """Add this stage's commands to `anisweep`'s sub-commands."""
    p = sub.add_parser("weights", help="a weight measure of one checkpoint, from its weights (no forward pass)")
    p.add_argument("--checkpoint", type=json_value, required=True, help="the checkpoint, JSON (as fetch takes it)")
    p.add_argument("--entry", help="module:attribute of a user's weight measure (else the built-in circuits)")
    p.add_argument("--out", required=True)
    p.add_argument("--pairs-out", help="the built-in circuits' top token pairs (weight_pairs.parquet)")
    p.add_argument("--probe-tokens", type=int, default=4096, help="the built-in circuits' probe (config weights)")
    _fetched_argument(p)
    p.set_defaults(run=cmd_weights)

    p = sub.add_parser("logit-lens", help="the logit lens of one checkpoint, from extract's samples and its head")
    p.add_argument("--checkpoint", type=json_value, required=True, help="the checkpoint, JSON (as fetch takes it)")
    p.add_argument("--extract-dir", required=True)
    p.add_argument("--texts", required=True, help="the corpus extract ran on (resources/corpus.parquet)")
    p.add_argument("--settings", type=json_value, required=True, help="JSON of the config's extract section")
    p.add_argument("--out", required=True)
    _fetched_argument(p)
    p.set_defaults(run=cmd_logit_lens)
