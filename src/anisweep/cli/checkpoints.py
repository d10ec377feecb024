"""The checkpoints stage's commands: fetch, audit, and checkpoints (the list a config names)."""

from __future__ import annotations

import json
from pathlib import Path

from anisweep.arguments import json_value


def cmd_fetch(args) -> None:
    from anisweep.checkpoints.base import Checkpoint
    from anisweep.checkpoints.catalogue import family_of
    from anisweep.checkpoints.fetch import fetch, log_to_stderr

    log_to_stderr()
    checkpoint = Checkpoint.from_dict(args.checkpoint)
    before_weights = None
    if args.texts and family_of(checkpoint.family).checks_before_fetch:  # what extract would fail on
        from anisweep.checkpoints.preflight import evaluation_batch
        from anisweep.corpus import read_corpus
        from anisweep.extract.model import ExtractSettings

        settings, texts = ExtractSettings(**args.settings), read_corpus(args.texts)

        def before_weights(folder, tokenizer):
            evaluation_batch(folder, tokenizer, settings, texts, checkpoint.key)

    fetch(
        checkpoint,
        Path(args.out),
        keep_weights=args.keep_weights,
        retries=args.retries,
        before_weights=before_weights,
        audited_sha256=args.audited_sha256,
    )
    if args.share_with:
        from anisweep.weights.fetched import share

        share(args.out, args.share_with)


def cmd_audit(args) -> None:
    import yaml

    from anisweep.checkpoints.audit import (
        AuditError,
        audit_model,
        grid_path,
        health,
        how_to_check,
        read_grid,
        unchecked_reasons,
        write_grid,
    )
    from anisweep.checkpoints.catalogue import resolve

    entry = {"family": args.family, "name": args.name, "steps": "all"}
    if args.config:
        models = yaml.safe_load(Path(args.config).read_text()).get("models") or []
        found = [m for m in models if m.get("family") == args.family and str(m.get("name")) == args.name]
        if not found:
            raise ValueError(f"{args.config} has no models entry {args.family}/{args.name}")
        entry = found[0]
    checkpoints = resolve(entry)
    if not checkpoints or checkpoints[0].repo_id is None:
        raise ValueError(f"{args.family}/{args.name} is not on the Hub: there is no published grid to audit")
    path = grid_path(args.results, args.family, checkpoints[0].model)  # where the workflow reads it
    table, notes = audit_model(checkpoints, previous=read_grid(path))
    if set(table["status"]) == {"unchecked"}:
        reasons = unchecked_reasons(table)
        raise AuditError(
            f"{args.family}/{args.name}: nothing of its grid could be audited ({'; '.join([*notes, *reasons])}): "
            + how_to_check(reasons)
        )
    written = write_grid(table, path) if not args.no_write else False
    print("\n".join(health(table, notes, [c.step for c in checkpoints] if args.config else None)))
    print(f"{path}: {'written' if written else 'unchanged' if path.exists() else 'not written'}")


def cmd_checkpoints(args) -> None:
    import yaml

    from anisweep.config import describe

    config = {}
    for path in args.configfile:
        config.update(yaml.safe_load(Path(path).read_text()) or {})
    for row in describe(config):
        print(json.dumps(row))


def add_commands(sub) -> None:
    """Add this stage's commands to `anisweep`'s sub-commands."""
    p = sub.add_parser("fetch", help="get one checkpoint's weights")
    p.add_argument("--checkpoint", type=json_value, required=True, help="JSON of a checkpoints.base.Checkpoint")
    p.add_argument("--out", required=True)
    p.add_argument("--keep-weights", action="store_true", help="download into the HF cache and keep them there")
    p.add_argument("--retries", type=int, default=5)
    p.add_argument(
        "--texts",
        help="the texts written by `anisweep corpus`: check the checkpoint against them and "
        "--settings before any weights move",
    )
    p.add_argument("--settings", type=json_value, default={}, help="JSON of the config's extract section")
    p.add_argument(
        "--audited-sha256",
        type=json_value,
        default={},
        help="JSON {weight file: sha256} the audit of the grid found: a downloaded file the Hub names otherwise fails",
    )
    p.add_argument(
        "--share-with",
        nargs="*",
        default=[],
        help="a folder for each job of the run that reads the weights after extract: a copy by hard links",
    )
    p.set_defaults(run=cmd_fetch)

    p = sub.add_parser("audit", help="audit a Hub model's published grid from file metadata and print its health")
    p.add_argument("family", help="a Hub family: pythia, multiberts, olmo, olmo2, gpt2, tinyllama, hub")
    p.add_argument("name", help="the model's name in its family (pythia-2.8b, seed_0, ...)")
    p.add_argument("--config", help="a config whose models entry of this name to audit (needed for `hub`)")
    p.add_argument(
        "--results",
        default="results",
        help="where {results}/{family}/{model}/grid.parquet is kept ({model} as the workflow names it: a `hub` repo "
        "id with / as --)",
    )
    p.add_argument("--no-write", action="store_true", help="print the health only; leave grid.parquet as it is")
    p.set_defaults(run=cmd_audit)

    p = sub.add_parser("checkpoints", help="list the checkpoints a config names, as JSON lines")
    p.add_argument("--configfile", nargs="+", required=True)
    p.set_defaults(run=cmd_checkpoints)
