"""The command line each Snakemake rule calls; every step also runs by hand, on a node or from a notebook.

`anisweep --help` lists every command with what it does (one per rule: train-toy, fetch, extract, metrics, sweep,
plot, ...); `anisweep COMMAND --help` gives its arguments.
"""

from __future__ import annotations

import argparse
import errno
import json
import sys
from pathlib import Path


def _json(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error}): {text[:200]}") from None


def _steps(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integer steps, got {text!r}") from None


def cmd_train_toy(args) -> None:
    import dataclasses

    from anisweep.toy.train import ToySpec, train_toy

    spec = dict(args.spec)
    arch, seed, steps = spec.pop("arch"), spec.pop("seed", 0), spec.pop("steps")
    fields = {f.name for f in dataclasses.fields(ToySpec)}
    unknown = sorted(set(spec) - fields)
    if unknown:
        raise SystemExit(f"toy spec: unknown key(s) {unknown}; valid: {sorted(fields | {'arch', 'seed', 'steps'})}")
    spec = ToySpec(**spec)
    analyse = None
    if spec.live:
        analyse = _live_analysis(args, seed, spec)
    train_toy(arch, args.out, steps=steps, seed=seed, spec=spec, num_threads=args.threads, analyse=analyse)


def _live_analysis(args, seed: int, spec):
    from anisweep.corpus import read_texts
    from anisweep.extract.model import ExtractSettings
    from anisweep.live.toy import LiveAnalysis
    from anisweep.tangent.settings import GradientSettings

    missing = [f"--{key}" for key in ("name", "texts", "settings") if getattr(args, key) is None]
    if missing:
        raise SystemExit(f"train-toy: a live toy (spec live: true) is analysed as it trains: give {', '.join(missing)}")
    settings = ExtractSettings(**args.settings)
    gradients = GradientSettings(**(args.gradients or {}))
    return LiveAnalysis(args.name, seed, spec.tokens_per_step, read_texts(args.texts), settings, gradients, args.out)


def cmd_take_live(args) -> None:
    from anisweep.live.take import take

    take(args.live, args.step, args.names.split(","), args.out, empty=_names(args.empty))


def cmd_take_live_local(args) -> None:
    from anisweep.live.take import take

    take(args.source, args.step, args.names.split(","), args.out, run=args.name, empty=_names(args.empty))


def _names(value: str | None) -> list[str]:
    return [name for name in (value or "").split(",") if name]


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

    settings = ExtractSettings(**args.settings)
    if args.threads:
        settings.threads = args.threads
    manifest = json.loads(Path(args.manifest).read_text())
    remove_orphans(args.out)  # half-written tables of a run killed mid-write
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
        if error.errno in _DISK_FULL:
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


def cmd_metrics(args) -> None:
    from anisweep.measures.metrics import checkpoint_metrics
    from anisweep.tables import write_atomic

    write_atomic(checkpoint_metrics(args.extract_dir, args.gradients, args.measure_table or []), args.out)
    if args.spectra_out:
        from anisweep.measures.spectra import checkpoint_spectra

        write_atomic(checkpoint_spectra(args.extract_dir), args.spectra_out)


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


def cmd_plot_gradients(args) -> None:
    import polars as pl

    from anisweep.plots.gradients import plot_gradients

    plot_gradients(pl.read_parquet(args.sweep), Path(args.out_dir), names=args.figures)


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


def cmd_measure(args) -> None:
    from anisweep.measures.registry import MeasureError, load, run_table_measure
    from anisweep.tables import write_atomic

    measure = load(args.entry)
    if measure.kind != "table":
        raise MeasureError(f"measure {args.entry!r} is a stream measure: extract runs it (--stream-measure)")
    write_atomic(run_table_measure(measure, args.extract_dir), args.out)


def cmd_weights(args) -> None:
    """A weight measure of one checkpoint from its weights (the built-in `circuits` without --entry)."""
    from anisweep.weights.fetched import release

    try:
        _weights(args)
    finally:
        release(args.fetched)


def _weights(args) -> None:
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
    from anisweep.measures.registry import measure_frame
    from anisweep.weights.builtin import MEASURE, circuits_of

    rows, pairs = circuits_of(ckpt, args.probe_tokens, args.fetched)
    write_atomic(pair_frame(identity(ckpt), pairs), args.pairs_out)
    write_atomic(measure_frame(MEASURE, identity(ckpt), rows), args.out)


def cmd_logit_lens(args) -> None:
    """The logit lens of one checkpoint from extract's samples and its head's weights (no forward pass)."""
    from anisweep.weights.fetched import release

    try:
        _logit_lens(args)
    finally:
        release(args.fetched)


def _logit_lens(args) -> None:
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


def cmd_plot_circuits(args) -> None:
    import polars as pl

    from anisweep.plots.circuits import plot_circuits
    from anisweep.tables import METRIC_SCHEMA, read_parquet

    weights = pl.concat([read_parquet(path) for path in args.weights])
    if weights.height == 0:  # no layout reads the architecture: the figures say so, under the model's name
        family, model = Path(args.weights[0]).parts[-4:-2]  # results/{family}/{model}/step{N}/weights.parquet
        weights = pl.DataFrame([{"family": family, "model": model}], schema=METRIC_SCHEMA)
    plot_circuits(weights, args.pairs, args.qk, args.ov, args.pairs_figure)


def cmd_plot_logit_lens(args) -> None:
    from anisweep.plots.circuits import plot_logit_lens
    from anisweep.tables import read_parquet

    plot_logit_lens(read_parquet(args.sweep), args.out)


def cmd_plot_measure(args) -> None:
    import polars as pl

    from anisweep.measures.registry import load
    from anisweep.plots.measures import plot_measure

    plot_measure(load(args.entry), pl.read_parquet(args.sweep), Path(args.out))


def cmd_glossary(args) -> None:
    from anisweep.atomic import write_text
    from anisweep.measures.glossary import glossary_markdown
    from anisweep.measures.registry import measures_of

    text = glossary_markdown(measures_of(args.measure or []))
    if args.out:
        write_text(text, Path(args.out))
    else:
        print(text)


def cmd_plot(args) -> None:
    from anisweep.measures.sweep import read_complete_sweeps
    from anisweep.plots.sweep import plot_model

    plot_model(read_complete_sweeps([args.sweep]), Path(args.out_dir))


def cmd_plot_family(args) -> None:
    from anisweep.measures.sweep import read_complete_sweeps
    from anisweep.plots.sweep import plot_family

    plot_family(read_complete_sweeps(args.sweeps), Path(args.out))


def cmd_plot_families(args) -> None:
    from anisweep.measures.sweep import read_complete_sweeps
    from anisweep.plots.families import plot_families

    plot_families(read_complete_sweeps(args.sweeps), Path(args.out))


def cmd_plot_survey(args) -> None:
    from anisweep.measures.sweep import read_complete_sweeps
    from anisweep.plots.survey import plot_survey

    plot_survey(read_complete_sweeps(args.sweeps), Path(args.out_dir), groups=args.groups)


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


def cmd_plot_untrained(args) -> None:
    from anisweep.plots.untrained import plot_untrained

    plot_untrained(Path(args.tables_dir), Path(args.out_dir))


def cmd_qk_svd(args) -> None:
    from anisweep.mechanism.qk_svd import qk_svd
    from anisweep.plots.distributions import qk_svd_figures
    from anisweep.tables import write_atomic

    table, extras = qk_svd([Path(d) for d in args.extract_dirs], args.fraction, args.seed)
    write_atomic(table, args.out)
    qk_svd_figures(table, extras, args.heads, Path(args.figures_dir))


def cmd_plot_score_hist(args) -> None:
    import polars as pl

    from anisweep.plots.distributions import score_hist_figure

    score_hist_figure(pl.concat([pl.read_parquet(p) for p in args.hists]), Path(args.out))


def cmd_plot_spectra(args) -> None:
    import polars as pl

    from anisweep.plots.spectra import spectra_figure

    spectra_figure(pl.concat([pl.read_parquet(p) for p in args.spectra]), Path(args.out))


def cmd_checkpoints(args) -> None:
    import yaml

    from anisweep.config import describe

    config = {}
    for path in args.configfile:
        config.update(yaml.safe_load(Path(path).read_text()) or {})
    for row in describe(config):
        print(json.dumps(row))


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="anisweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train-toy", help="train a toy model and save its checkpoints")
    p.add_argument("--spec", type=_json, required=True, help="JSON: arch, seed, steps and ToySpec fields")
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int)
    p.add_argument("--name", help="live toys: the model's name (its rows' `model`)")
    p.add_argument("--texts", help="live toys: the texts written by `anisweep corpus` (the evaluation batch)")
    p.add_argument("--settings", type=_json, help="live toys: JSON of the config's extract section")
    p.add_argument("--gradients", type=_json, help="live toys: JSON of the config's gradients section")
    p.set_defaults(run=cmd_train_toy)

    p = sub.add_parser("take-live", help="copy one step of a live toy's analysis where extract puts a checkpoint's")
    p.add_argument("--live", required=True, help="the live toy's folder (train-toy --out)")
    p.add_argument("--step", type=int, required=True)
    p.add_argument("--names", required=True, help="comma-separated file names")
    p.add_argument("--empty", help="comma-separated pass tables written without rows where missing (uncovered step)")
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_take_live)

    p = sub.add_parser("take-live-local", help="check (or copy) one step of a local run analysed while it trained")
    p.add_argument("--name", required=True, help="the run's name (the models entry's name)")
    p.add_argument("--source", required=True, help="the folder the callback wrote (the entry's path)")
    p.add_argument("--step", type=int, required=True)
    p.add_argument("--names", required=True, help="comma-separated file names")
    p.add_argument("--empty", help="comma-separated pass tables written without rows where missing (uncovered step)")
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_take_live_local)

    p = sub.add_parser("fetch", help="get one checkpoint's weights")
    p.add_argument("--checkpoint", type=_json, required=True, help="JSON of a checkpoints.base.Checkpoint")
    p.add_argument("--out", required=True)
    p.add_argument("--keep-weights", action="store_true", help="download into the HF cache and keep them there")
    p.add_argument("--retries", type=int, default=5)
    p.add_argument(
        "--texts",
        help="the texts written by `anisweep corpus`: check the checkpoint against them and "
        "--settings before any weights move",
    )
    p.add_argument("--settings", type=_json, default={}, help="JSON of the config's extract section")
    p.add_argument(
        "--audited-sha256",
        type=_json,
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

    p = sub.add_parser("corpus", help="read the evaluation texts once into a Parquet file")
    p.add_argument("--corpus", type=_json, required=True, help="JSON of the config's corpus section")
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_corpus)

    p = sub.add_parser("extract", help="run one checkpoint over the evaluation batch")
    p.add_argument("--manifest", required=True, help="checkpoint.json written by fetch")
    p.add_argument("--corpus", type=_json, default={"source": "builtin"}, help="JSON of the config's corpus section")
    p.add_argument("--texts", help="the texts written by `anisweep corpus` (instead of --corpus)")
    p.add_argument("--settings", type=_json, default={}, help="JSON of the config's extract section")
    p.add_argument("--threads", type=int)
    p.add_argument("--out", required=True)
    p.add_argument(
        "--gradients", type=_json, help="JSON of the config's gradients section: the backward pass's tables too"
    )
    p.add_argument(
        "--stream-measure", action="append", help="module:attribute of a stream measure to run in the forward pass"
    )
    p.set_defaults(run=cmd_extract)

    p = sub.add_parser("metrics", help="every metric of one checkpoint from extract's Parquet")
    p.add_argument("--extract-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--spectra-out", help="spectra.parquet: normalised singular values of the sampled vectors")
    p.add_argument("--gradients", help="the checkpoint's gradients.parquet: its shares become metric rows too")
    p.add_argument("--measure-table", nargs="*", help="tables of the user's measures (measures/{name}.parquet)")
    p.set_defaults(run=cmd_metrics)

    p = sub.add_parser("measure", help="one table measure of one checkpoint, from extract's Parquet")
    p.add_argument("--entry", required=True, help="module:attribute of the measure")
    p.add_argument("--extract-dir", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_measure)

    p = sub.add_parser("weights", help="a weight measure of one checkpoint, from its weights (no forward pass)")
    p.add_argument("--checkpoint", type=_json, required=True, help="the checkpoint, JSON (as fetch takes it)")
    p.add_argument("--entry", help="module:attribute of a user's weight measure (else the built-in circuits)")
    p.add_argument("--out", required=True)
    p.add_argument("--pairs-out", help="the built-in circuits' top token pairs (weight_pairs.parquet)")
    p.add_argument("--probe-tokens", type=int, default=4096, help="the built-in circuits' probe (config weights)")
    p.add_argument(
        "--fetched",
        help="the copy of the checkpoint's weights its fetch shared in this run: read there, then removed (else the "
        "weights are read where they are, or by range requests)",
    )
    p.set_defaults(run=cmd_weights)

    p = sub.add_parser("logit-lens", help="the logit lens of one checkpoint, from extract's samples and its head")
    p.add_argument("--checkpoint", type=_json, required=True, help="the checkpoint, JSON (as fetch takes it)")
    p.add_argument("--extract-dir", required=True)
    p.add_argument("--texts", required=True, help="the corpus extract ran on (resources/corpus.parquet)")
    p.add_argument("--settings", type=_json, required=True, help="JSON of the config's extract section")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--fetched",
        help="the copy of the checkpoint's weights its fetch shared in this run: read there, then removed (else the "
        "weights are read where they are, or by range requests)",
    )
    p.set_defaults(run=cmd_logit_lens)

    p = sub.add_parser("plot-circuits", help="the circuits' figures of one model (its weights.parquet tables)")
    p.add_argument("--weights", nargs="+", required=True, help="weights.parquet of each checkpoint")
    p.add_argument("--qk", required=True, help="qk_circuits.png")
    p.add_argument("--ov", required=True, help="ov_circuits.png")
    p.add_argument("--pairs-figure", required=True, help="circuit_pairs.png")
    p.add_argument("pairs", nargs="*", help="weight_pairs.parquet of each checkpoint")
    p.set_defaults(run=cmd_plot_circuits)

    p = sub.add_parser("plot-logit-lens", help="the logit lens figure of one model's sweep")
    p.add_argument("--sweep", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_plot_logit_lens)

    p = sub.add_parser("plot-measure", help="a measure's figure of one model's sweep")
    p.add_argument("--entry", required=True, help="module:attribute of the measure")
    p.add_argument("--sweep", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_plot_measure)

    p = sub.add_parser("glossary", help="every measure, metric, site and column with its definition (markdown)")
    p.add_argument("--measure", action="append", help="module:attribute of a user's measure to list too")
    p.add_argument("--out", help="write here instead of printing")
    p.set_defaults(run=cmd_glossary)

    p = sub.add_parser("gradients", help="one checkpoint's gradient shares, fits and isotropy from its pass tables")
    p.add_argument("--sums", required=True, help="the checkpoint's gradient_sums.parquet (written by extract)")
    p.add_argument("--sample", required=True, help="the checkpoint's gradient_sample.parquet (written by extract)")
    p.add_argument("--gradients", type=_json, default={}, help="JSON of the config's gradients section")
    p.add_argument("--threads", type=int)
    p.add_argument("--out", required=True, help="the gradients.parquet to write")
    p.add_argument("--bases-out", help="gradient_bases.parquet: the layer-0 bases (gradients.embedding_change)")
    p.set_defaults(run=cmd_gradients)

    p = sub.add_parser(
        "gradient-fixed-shares", help="every checkpoint's gradient shares in the model's fixed subspaces"
    )
    p.add_argument("--fixed-bases", required=True, help="the model's gradient_fixed_bases.parquet")
    p.add_argument("--gradients", type=_json, default={}, help="JSON of the config's gradients section")
    p.add_argument("--threads", type=int)
    p.add_argument("--out", required=True)
    p.add_argument("sums", nargs="+", help="gradient_sums.parquet of every analysed checkpoint, in step order")
    p.set_defaults(run=cmd_gradient_fixed_shares)

    p = sub.add_parser("gradient-fixed-bases", help="subspaces fitted once on an early window of steps, per model")
    p.add_argument("--gradients", type=_json, default={}, help="JSON of the config's gradients section")
    p.add_argument("--out", required=True)
    p.add_argument("hidden", nargs="+", help="hidden.parquet of every swept step in gradients.fit_window")
    p.set_defaults(run=cmd_gradient_fixed_bases)

    p = sub.add_parser("gradients-sweep", help="one model's per-checkpoint gradient tables in one")
    p.add_argument("--out", required=True)
    p.add_argument("--gradients", type=_json, default={}, help="JSON of the config's gradients section")
    p.add_argument("--bases", nargs="*", default=[], help="per-checkpoint gradient_bases.parquet (embedding change)")
    p.add_argument("--embeddings", nargs="*", default=[], help="per-checkpoint embedding_rows.parquet, same order")
    p.add_argument("--fixed-bases", help="the model's gradient_fixed_bases.parquet")
    p.add_argument("--fixed-shares", help="the model's gradient_fixed_shares.parquet (gradients.subspaces fixed|both)")
    p.add_argument("tables", nargs="+")
    p.set_defaults(run=cmd_gradients_sweep)

    p = sub.add_parser("plot-gradients", help="the gradient figures of one model")
    p.add_argument("--sweep", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--figures", nargs="*", help="figure names to draw (default: every one the sweep has data for)")
    p.set_defaults(run=cmd_plot_gradients)

    p = sub.add_parser("sweep", help="one tidy table per model's sweep, from its checkpoints' metrics")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--expected-steps",
        type=_steps,
        default=[],
        help="comma-separated steps the config names; absent ones are listed as missing",
    )
    p.add_argument(
        "--final-step", type=int, help="the step trusted when several steps share weights (the published final model)"
    )
    p.add_argument("--gradient-fixed-shares", help="the model's gradient_fixed_shares.parquet: its rows become metrics")
    p.add_argument("--audit", help="the model's grid.parquet: each step's audit, and a row per step it left out")
    p.add_argument("--flagged-steps", type=_steps, default=[], help="comma-separated steps the audit left out")
    p.add_argument("--seed", type=int, help="the model's seed, for the rows of the steps left out")
    p.add_argument("metrics", nargs="*")
    p.set_defaults(run=cmd_sweep)

    p = sub.add_parser("plot", help="figures of one model's sweep")
    p.add_argument("--sweep", required=True)
    p.add_argument("--out-dir", required=True)
    p.set_defaults(run=cmd_plot)

    p = sub.add_parser("plot-family", help="one figure comparing the models of a family")
    p.add_argument("--out", required=True)
    p.add_argument("sweeps", nargs="+")
    p.set_defaults(run=cmd_plot_family)

    p = sub.add_parser("plot-families", help="one figure comparing families, the same site in every panel")
    p.add_argument("--out", required=True)
    p.add_argument("sweeps", nargs="+")
    p.set_defaults(run=cmd_plot_families)

    p = sub.add_parser("plot-survey", help="Godey et al. 2024 Section 3's figures across every model, at its last step")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--groups", type=_json, default={}, help='JSON {"family/model": group}: a panel per group')
    p.add_argument("sweeps", nargs="+")
    p.set_defaults(run=cmd_plot_survey)

    p = sub.add_parser("untrained", help="the untrained block with an injected common bias (Godey et al. Sec. 4)")
    p.add_argument(
        "--settings", type=_json, default={}, help="JSON of the config's untrained section (keys left out: defaults)"
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

    p = sub.add_parser("plot-untrained", help="figures of the untrained-block experiment")
    p.add_argument("--tables-dir", required=True)
    p.add_argument("--out-dir", required=True)
    p.set_defaults(run=cmd_plot_untrained)

    p = sub.add_parser("qk-svd", help="one model's queries and keys across training on their singular directions")
    p.add_argument("--out", required=True, help="qk_svd.parquet")
    p.add_argument("--figures-dir", required=True)
    p.add_argument("--fraction", type=float, default=1.0, help="share of the q/k sample the SVD is computed on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--heads", type=_json, default='"auto"', help='JSON: "auto" or [[layer, head], ...] to plot')
    p.add_argument("extract_dirs", nargs="+", help="the model's per-step extract folders")
    p.set_defaults(run=cmd_qk_svd)

    p = sub.add_parser("plot-score-hist", help="one model's pre-softmax score histograms over training")
    p.add_argument("--out", required=True)
    p.add_argument("hists", nargs="+", help="the model's score_hist.parquet, one per step")
    p.set_defaults(run=cmd_plot_score_hist)

    p = sub.add_parser("plot-spectra", help="one model's normalised singular-value spectra over training")
    p.add_argument("--out", required=True)
    p.add_argument("spectra", nargs="+", help="spectra.parquet of each checkpoint")
    p.set_defaults(run=cmd_plot_spectra)

    p = sub.add_parser("checkpoints", help="list the checkpoints a config names, as JSON lines")
    p.add_argument("--configfile", nargs="+", required=True)
    p.set_defaults(run=cmd_checkpoints)
    return top


def _checkpoint_key(args) -> str | None:
    """`{family}/{model}/step{N}` of the checkpoint a command works on, for its error message."""
    try:
        if args.command == "fetch":
            c = args.checkpoint
            return f"{c['family']}/{c['model']}/step{c['step']}"
        if args.command in ("weights", "logit-lens"):
            c = args.checkpoint
            return f"{c['family']}/{c['model']}/step{c['step']}"
        if args.command == "extract":
            m = json.loads(Path(args.manifest).read_text())
            return f"{m['family']}/{m['model']}/step{m['step']}"
    except Exception:  # an unreadable manifest is reported as the error itself
        pass
    folder = {
        "extract": getattr(args, "out", None),
        "metrics": getattr(args, "extract_dir", None),
        "measure": getattr(args, "extract_dir", None),
        "gradients": str(Path(getattr(args, "out", None) or ".").parent),
    }.get(args.command)
    if folder and Path(folder).name.startswith("step") and len(Path(folder).parts) >= 3:
        return "/".join(Path(folder).parts[-3:])  # results/{family}/{model}/step{N}
    return None


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _causes(error: BaseException):
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def _error_line(key: str | None, error: BaseException) -> str:
    """`{key}: {type}: {message}` on one line (the key once, even where the message starts with it)."""
    text = " ".join(str(error).split()) or repr(error)
    if key and text.startswith(f"{key}: "):
        text = text[len(key) + 2 :]
    line = f"{type(error).__name__}: {text}"
    if isinstance(error, MemoryError) or "OutOfMemoryError" in type(error).__name__:
        line += " (out of memory: lower extract.batch_size, or give the job more memory)"
    full = next((e for e in _causes(error) if isinstance(e, OSError) and e.errno in _DISK_FULL), None)
    if full is not None:
        where = f" holding {full.filename}" if full.filename else ""
        line += (
            f" (the disk{where} is full or over quota: free space there and run again; nothing half-written "
            "is left under a real name, and the rerun does only what is missing)"
        )
    return line if key is None else f"{key}: {line}"


def _usage_error(args) -> str | None:
    """What is wrong with a command line that parses, told before it runs (no traceback: exit status 2, as argparse
    gives a command line it cannot parse)."""
    if args.command == "audit" and args.family == "hub" and not args.config:
        return (
            f"audit hub {args.name}: a `hub` model's checkpoints are those its models entry names (revision: "
            '"step{step}", a branch each; subfolder: "checkpoint-{step}", a folder each); give --config CONFIG, a '
            "config whose models entry has that name"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one command. A failure prints its traceback, then one last line naming the checkpoint and the
    cause (`toy/toy-neox/step8: SafetensorError: ...`), which the rules repeat on the console; exit 1."""
    args = parser().parse_args(argv)
    if problem := _usage_error(args):
        print(f"anisweep: error: {problem}", file=sys.stderr, flush=True)
        return 2
    try:
        args.run(args)
    except Exception as error:  # every failure is reported the same way
        import traceback

        traceback.print_exc(file=sys.stderr)
        print(_error_line(_checkpoint_key(args), error), file=sys.stderr, flush=True)
        return 1
    return 0
