"""One forward pass of the base model per checkpoint, with streaming reductions (anisweep.extract.recorder) and
the tables they give (anisweep.extract.tables).

Attention runs through a registered attention function (`anisweep`) that sees post-rotary q and k and
computes the probabilities one layer at a time, so no layer's attention map outlives its own forward.
Residual-stream and LayerNorm sites are read by forward hooks; the adapter says where they are.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import polars as pl
import torch
from tqdm.auto import tqdm

from anisweep.atomic import write_text
from anisweep.checkpoints import preflight
from anisweep.checkpoints.weight_files import WeightFiles
from anisweep.corpus import unknown_token_share
from anisweep.extract.attention_torch import Workers
from anisweep.extract.masked import masked_pass
from anisweep.extract.model import ExtractSettings, LoadedModel, load_model
from anisweep.extract.qk_sample import QKSample
from anisweep.extract.recorder import Hooks, Recorder, Sample, attention_kernel, recording
from anisweep.extract.score_hist import ScoreHistogram
from anisweep.extract.stream_measures import StreamMeasures
from anisweep.extract.streaming import Units, to_device
from anisweep.extract.tables import tables
from anisweep.measures.registry import Measure
from anisweep.tables import IDENTITY, write_atomic


@torch.inference_mode()
def run(
    loaded: LoadedModel,
    batch: dict,
    settings: ExtractSettings,
    progress: bool = True,
    stream: StreamMeasures | None = None,
) -> Recorder:
    """Stream the evaluation batch through the base model in mini-batches and return the accumulators; `stream`,
    the user's stream measures, listen in."""
    device = next(loaded.model.parameters()).device
    # the positions the tables cover: the tokens, the sequence the adapter records instead (CANINE's molecules), or
    # the patches, frames or cells of an image or audio model (an adapter may add inputs: Whisper's decoder tokens)
    covered_ids, covered = loaded.adapter.positions(loaded.base, batch)
    inputs = model_inputs(batch)
    sample = Sample.draw(covered_ids, covered, settings.sample_tokens, settings.seed)
    workers = Workers(torch.get_num_threads() if device.type == "cpu" else 1)
    g = loaded.geometry
    ropes = ("pre", "post") if g.rotary_dims else ("pre",)
    qk_sample = (
        None
        if not g.n_heads or g.layer_heads  # no attention (a CNN), or heads that change width (MiT, CvT)
        else QKSample(
            sample,
            settings.qk_sample_tokens,
            settings.seed,
            g.n_heads,
            g.d_head,
            [(i, r) for i in range(g.n_layers) for r in ropes],
            device,
        )
    )
    bins = settings.score_bins
    score_hist = (
        None
        if bins is None or not g.n_heads or g.layer_heads
        else ScoreHistogram(g.n_layers, bins["low"], bins["high"], bins["n"], device)
    )
    recorder = Recorder(
        g,
        sample,
        device,
        workers,
        attention_kernel(settings.attention, device),
        qk_sample=qk_sample,
        score_hist=score_hist,
        stream=stream,
        units=Units.of(covered.shape[0], settings.units),
    )
    recorder.n_positions = int(covered.sum())
    recorder.token_ids = covered_ids  # the outlier tables name their tokens by it (extract.outlier_tables)
    recorder.grid_token_ids = loaded.adapter.other_token_ids(batch)  # and by these, on another sequence's sites
    recorder.grid_sampling = (covered.shape[0], settings.sample_tokens, settings.seed)
    try:
        with recording(recorder), Hooks(loaded.adapter, loaded.base, loaded.geometry, recorder):
            starts = range(0, covered.shape[0], settings.batch_size)
            for start in tqdm(starts, desc="extract", unit="batch", disable=not progress, leave=False):
                rows = slice(start, start + settings.batch_size)
                chunk = {name: to_device(x[rows], device) for name, x in inputs.items()}
                recorder.begin_batch(to_device(covered[rows], device), start, host_valid=covered[rows])
                loaded.adapter.forward_batch(loaded.base, chunk)  # the base model, no KV cache to fill
            recorder.finish()
        if loaded.adapter.masked_lm and not g.causal:  # an MLM's states at masked tokens (extract.masked)
            recorder.masked = masked_pass(loaded.base, batch, settings.batch_size, settings.seed, device)
    finally:
        workers.close()
    return recorder


def model_inputs(batch: dict) -> dict[str, torch.Tensor]:
    """The evaluation batch's tensors the model takes (all but make_batch's `unknown_mask`)."""
    return {name: x for name, x in batch.items() if name != "unknown_mask" and isinstance(x, torch.Tensor)}


def timed_run(loaded: LoadedModel, batch: dict, settings: ExtractSettings, progress: bool = True, stream=None):
    """`run`, and the seconds it took."""
    started = time.perf_counter()
    recorder = run(loaded, batch, settings, progress=progress, stream=stream)
    return recorder, time.perf_counter() - started


def extract_info(
    checkpoint: dict, settings: ExtractSettings, device, batch: dict, recorder: Recorder, seconds: float
) -> dict:
    """extract.json's content: the checkpoint (a fetch manifest with the hashes of the weights loaded, or a live
    model's identity), the settings, and what the forward pass over `batch` on `device` took and met (the share of
    unknown tokens among its valid tokens: null for a batch without make_batch's `unknown_mask`)."""
    # text: the tokens read; images and audio: the positions recorded (patches, frames, cells)
    n_valid = int(batch["attention_mask"].sum()) if "input_ids" in batch else recorder.n_positions
    return {
        "checkpoint": checkpoint,
        "settings": asdict(settings),
        "device": str(device),
        "n_valid_tokens": n_valid,
        "unknown_token_share": unknown_token_share(batch),
        "forward_seconds": seconds,
        "tokens_per_second": n_valid / seconds if seconds else None,
        "nonfinite_tokens": sum(s.n_nonfinite for s in recorder.vectors.values()),
    }


def write_extract(out_dir: str | Path, tables: dict[str, pl.DataFrame], info: dict) -> None:
    """Write every table, `{name}.parquet`, then extract.json (`info`) into `out_dir`, each whole and renamed:
    extract.json last, so that a folder holding one holds every table."""
    out_dir = Path(out_dir)
    for name, df in tables.items():
        (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(df, out_dir / f"{name}.parquet")
    write_text(json.dumps(info, indent=2, default=str), out_dir / "extract.json")


def extract_checkpoint(
    manifest: dict,
    texts: list[str],
    settings: ExtractSettings,
    out_dir: Path,
    progress: bool = True,
    more_tables: Callable[[LoadedModel, dict, dict], dict[str, pl.DataFrame]] | None = None,
    stream_measures: Sequence[Measure] = (),
) -> dict:
    """Load the checkpoint a fetch manifest names, run it over the evaluation batch, write every table.
    `more_tables(loaded, batch, ident)`, when given, adds tables of its own from the same loaded model (the
    gradient analysis's backward pass: anisweep.tangent.checkpoint.pass_tables_for), written with extract's;
    where its `needs_lm_head` is true, a checkpoint lacking its LM head is an error before anything runs.
    `stream_measures`, the user's stream measures, listen in the forward pass and write `measures/{name}`.
    The weight files are hashed right before they are loaded, and checked unchanged after: extract.json's
    `checkpoint` is the manifest with these hashes (anisweep.checkpoints.weight_files)."""
    if settings.threads:
        torch.set_num_threads(settings.threads)
    where = f"{manifest['family']}/{manifest['model']}/step{manifest['step']}"
    target = settings.torch_device()
    batch = preflight.evaluation_batch(manifest["path"], manifest.get("tokenizer_path"), settings, texts, where)
    weights = WeightFiles.read(manifest["path"])  # the hash is of the bytes loaded next, not of fetch's
    head_needed = bool(getattr(more_tables, "needs_lm_head", False))
    loaded = load_model(
        manifest["path"],
        settings.dtype,
        target,
        head_needed=head_needed,
        trust_remote_code=bool(manifest.get("trust_remote_code")),  # a `hub` entry's, recorded in extract.json
    )
    weights.check_unchanged(where)
    stream = StreamMeasures(stream_measures, loaded.geometry, where) if stream_measures else None
    recorder, seconds = timed_run(loaded, batch, settings, progress=progress, stream=stream)
    ident = {key: manifest.get(key) for key in IDENTITY}
    info = extract_info({**manifest, **weights.manifest()}, settings, target, batch, recorder, seconds)
    info |= {"initialised_tensors": list(loaded.initialised), "ignored_tensors": list(loaded.ignored)}
    written = tables(recorder, loaded, ident, precision=settings.sample_precision)
    if stream is not None:
        written |= stream.tables(ident)
    if more_tables is not None:
        written |= more_tables(loaded, batch, ident)
    write_extract(out_dir, written, info)
    return info
