"""What extract records during a forward pass: the Recorder's accumulators, fed by forward hooks (residual
stream, LayerNorms, pre-rotary q/k) and by the registered attention function (post-rotary q/k, the attention
statistics). The adapter says where the hooked modules are; nothing here knows an architecture."""

from __future__ import annotations

import contextlib
import contextvars
import warnings
import weakref
from dataclasses import dataclass, field
from functools import cache

import torch
from torch import nn

from anisweep.adapters import Adapter, Geometry
from anisweep.extract import attention_torch
from anisweep.extract.attention_torch import Scratch, Workers, row_blocks
from anisweep.extract.qk_sample import QKSample
from anisweep.extract.score_hist import ScoreHistogram
from anisweep.extract.stream_measures import StreamMeasures, attention_maps
from anisweep.extract.streaming import AttentionStats, HeadVectorStats, VectorStats, VisibleKeys, to_device
from anisweep.measures.sites import ATTENTION_STREAM_SITES

ATTENTION_NAME = "anisweep"
SAMPLED_SITES = ("resid", "final_ln_in", "final_ln_out")

_ACTIVE: contextvars.ContextVar[Recorder] = contextvars.ContextVar("anisweep_recorder")


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention that also records q/k means and attention statistics for the active Recorder.

    transformers passes no mask to a custom attention function; the recorder builds padding and causal
    masks from the batch, which reproduces eager attention exactly on every valid position.
    """
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    return _ACTIVE.get().attend(module.layer_idx, query, key, value, scaling), None


def attention_kernel(choice: str, device: torch.device):
    """The module whose `try_attend` runs a layer's attention (anisweep.extract.attention_triton), or None for the
    torch ops. `auto` takes Triton on CUDA when it imports, else falls back with one warning."""
    if choice == "torch" or (choice == "auto" and device.type != "cuda"):
        return None
    if choice == "triton":
        from anisweep.extract import attention_triton

        return attention_triton
    return _triton_or_warn()


@cache
def _triton_or_warn():
    try:
        from anisweep.extract import attention_triton
    except ImportError as error:
        warnings.warn(
            f"extract: Triton does not import ({error}); attention runs as torch ops, slower on a GPU", stacklevel=2
        )
        return None
    return attention_triton


@contextlib.contextmanager
def recording(recorder: Recorder):
    """Route the registered attention function's calls in this context to `recorder`."""
    token = _ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)


def register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, attention_forward)


def first_tensor(output):
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
    qk_sample: QKSample | None = None
    score_hist: ScoreHistogram | None = None
    stream: StreamMeasures | None = None  # the user's stream measures (anisweep.extract.stream_measures)
    valid: torch.Tensor = field(init=False)
    scratch: Scratch = field(init=False, default_factory=Scratch)

    def __post_init__(self):
        g, dev = self.geometry, self.device
        sites = [(layer, rope) for layer in range(g.n_layers) for rope in g.ropes]
        self.q = {site: HeadVectorStats(g.n_heads, g.d_head, dev) for site in sites}
        self.k = {site: HeadVectorStats(g.kv_heads, g.d_head, dev) for site in sites}  # per key head (GQA)
        self.attention = {layer: AttentionStats(g.n_heads, dev) for layer in range(g.n_layers)}
        self.vectors: dict[tuple[int, str], VectorStats] = {}
        self.samples: dict[tuple[int, str], torch.Tensor] = {}  # (n sampled tokens, d) float32 on the CPU
        self._batch_sample = None
        self._recent: list[tuple[weakref.ref, dict]] = []
        if self.stream is not None:
            for layer in range(g.n_layers):
                for site in ATTENTION_STREAM_SITES:
                    self.stream.expect(layer, site)

    def begin_batch(self, valid: torch.Tensor, first_seq: int, host_valid: torch.Tensor | None = None) -> None:
        """Set the masks and the sampled positions of the mini-batch about to run. `host_valid`, valid's copy on
        the CPU when the caller has it: the batch's counts come from it, and no layer waits for the device."""
        host_valid = valid.cpu() if host_valid is None else host_valid
        if self.stream is not None:
            self.stream.end_batch()
        self.valid = valid
        self.all_valid = bool(host_valid.all())
        self._recent = []
        t = valid.shape[1]
        hidden = ~host_valid[:, None, :].expand(-1, t, -1)  # built on the CPU: no wait for the device
        if self.geometry.causal:
            hidden = hidden | torch.ones(t, t, dtype=torch.bool).triu(1)
        if self.all_valid:  # one mask for the whole mini-batch when there is no padding; else one per sequence
            hidden = hidden[:1]
        host_blocks = []  # (query rows, VisibleKeys of each sequence (or of all))
        for rows in row_blocks(t, self.geometry.causal):
            n_keys = rows.stop if self.geometry.causal else t
            host_blocks.append((rows, [VisibleKeys.build(h[rows, :n_keys]) for h in hidden]))
        n_visible = [torch.cat([keys[i].n_visible for _, keys in host_blocks]) for i in range(len(hidden))]
        host_n_visible = torch.stack(n_visible).expand(valid.shape[0], -1)
        self.n_valid, self.row_counts = int(host_valid.sum()), AttentionStats.counts(host_valid, host_n_visible)
        self.n_visible = to_device(host_n_visible, valid.device)
        self._host_blocks, self._blocks = host_blocks, None
        in_batch = ((self.sample.seq >= first_seq) & (self.sample.seq < first_seq + valid.shape[0])).nonzero()
        sample_rows = slice(int(in_batch[0]), int(in_batch[-1]) + 1) if len(in_batch) else slice(0, 0)
        flat_index = (self.sample.seq[sample_rows] - first_seq) * t + self.sample.position[sample_rows]
        self._batch_sample = (sample_rows, to_device(flat_index, valid.device))
        if self.qk_sample is not None:
            self.qk_sample.begin_batch(first_seq, valid.shape[0], valid.device)

    def blocks(self) -> list:
        """The batch's (query rows, VisibleKeys of each sequence, or of all) on the model's device, moved there
        once per batch and only when the torch ops run (the Triton kernel masks by itself)."""
        if self._blocks is None:
            device = self.valid.device
            self._blocks = [(rows, [k.to(device) for k in keys]) for rows, keys in self._host_blocks]
        return self._blocks

    def attend(self, layer, query, key, value, scaling) -> torch.Tensor:
        """Attention output (B, T, H, d_head) of one layer; records its q/k means and row statistics."""
        rope = "post" if self.geometry.rotary_dims else "pre"
        self.q[(layer, rope)].update(query, self.valid, self.all_valid, self.n_valid)
        self.k[(layer, rope)].update(key, self.valid, self.all_valid, self.n_valid)
        if key.shape[1] != query.shape[1]:  # grouped-query attention: query head h uses key head h // group
            key = key.repeat_interleave(self.geometry.group, dim=1)
            value = value.repeat_interleave(self.geometry.group, dim=1)
        if self.qk_sample is not None:
            self.qk_sample.record(layer, rope, query, key)
        if self.score_hist is not None:
            self.score_hist.update(layer, query, key, scaling, self.valid, self.geometry.causal)
        computed = None
        if self.kernel is not None:  # None where the kernel declines the shape (one warning per shape)
            computed = self.kernel.try_attend(query, key, value, scaling, self.valid, self.geometry.causal)
        if computed is not None:
            output, row_stats = computed
        else:
            output, row_stats = attention_torch.attend(
                query, key, value, scaling, self.blocks(), self.all_valid, self.workers, self.scratch
            )
        self.attention[layer].update(row_stats, self.valid, self.n_visible, self.row_counts)
        if self.stream is not None:
            self.feed_attention(layer, query, key, output, scaling)
        return output.transpose(1, 2).contiguous()

    def feed_attention(self, layer, query, key, output, scaling) -> None:
        """The stream measures' attention sites of one layer; the (B, H, T, T) maps only where one listens."""
        sites = {"q": query, "k": key, "attention_output": output}
        if self.stream.wants("attention_scores") or self.stream.wants("attention_probs"):
            sites["attention_scores"], sites["attention_probs"] = attention_maps(
                query, key, scaling, self.valid, self.geometry.causal
            )
        for site, x in sites.items():
            self.stream.feed(layer, site, x, self.valid, scaling=scaling)

    def record_pre_rotary(self, layer, q, k, rope: str = "pre") -> None:
        """q and/or k (None: not held by this site) before the rotation, or before their norm (`pre_norm`)."""
        for stats, x in ((self.q, q), (self.k, k)):
            if x is not None:
                stats[(layer, rope)].update(x, self.valid, self.all_valid, self.n_valid)
        if self.qk_sample is not None:
            self.qk_sample.record(layer, rope, q, k)

    def reserve(self, layer: int, site: str) -> None:
        """Allocate a hooked site's accumulators and sample buffer once, before any forward pass: every
        batch writes into them, and nothing that outlives a pass is allocated amid the model's temporaries."""
        key = (layer, site)
        self.vectors[key] = VectorStats(self.geometry.d_model, self.device)
        if self.stream is not None:
            self.stream.expect(layer, site)
        if site in SAMPLED_SITES:
            pinned = self.device.type == "cuda"  # so that copies into it need not wait: see finish()
            self.samples[key] = torch.empty(len(self.sample.seq), self.geometry.d_model, pin_memory=pinned)

    def record_vectors(self, layer: int, site: str, x: torch.Tensor) -> None:
        key = (layer, site)
        self.vectors[key].add(self._vector_parts(x))
        if self.stream is not None:
            self.stream.feed(layer, site, x, self.valid)
        if site in SAMPLED_SITES:
            rows, index = self._batch_sample  # the sample is sorted: its rows in this batch are a slice
            flat, target = x.reshape(-1, x.shape[-1]), self.samples[key][rows]
            if flat.dtype == target.dtype and flat.device == target.device:
                torch.index_select(flat, 0, index, out=target)
            else:
                target.copy_(flat[index], non_blocking=True)

    def finish(self) -> None:
        """Wait for the device's last copies into the sample, once per checkpoint, before anything reads it."""
        if self.stream is not None:
            self.stream.end_batch()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

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
                site.module, lambda m, a, o, layer=site.layer: recorder.record_vectors(layer, "resid", first_tensor(o))
            )
        for site in adapter.layernorm_sites(base):
            recorder.reserve(site.layer, f"{site.site}_in")
            recorder.reserve(site.layer, f"{site.site}_out")

            def on_layernorm(module, args, output, layer=site.layer, name=site.site):
                recorder.record_vectors(layer, f"{name}_in", args[0])
                recorder.record_vectors(layer, f"{name}_out", first_tensor(output))

            self._add(site.module, on_layernorm)
        for site in adapter.pre_rotary_qk(base, geometry):

            def on_qkv(module, args, output, layer=site.layer, split=site.split, rope=site.rope):
                recorder.record_pre_rotary(layer, *split(output), rope=rope)

            self._add(site.module, on_qkv)

    def _add(self, module: nn.Module, fn) -> None:
        self.handles.append(module.register_forward_hook(fn))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
