"""The extract stage's commands: corpus (the evaluation texts, read once) and extract (one checkpoint's model run)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from anisweep.arguments import json_value
from anisweep.errors import DISK_FULL


def cmd_corpus(args) -> None:
    from anisweep.corpus import load_texts, write_texts
    from anisweep.media import load_media, modality_of, write_media

    if modality_of(args.corpus) != "text":
        write_media(load_media(args.corpus), args.out)
        return
    texts = load_texts(args.corpus)
    if not texts:
        raise ValueError(
            f"the corpus {json.dumps(args.corpus, sort_keys=True)} holds no text (every document is empty or blank): "
            "name files or a dataset column with text under the config's `corpus:`"
        )
    write_texts(texts, args.out)


def cmd_extract(args) -> None:
    from anisweep.atomic import remove_orphans
    from anisweep.corpus import load_texts, read_corpus
    from anisweep.extract.model import ExtractSettings
    from anisweep.extract.run import extract_checkpoint
    from anisweep.tables import EXTRACT_GRADIENT_TABLES, EXTRACT_TABLES

    settings = ExtractSettings(**args.settings)
    if args.threads:
        settings.threads = args.threads
    manifest = json.loads(Path(args.manifest).read_text())
    # half-written tables of a run killed mid-write: extract's own, never the weights job's beside them
    own = [f"{name}.parquet" for name in (*EXTRACT_TABLES, *EXTRACT_GRADIENT_TABLES)]
    remove_orphans(args.out, [*own, "gradient_bases.parquet", "extract.json"])
    texts = read_corpus(args.texts) if args.texts else load_texts(args.corpus)
    more_tables = None
    if args.gradients:
        from anisweep.tangent.checkpoint import pass_tables_for
        from anisweep.tangent.settings import GradientSettings

        more_tables = pass_tables_for(manifest, GradientSettings(**args.gradients), settings.batch_size)
    stream_measures = []
    if args.stream_measure:
        from anisweep.measures.registry import load

        stream_measures = [load(entry) for entry in args.stream_measure]
    try:
        info = extract_checkpoint(
            manifest, texts, settings, Path(args.out), more_tables=more_tables, stream_measures=stream_measures
        )
    except OSError as error:
        if error.errno in DISK_FULL:
            _remove_downloaded_weights(Path(args.manifest).parent, manifest)
        raise
    print(
        f"{manifest['family']}/{manifest['model']}/step{manifest['step']}: "
        f"{info['n_valid_tokens']} tokens at {info['tokens_per_second']:.0f} tokens/s",
        file=sys.stderr,
    )


def _remove_downloaded_weights(folder: Path, manifest: dict) -> None:
    """On a full disk, the weights fetch downloaded for this checkpoint (often GBs) are deleted: the run stops
    anyway, Snakemake may be unable to clean up after it, and the next run fetches them again. A local run's
    folder is never touched."""
    import shutil

    if manifest.get("repo_id") and folder.parts[-4:-3] == ("weights",) and folder.name == f"step{manifest['step']}":
        shutil.rmtree(folder, ignore_errors=True)
        print(
            f"removed the downloaded weights {folder} to free space; the next run fetches them again", file=sys.stderr
        )


def add_commands(sub) -> None:
    """Add this stage's commands to `anisweep`'s sub-commands."""
    p = sub.add_parser("corpus", help="read the evaluation texts once into a Parquet file")
    p.add_argument("--corpus", type=json_value, required=True, help="JSON of the config's corpus section")
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_corpus)

    p = sub.add_parser("extract", help="run one checkpoint over the evaluation batch")
    p.add_argument("--manifest", required=True, help="checkpoint.json written by fetch")
    p.add_argument(
        "--corpus", type=json_value, default={"source": "builtin"}, help="JSON of the config's corpus section"
    )
    p.add_argument("--texts", help="the texts written by `anisweep corpus` (instead of --corpus)")
    p.add_argument("--settings", type=json_value, default={}, help="JSON of the config's extract section")
    p.add_argument("--threads", type=int)
    p.add_argument("--out", required=True)
    p.add_argument(
        "--gradients", type=json_value, help="JSON of the config's gradients section: the backward pass's tables too"
    )
    p.add_argument(
        "--stream-measure", action="append", help="module:attribute of a stream measure to run in the forward pass"
    )
    p.set_defaults(run=cmd_extract)
