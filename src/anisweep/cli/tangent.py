"""The gradient analysis's commands: gradients, gradient-fixed-shares, gradient-fixed-bases, gradients-sweep."""

from __future__ import annotations

from pathlib import Path

from anisweep.arguments import json_value


def _blas_threads(threads: int | None) -> None:
    import os

    if threads:  # numpy's BLAS reads these when it loads (not yet: the command's imports load it)
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, str(threads))


def cmd_gradients(args) -> None:
    _blas_threads(args.threads)
    from anisweep.tangent.analysis import checkpoint_shares
    from anisweep.tangent.settings import GradientSettings

    checkpoint_shares(args.sums, args.sample, GradientSettings(**args.gradients), args.out, bases_out=args.bases_out)


def cmd_gradient_fixed_shares(args) -> None:
    _blas_threads(args.threads)
    from anisweep.tangent.analysis import fixed_shares
    from anisweep.tangent.settings import GradientSettings

    fixed_shares(args.sums, args.fixed_bases, GradientSettings(**args.gradients), args.out)


def cmd_gradient_fixed_bases(args) -> None:
    from anisweep.tangent.fixed import fixed_bases_file
    from anisweep.tangent.settings import GradientSettings

    fixed_bases_file(args.hidden, GradientSettings(**args.gradients), args.out)


def cmd_gradients_sweep(args) -> None:
    from anisweep.tables import write_atomic
    from anisweep.tangent.sweep import gradients_sweep

    write_atomic(
        gradients_sweep(
            [Path(p) for p in args.tables],
            bases=[Path(p) for p in args.bases],
            embeddings=[Path(p) for p in args.embeddings],
            fixed_bases=args.fixed_bases,
            settings=args.gradients,
            fixed_shares=args.fixed_shares,
        ),
        args.out,
    )


def add_commands(sub) -> None:
    """Add this stage's commands to `anisweep`'s sub-commands."""
    p = sub.add_parser("gradients", help="one checkpoint's gradient shares, fits and isotropy from its pass tables")
    p.add_argument("--sums", required=True, help="the checkpoint's gradient_sums.parquet (written by extract)")
    p.add_argument("--sample", required=True, help="the checkpoint's gradient_sample.parquet (written by extract)")
    p.add_argument("--gradients", type=json_value, default={}, help="JSON of the config's gradients section")
    p.add_argument("--threads", type=int)
    p.add_argument("--out", required=True, help="the gradients.parquet to write")
    p.add_argument("--bases-out", help="gradient_bases.parquet: the layer-0 bases (gradients.embedding_change)")
    p.set_defaults(run=cmd_gradients)

    p = sub.add_parser(
        "gradient-fixed-shares", help="every checkpoint's gradient shares in the model's fixed subspaces"
    )
    p.add_argument("--fixed-bases", required=True, help="the model's gradient_fixed_bases.parquet")
    p.add_argument("--gradients", type=json_value, default={}, help="JSON of the config's gradients section")
    p.add_argument("--threads", type=int)
    p.add_argument("--out", required=True)
    p.add_argument("sums", nargs="+", help="gradient_sums.parquet of every analysed checkpoint, in step order")
    p.set_defaults(run=cmd_gradient_fixed_shares)

    p = sub.add_parser("gradient-fixed-bases", help="subspaces fitted once on an early window of steps, per model")
    p.add_argument("--gradients", type=json_value, default={}, help="JSON of the config's gradients section")
    p.add_argument("--out", required=True)
    p.add_argument("hidden", nargs="+", help="hidden.parquet of every swept step in gradients.fit_window")
    p.set_defaults(run=cmd_gradient_fixed_bases)

    p = sub.add_parser("gradients-sweep", help="one model's per-checkpoint gradient tables in one")
    p.add_argument("--out", required=True)
    p.add_argument("--gradients", type=json_value, default={}, help="JSON of the config's gradients section")
    p.add_argument("--bases", nargs="*", default=[], help="per-checkpoint gradient_bases.parquet (embedding change)")
    p.add_argument("--embeddings", nargs="*", default=[], help="per-checkpoint embedding_rows.parquet, same order")
    p.add_argument("--fixed-bases", help="the model's gradient_fixed_bases.parquet")
    p.add_argument("--fixed-shares", help="the model's gradient_fixed_shares.parquet (gradients.subspaces fixed|both)")
    p.add_argument("tables", nargs="+")
    p.set_defaults(run=cmd_gradients_sweep)
