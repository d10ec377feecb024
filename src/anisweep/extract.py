"""One forward pass of the base model per checkpoint, with streaming reductions in hooks.

Attention runs through a registered attention function (`anisweep`) that sees post-rotary q and k and
computes the probabilities one layer at a time, so no layer's attention map outlives its own forward.
Residual-stream and LayerNorm sites are read by forward hooks; the adapter says where they are.
"""

from __future__ import annotations

import contextvars
import json
import math
import threading
import time
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import cache, partial
from pathlib import Path

import numpy as np
import polars as pl
import torch
from torch import nn
from tqdm.auto import tqdm

from . import config, geometry, preflight
from .adapters import Adapter, Geometry, adapter_for
from .atomic import write_text
from .device import torch_device as resolve_device
from .streaming import (
    ROW_FIELDS,
    AttentionStats,
    HeadVectorStats,
    VectorStats,
    VisibleKeys,
    masked_exp_,
    row_statistics,
)
from .tables import ATTENTION_STATISTICS, EXTRACT_TABLES, with_identity, write_atomic

ATTENTION_NAME = "anisweep"
SAMPLED_SITES = ("resid", "final_ln_in", "final_ln_out")
CHUNK_ELEMENTS = 2**20
ROW_BLOCKS, MIN_ROW_BLOCK = 8, 32
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_ACTIVE: contextvars.ContextVar[Recorder] = contextvars.ContextVar("anisweep_recorder")


_DEFAULTS = config.defaults("extract")


@dataclass
class ExtractSettings:
    """The config's `extract` section; the defaults are the schema's (anisweep/config.schema.yaml)."""

    n_sequences: int = _DEFAULTS["n_sequences"]
    seq_len: int = _DEFAULTS["seq_len"]
    batch_size: int = _DEFAULTS["batch_size"]
    sample_tokens: int = _DEFAULTS["sample_tokens"]
    device: str = _DEFAULTS["device"]
    dtype: str = _DEFAULTS["dtype"]
    seed: int = _DEFAULTS["seed"]
    attention: str = _DEFAULTS["attention"]  # auto: the Triton kernel on CUDA, torch ops elsewhere
    threads: int | None = None  # resources.extract_threads

    def torch_device(self) -> torch.device:
        return resolve_device(self.device)


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention that also records q/k means and attention statistics for the active Recorder.

    transformers passes no mask to a custom attention function; the recorder builds padding and causal
    masks from the batch, which reproduces eager attention exactly on every valid position.
    """
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    return _ACTIVE.get().attend(module.layer_idx, query, key, value, scaling), None


class Workers:
    """Threads that each run torch single-threaded, for the attention chunks.

    A layer's attention statistics are hundreds of small ops. Spread over OpenMP threads, every op
    waits at a barrier for all of them, which costs up to milliseconds per op when other jobs share
    the cores; spread over chunks instead, no op waits for another thread. The model's own ops keep
    the job's threads. A few tasks (short sequences) run inline, where the hand-off to the pool
    would cost more than it saves; with one thread, or on a GPU, everything runs inline.
    """

    MIN_TASKS_PER_THREAD = 8

    def __init__(self, n: int):
        self.n, self.pool = n, None
        if n > 1:
            started = threading.Barrier(n)
            self.pool = ThreadPoolExecutor(n, thread_name_prefix="anisweep-stats")
            # torch keeps one thread count per thread, but a thread that has not yet used torch copies
            # the last count set anywhere: pin every worker to 1, then set the job's count back.
            list(self.pool.map(lambda _: _single_threaded(started), range(n)))
            torch.set_num_threads(n)

    def run(self, tasks) -> list:
        if self.pool is None or len(tasks) < self.MIN_TASKS_PER_THREAD * self.n:
            return [task() for task in tasks]
        return list(self.pool.map(_run_inference, tasks))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


class Scratch(threading.local):
    """Buffers that each thread reuses for its chunks' scores and exponentials. A fresh tensor of a few MB
    per chunk is fresh memory from the kernel, and its page faults can cost as much as the arithmetic."""

    def __init__(self):
        self.buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        n = math.prod(shape)
        buffer = self.buffers.get(name)
        if buffer is None or buffer.numel() < n or buffer.dtype != like.dtype or buffer.device != like.device:
            buffer = self.buffers[name] = torch.empty(n, dtype=like.dtype, device=like.device)
        return buffer[:n].view(shape)


def _run_inference(task):
    with torch.inference_mode():  # a thread-local mode: workers do not inherit it
        return task()


def _single_threaded(started: threading.Barrier) -> None:
    torch.get_num_threads()
    torch.set_num_threads(1)
    started.wait()  # so that each of the n calls runs on its own thread


def _chunks(n_seqs: int, n_heads: int, n_scores: int, device: torch.device, shared: bool):
    """(sequences, heads) slices whose n_scores each are processed together: on CPU about CHUNK_ELEMENTS
    scores, so that a chunk's scores and probabilities stay in cache and its ops are few enough that
    their fixed costs do not add up; on a GPU, a whole sequence. A chunk spans several sequences only
    when they share one mask (`shared`)."""
    per_chunk = max(1, CHUNK_ELEMENTS // n_scores) if device.type == "cpu" else n_heads
    if per_chunk < n_heads or not shared:
        step = min(per_chunk, n_heads)
        return [
            (slice(seq, seq + 1), slice(first, first + step))
            for seq in range(n_seqs)
            for first in range(0, n_heads, step)
        ]
    step = per_chunk // n_heads
    return [(slice(first, first + step), slice(None)) for first in range(0, n_seqs, step)]


def _row_blocks(seq_len: int, causal: bool) -> list[slice]:
    """Query rows processed together. Causal row blocks skip the keys no row of the block sees, which
    saves ~40% of the work: the scores of rows [r0, r1) are computed against keys [0, r1) only."""
    if not causal:
        return [slice(0, seq_len)]
    size = max(MIN_ROW_BLOCK, seq_len // ROW_BLOCKS)
    return [slice(r0, min(r0 + size, seq_len)) for r0 in range(0, seq_len, size)]


def attention_kernel(choice: str, device: torch.device):
    """The module whose `attend` runs a layer's attention (anisweep.attention_triton), or None for the torch
    ops. `auto` takes Triton on CUDA when it imports, else falls back with one warning."""
    if choice == "torch" or (choice == "auto" and device.type != "cuda"):
        return None
    if choice == "triton":
        from . import attention_triton

        return attention_triton
    return _triton_or_warn()


@cache
def _triton_or_warn():
    try:
        from . import attention_triton
    except ImportError as error:
        warnings.warn(
            f"extract: Triton does not import ({error}); attention runs as torch ops, slower on a GPU", stacklevel=2
        )
        return None
    return attention_triton


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, attention_forward)


def _first_tensor(output):
    return output[0] if isinstance(output, (tuple, list)) else output


@dataclass
class Sample:
    """The seeded sample of valid tokens kept whole for hidden.parquet: global (seq, position) pairs."""

    seq: torch.Tensor
    position: torch.Tensor
    token_id: torch.Tensor

    @classmethod
    def draw(cls, input_ids: torch.Tensor, valid: torch.Tensor, n: int, seed: int) -> Sample:
        seqs, positions = valid.nonzero(as_tuple=True)
        if n < seqs.numel():
            generator = torch.Generator().manual_seed(seed)
            keep = torch.randperm(seqs.numel(), generator=generator)[:n].sort().values
            seqs, positions = seqs[keep], positions[keep]
        return cls(seqs, positions, input_ids[seqs, positions])


@dataclass
class Recorder:
    """Accumulators for one checkpoint, fed mini-batch by mini-batch by hooks and the attention function."""

    geometry: Geometry
    sample: Sample
    device: torch.device
    workers: Workers = field(default_factory=lambda: Workers(1))
    kernel: object = None  # attention_kernel's choice: None for the torch ops below
    valid: torch.Tensor = field(init=False)
    scratch: Scratch = field(init=False, default_factory=Scratch)

    def __post_init__(self):
        g, dev = self.geometry, self.device
        ropes = ("pre", "post") if g.rotary_dims else ("pre",)
        self.q = {
            (layer, rope): HeadVectorStats(g.n_heads, g.d_head, dev) for layer in range(g.n_layers) for rope in ropes
        }
        self.k = {
            (layer, rope): HeadVectorStats(g.n_heads, g.d_head, dev) for layer in range(g.n_layers) for rope in ropes
        }
        self.attention = {layer: AttentionStats(g.n_heads, dev) for layer in range(g.n_layers)}
        self.vectors: dict[tuple[int, str], VectorStats] = {}
        self.samples: dict[tuple[int, str], torch.Tensor] = {}  # (n sampled tokens, d) float32 on the CPU
        self._batch_sample = None
        self._recent: list[tuple[weakref.ref, dict]] = []

    def begin_batch(self, valid: torch.Tensor, first_seq: int) -> None:
        """Set the masks and the sampled positions of the mini-batch about to run."""
        self.valid = valid
        self.all_valid = bool(valid.all())
        self._recent = []
        t = valid.shape[1]
        hidden = ~valid[:, None, :].expand(-1, t, -1)
        if self.geometry.causal:
            hidden = hidden | torch.ones(t, t, dtype=torch.bool, device=valid.device).triu(1)
        if self.all_valid:  # one mask for the whole mini-batch when there is no padding; else one per sequence
            hidden = hidden[:1]
        self.blocks = []  # (query rows, VisibleKeys of each sequence (or of all))
        for rows in _row_blocks(t, self.geometry.causal):
            n_keys = rows.stop if self.geometry.causal else t
            self.blocks.append((rows, [VisibleKeys.build(h[rows, :n_keys]) for h in hidden]))
        n_visible = [torch.cat([keys[i].n_visible for _, keys in self.blocks]) for i in range(len(hidden))]
        self.n_visible = torch.stack(n_visible).expand(valid.shape[0], -1)
        host_valid = valid.cpu()  # the batch's counts, copied once before its forward: no layer waits for them
        self.n_valid, self.row_counts = int(host_valid.sum()), AttentionStats.counts(host_valid, self.n_visible.cpu())
        in_batch = ((self.sample.seq >= first_seq) & (self.sample.seq < first_seq + valid.shape[0])).nonzero()
        sample_rows = slice(int(in_batch[0]), int(in_batch[-1]) + 1) if len(in_batch) else slice(0, 0)
        flat_index = (self.sample.seq[sample_rows] - first_seq) * t + self.sample.position[sample_rows]
        self._batch_sample = (sample_rows, flat_index.to(valid.device))

    def attend(self, layer, query, key, value, scaling) -> torch.Tensor:
        """Attention output (B, T, H, d_head) of one layer; records its q/k means and row statistics."""
        rope = "post" if self.geometry.rotary_dims else "pre"
        self.q[(layer, rope)].update(query, self.valid, self.all_valid, self.n_valid)
        self.k[(layer, rope)].update(key, self.valid, self.all_valid, self.n_valid)
        if self.kernel is not None and self.kernel.supports(query):
            output, row_stats = self.kernel.attend(query, key, value, scaling, self.valid, self.geometry.causal)
            self.attention[layer].update(row_stats, self.valid, self.n_visible, self.row_counts)
            return output.transpose(1, 2).contiguous()
        b, h, t, _ = query.shape
        output = value.new_empty(b, h, t, value.shape[-1])
        row_stats = query.new_empty(b, h, t, len(ROW_FIELDS), dtype=torch.float32)
        query, key = query.float(), key.float()
        zero = query.new_zeros(())

        def chunk(seqs, heads, rows, keys):
            keys_slice = slice(0, keys.n_keys)
            # a view whenever the chunk is one sequence or whole heads, as _chunks makes them: the out=
            # writes below land in row_stats and output
            flat = lambda x, pos: x[seqs, heads, pos].flatten(0, 1)  # noqa: E731
            q, k = flat(query, rows), flat(key, keys_slice)
            chunk_rows, chunk_output = flat(row_stats, rows), flat(output, rows)
            shape = (q.shape[0], q.shape[1], k.shape[1])
            scores = torch.baddbmm(
                zero, q, k.transpose(-1, -2), beta=0.0, alpha=scaling, out=self.scratch.get("scores", shape, q)
            )
            e = masked_exp_(scores, keys, chunk_rows, out=self.scratch.get("e", shape, q))
            torch.bmm(e.to(value.dtype), flat(value, keys_slice), out=chunk_output)
            chunk_output.div_(chunk_rows[..., ROW_FIELDS.index("z"), None])
            row_statistics(scores, e, keys, chunk_rows)

        tasks = []
        for rows, keys in self.blocks:
            n_scores = (rows.stop - rows.start) * keys[0].n_keys
            for seqs, heads in _chunks(b, h, n_scores, query.device, self.all_valid):
                tasks.append(partial(chunk, seqs, heads, rows, keys[0 if self.all_valid else seqs.start]))
        self.workers.run(tasks)
        self.attention[layer].update(row_stats, self.valid, self.n_visible, self.row_counts)
        return output.transpose(1, 2).contiguous()

    def record_pre_rotary(self, layer, q, k) -> None:
        self.q[(layer, "pre")].update(q, self.valid, self.all_valid, self.n_valid)
        self.k[(layer, "pre")].update(k, self.valid, self.all_valid, self.n_valid)

    def reserve(self, layer: int, site: str) -> None:
        """Allocate a hooked site's accumulators and sample buffer once, before any forward pass: every
        batch writes into them, and nothing that outlives a pass is allocated amid the model's temporaries."""
        key = (layer, site)
        self.vectors[key] = VectorStats(self.geometry.d_model, self.device)
        if site in SAMPLED_SITES:
            self.samples[key] = torch.empty(len(self.sample.seq), self.geometry.d_model)

    def record_vectors(self, layer: int, site: str, x: torch.Tensor) -> None:
        key = (layer, site)
        self.vectors[key].add(self._vector_parts(x))
        if site in SAMPLED_SITES:
            rows, index = self._batch_sample  # the sample is sorted: its rows in this batch are a slice
            flat, target = x.reshape(-1, x.shape[-1]), self.samples[key][rows]
            if flat.dtype == target.dtype and flat.device == target.device:
                torch.index_select(flat, 0, index, out=target)
            else:
                target.copy_(flat[index])

    def _vector_parts(self, x: torch.Tensor) -> dict:
        """VectorStats sums of x. Several sites often hold one tensor (a block's output is the next
        block's LayerNorm input, twice with a parallel residual; no hooked module changes its input in
        place): the sums of the last few tensors are kept, by weak reference so that no tensor outlives
        its use."""
        for ref, part in self._recent:
            if ref() is x:
                return part
        part = VectorStats.partial(x, self.valid)
        self._recent = [(weakref.ref(x), part)] + self._recent[:3]
        return part


class Hooks:
    """Forward hooks that feed a Recorder; a context manager so they never outlive the extraction."""

    def __init__(self, adapter: Adapter, base: nn.Module, geometry: Geometry, recorder: Recorder):
        self.handles = []
        for site in adapter.resid_sites(base):
            recorder.reserve(site.layer, "resid")
            self._add(
                site.module, lambda m, a, o, layer=site.layer: recorder.record_vectors(layer, "resid", _first_tensor(o))
            )
        for site in adapter.layernorm_sites(base):
            recorder.reserve(site.layer, f"{site.site}_in")
            recorder.reserve(site.layer, f"{site.site}_out")

            def on_layernorm(module, args, output, layer=site.layer, name=site.site):
                recorder.record_vectors(layer, f"{name}_in", args[0])
                recorder.record_vectors(layer, f"{name}_out", _first_tensor(output))

            self._add(site.module, on_layernorm)
        for site in adapter.pre_rotary_qk(base, geometry):

            def on_qkv(module, args, output, layer=site.layer, split=site.split):
                recorder.record_pre_rotary(layer, *split(output))

            self._add(site.module, on_qkv)

    def _add(self, module: nn.Module, fn) -> None:
        self.handles.append(module.register_forward_hook(fn))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()


def load_model(path: str | Path, dtype: str = "float32", device: torch.device | str = "cpu"):
    """Load a checkpoint with the recording attention; returns (model, base model, adapter, geometry).

    The LM class is loaded when the checkpoint has one, so that the output embedding is available for
    I(W); only the base model ever runs.
    """
    import transformers

    _register_attention()
    config = transformers.AutoConfig.from_pretrained(path)
    adapter = adapter_for(config)
    arch = (config.architectures or [None])[0]
    cls = getattr(transformers, arch) if arch in adapter.architectures else transformers.AutoModel
    model = cls.from_pretrained(path, dtype=DTYPES[dtype], attn_implementation=ATTENTION_NAME)
    model.to(device).eval()
    return model, adapter.base_model(model), adapter, adapter.geometry(model.config)


@torch.inference_mode()
def run(model_parts, batch: dict, settings: ExtractSettings, progress: bool = True) -> Recorder:
    """Stream the evaluation batch through the base model in mini-batches and return the accumulators."""
    model, base, adapter, geometry = model_parts
    device = next(model.parameters()).device
    input_ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    sample = Sample.draw(input_ids, mask, settings.sample_tokens, settings.seed)
    workers = Workers(torch.get_num_threads() if device.type == "cpu" else 1)
    recorder = Recorder(geometry, sample, device, workers, attention_kernel(settings.attention, device))
    token = _ACTIVE.set(recorder)
    try:
        with Hooks(adapter, base, geometry, recorder):
            starts = range(0, input_ids.shape[0], settings.batch_size)
            for start in tqdm(starts, desc="extract", unit="batch", disable=not progress, leave=False):
                ids = input_ids[start : start + settings.batch_size].to(device)
                valid = mask[start : start + settings.batch_size].to(device)
                recorder.begin_batch(valid, start)
                base(input_ids=ids, attention_mask=valid.long())
    finally:
        _ACTIVE.reset(token)
        workers.close()
    return recorder


def _f32_lists(array: np.ndarray) -> pl.Series:
    return pl.Series(array.astype(np.float32).tolist(), dtype=pl.List(pl.Float32))


def qk_table(recorder: Recorder) -> pl.DataFrame:
    rows = []
    for (layer, rope), q_stats in sorted(recorder.q.items()):
        k_stats = recorder.k[(layer, rope)]
        n = max(q_stats.n, 1)
        q_mean = (q_stats.sum_x / n).cpu().numpy()
        k_mean = (k_stats.sum_x / n).cpu().numpy()
        for head in range(q_mean.shape[0]):
            cos, score = geometry.qk_alignment(q_mean[head], k_mean[head])
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "rope": rope,
                    "n_tokens": q_stats.n,
                    "q_mean": q_mean[head],
                    "k_mean": k_mean[head],
                    "q_norm_mean": float(q_stats.sum_norm[head]) / n,
                    "k_norm_mean": float(k_stats.sum_norm[head]) / n,
                    "qk_cos": cos,
                    "qk_mean_score": score,
                }
            )
    df = pl.DataFrame([{k: v for k, v in r.items() if k not in ("q_mean", "k_mean")} for r in rows])
    return df.with_columns(
        _f32_lists(np.stack([r["q_mean"] for r in rows])).alias("q_mean"),
        _f32_lists(np.stack([r["k_mean"] for r in rows])).alias("k_mean"),
    ).select(
        "layer", "head", "rope", "n_tokens", "q_mean", "k_mean", "q_norm_mean", "k_norm_mean", "qk_cos", "qk_mean_score"
    )


def attention_table(recorder: Recorder) -> pl.DataFrame:
    rows = []
    for layer, stats in sorted(recorder.attention.items()):
        means = {name: value.cpu().numpy() for name, value in stats.means().items()}
        for head in range(recorder.geometry.n_heads):
            rows.append(
                {
                    "layer": layer,
                    "head": head,
                    "n_rows": stats.n_rows,
                    **{name: float(value[head]) for name, value in means.items()},
                }
            )
    return pl.DataFrame(rows).select("layer", "head", "n_rows", *ATTENTION_STATISTICS)


def hidden_stats_table(recorder: Recorder) -> pl.DataFrame:
    rows = []
    for (layer, site), s in sorted(recorder.vectors.items()):
        rows.append(
            {
                "layer": layer,
                "site": site,
                "n": s.n,
                "n_nonfinite": s.n_nonfinite,
                "d": s.sum_x.numel(),
                "sum_norm": s.sum_norm,
                "sum_norm_sq": s.sum_norm_sq,
                "norm_min": s.norm_min if s.n else None,
                "norm_max": s.norm_max if s.n else None,
            }
        )
    df = pl.DataFrame(rows)
    sums = lambda attr: pl.Series(  # noqa: E731
        [getattr(s, attr).cpu().numpy().tolist() for _, s in sorted(recorder.vectors.items())],
        dtype=pl.List(pl.Float64),
    )
    return df.with_columns(sums("sum_x").alias("sum_x"), sums("sum_unit").alias("sum_unit"))


def hidden_table(recorder: Recorder) -> pl.DataFrame:
    frames = []
    sample = recorder.sample
    for (layer, site), vectors in sorted(recorder.samples.items()):
        vectors = vectors.numpy()
        frames.append(
            pl.DataFrame(
                {
                    "layer": np.full(len(vectors), layer, dtype=np.int64),
                    "site": [site] * len(vectors),
                    "seq": sample.seq.numpy().astype(np.int64),
                    "position": sample.position.numpy().astype(np.int64),
                    "token_id": sample.token_id.numpy().astype(np.int64),
                }
            ).with_columns(pl.Series("vector", vectors.astype(np.float32)).cast(pl.List(pl.Float32)))
        )
    return pl.concat(frames)


def layernorm_table(adapter: Adapter, base: nn.Module) -> pl.DataFrame:
    rows = []
    for site in adapter.layernorm_sites(base):
        ln = site.module
        bias = None if getattr(ln, "bias", None) is None else ln.bias.detach().float().cpu().numpy().tolist()
        rows.append(
            {
                "layer": site.layer,
                "site": site.site,
                "eps": float(ln.eps),
                "gain": ln.weight.detach().float().cpu().numpy().tolist(),
                "bias": bias,
            }
        )
    return pl.DataFrame(
        rows,
        schema={
            "layer": pl.Int64,
            "site": pl.String,
            "eps": pl.Float64,
            "gain": pl.List(pl.Float32),
            "bias": pl.List(pl.Float32),
        },
    )


def embeddings_table(adapter: Adapter, model: nn.Module) -> pl.DataFrame:
    """I(W) of the embedding matrices, here because the matrices never leave extract."""
    matrices = adapter.embedding_matrices(model)
    tied = "embed_out" in matrices and matrices["embed_out"].data_ptr() == matrices["embed_in"].data_ptr()
    rows = []
    for name, weight in matrices.items():
        w = weight.detach().float().cpu().numpy()
        for centre in (False, True):
            rows += [
                {
                    "matrix": name,
                    "tied": tied,
                    "n_rows": w.shape[0],
                    "d": w.shape[1],
                    "metric": f"{metric}_centred" if centre else metric,
                    "value": value,
                }
                for metric, value in geometry.partition_isotropies(w, centre=centre).items()
            ]
    return pl.DataFrame(rows)


def tables(recorder: Recorder, model_parts, ident: dict) -> dict[str, pl.DataFrame]:
    """Every table of `tables.EXTRACT_TABLES`, in that order, with the identity columns."""
    model, base, adapter, _ = model_parts
    build = {
        "qk": lambda: qk_table(recorder),
        "attention": lambda: attention_table(recorder),
        "hidden": lambda: hidden_table(recorder),
        "hidden_stats": lambda: hidden_stats_table(recorder),
        "layernorm": lambda: layernorm_table(adapter, base),
        "embeddings": lambda: embeddings_table(adapter, model),
    }
    return {name: with_identity(build[name](), ident) for name in EXTRACT_TABLES}


def extract_checkpoint(
    manifest: dict, texts: list[str], settings: ExtractSettings, out_dir: Path, progress: bool = True
) -> dict:
    """Load the checkpoint a fetch manifest names, run it over the evaluation batch, write every table."""
    if settings.threads:
        torch.set_num_threads(settings.threads)
    where = f"{manifest['family']}/{manifest['model']}/step{manifest['step']}"
    target = settings.torch_device()
    batch = preflight.evaluation_batch(manifest["path"], manifest.get("tokenizer_path"), settings, texts, where)
    parts = load_model(manifest["path"], settings.dtype, target)
    started = time.perf_counter()
    recorder = run(parts, batch, settings, progress=progress)
    seconds = time.perf_counter() - started
    ident = {key: manifest.get(key) for key in ("family", "model", "seed", "step", "tokens_seen")}
    out_dir = Path(out_dir)
    for name, df in tables(recorder, parts, ident).items():
        write_atomic(df, out_dir / f"{name}.parquet")
    n_valid = int(batch["attention_mask"].sum())
    info = {
        "checkpoint": manifest,
        "settings": asdict(settings),
        "device": str(target),
        "n_valid_tokens": n_valid,
        "forward_seconds": seconds,
        "tokens_per_second": n_valid / seconds if seconds else None,
        "nonfinite_tokens": sum(s.n_nonfinite for s in recorder.vectors.values()),
    }
    write_text(json.dumps(info, indent=2, default=str), out_dir / "extract.json")
    return info
