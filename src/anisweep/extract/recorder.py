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
from anisweep.extract.masked import MaskedStates
from anisweep.extract.qk_sample import QKSample
from anisweep.extract.score_hist import ScoreHistogram
from anisweep.extract.stream_measures import StreamMeasures, attention_maps
from anisweep.extract.streaming import (
    AttentionStats,
    HeadVectorStats,
    SinkStats,
    Units,
    VectorStats,
    VisibleKeys,
    to_device,
)
from anisweep.measures.sites import ATTENTION_STREAM_SITES

ATTENTION_NAME = "anisweep"
SAMPLED_SITES = ("resid", "final_ln_in", "final_ln_out")

_ACTIVE: contextvars.ContextVar[Recorder] = contextvars.ContextVar("anisweep_recorder")


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention that also records q/k means and attention statistics for the active Recorder.

    transformers passes no mask to a custom attention function; the recorder builds padding and causal
    masks from the batch, which reproduces eager attention exactly on every valid position. T5's relative
    position bias (`position_bias`, added to the scores before the softmax as T5's eager function does) is
    part of the scores. The layer is the module's `layer_idx`, or the adapter's `attention_sites` for modules
    without one or applied several times (ALBERT).
    """
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    recorder = _ACTIVE.get()
    if recorder.query_prescaled:  # Whisper: q * module.scaling arrives, with scaling 1
        query, scaling = query / module.scaling, module.scaling
    layer, cross = recorder.layer_of(module)
    bias = kwargs.get("position_bias")
    if bias is None and recorder.mask_is_bias:  # BEiT's relative position bias, passed as the mask
        bias = attention_mask
    return recorder.attend(layer, query, key, value, scaling, bias=bias, cross=cross), None


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

    def in_batch(self, first_seq: int, n_seqs: int, t: int, device) -> tuple[slice, torch.Tensor]:
        """(rows of the sample, their flat indices into the mini-batch's (n_seqs * t) positions) of the mini-batch
        that starts at sequence `first_seq`: the sample is sorted, so its rows in a mini-batch are a slice."""
        in_batch = ((self.seq >= first_seq) & (self.seq < first_seq + n_seqs)).nonzero()
        rows = slice(int(in_batch[0]), int(in_batch[-1]) + 1) if len(in_batch) else slice(0, 0)
        return rows, to_device((self.seq[rows] - first_seq) * t + self.position[rows], device)


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
    attention_sites: list = field(default_factory=list)  # the adapter's AttentionSites (Hooks sets them)
    mask_is_bias: bool = False  # the adapter's: the mask transformers passes is a score bias (BEiT); Hooks sets it
    query_prescaled: bool = False  # the adapter's: q arrives scaled, with scaling 1 (Whisper); Hooks sets it
    #: (sequences, sample_tokens, seed) of the evaluation batch: the draw of a site on positions of its own (_grid)
    grid_sampling: tuple[int, int, int] = (0, 0, 0)
    #: T -> (sequences, T) token ids of a sequence some sites run on beside the batch's (the adapter's
    #: other_token_ids: Whisper's decoder tokens): the draw of such a site names its tokens by them (_grid)
    grid_token_ids: dict[int, torch.Tensor] = field(default_factory=dict)
    masked: MaskedStates | None = None  # an MLM's masked pass (anisweep.extract.masked), after the forward
    units: Units | None = None  # the resampling units whose sums the accumulators keep (streaming.Units)
    valid: torch.Tensor = field(init=False)
    scratch: Scratch = field(init=False, default_factory=Scratch)

    def __post_init__(self):
        g, dev, units = self.geometry, self.device, self.units
        sites = [(layer, rope) for layer in range(g.n_layers) for rope in g.ropes]
        if g.layer_heads:  # a hierarchical model: heads and their width per layer (no grouped-query attention)
            self.q = {(i, r): HeadVectorStats(g.heads(i), g.head_width(i), dev, units) for i, r in sites}
            self.k = {(i, r): HeadVectorStats(g.heads(i), g.head_width(i), dev, units) for i, r in sites}
        else:
            self.q = {site: HeadVectorStats(g.n_heads, g.d_head, dev, units) for site in sites}
            self.k = {site: HeadVectorStats(g.kv_heads, g.d_head, dev, units) for site in sites}  # per key head (GQA)
        self.attention = {layer: AttentionStats(g.heads(layer), dev, units) for layer in range(g.n_layers)}
        # self-attention's only
        self.sinks = {layer: SinkStats(g.heads(layer), dev, units) for layer in range(g.n_layers)}
        # cross-attention (T5's decoder): its own accumulators and tables, never mixed with self-attention's
        self.cross_q = {layer: HeadVectorStats(g.n_heads, g.d_head, dev) for layer in g.cross_layers}
        self.cross_k = {layer: HeadVectorStats(g.n_heads, g.d_head, dev) for layer in g.cross_layers}
        self.cross_attention = {layer: AttentionStats(g.n_heads, dev) for layer in g.cross_layers}
        self._calls: dict[int, int] = {}
        self.vectors: dict[tuple[int, str], VectorStats] = {}
        self.samples: dict[tuple[int, str], torch.Tensor] = {}  # (n sampled tokens, d) float32 on the CPU
        self._batch_sample = None
        self._grid_samples: dict[int, Sample] = {}
        self.site_samples: dict[tuple[int, str], Sample] = {}  # sites sampled apart from `sample` (_grid)
        self.site_lengths: dict[tuple[int, str], int] = {}  # their positions per sequence
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
        self._calls = {}
        self.n_valid = int(host_valid.sum())
        self.seq_valid = valid.sum(dim=1) if self.units is not None else None  # the q/k sites' count per sequence
        g = self.geometry
        # the masks of the model's attention (causal or not), and of the other kind where some layers differ
        # (T5: a bidirectional encoder, a causal decoder, a bidirectional cross-attention)
        kinds = {g.causal} | ({True} if g.causal_layers else set()) | ({False} if g.cross_layers else set())
        self._masks = {causal: self._mask(host_valid, causal) for causal in sorted(kinds)}
        self._host_blocks, self.n_visible, self.row_counts = self._masks[g.causal]
        self._blocks, self._other_blocks = None, {}
        self._batch_sample = self.sample.in_batch(first_seq, valid.shape[0], valid.shape[1], valid.device)
        self._first_seq, self._grids, self._grid_masks = first_seq, {}, {}
        if self.qk_sample is not None:
            self.qk_sample.begin_batch(first_seq, valid.shape[0], valid.device)

    def _mask(self, host_valid: torch.Tensor, causal: bool) -> tuple:
        """(host blocks: (query rows, VisibleKeys of each sequence, or of all), n_visible on the device, row
        counts) of the batch for attention that is `causal` or not. Built on the CPU: no wait for the device."""
        t = host_valid.shape[1]
        hidden = ~host_valid[:, None, :].expand(-1, t, -1)
        if causal:
            hidden = hidden | torch.ones(t, t, dtype=torch.bool).triu(1)
        if self.all_valid:  # one mask for the whole mini-batch when there is no padding; else one per sequence
            hidden = hidden[:1]
        host_blocks = []
        for rows in row_blocks(t, causal):
            n_keys = rows.stop if causal else t
            host_blocks.append((rows, [VisibleKeys.build(h[rows, :n_keys]) for h in hidden]))
        n_visible = [torch.cat([keys[i].n_visible for _, keys in host_blocks]) for i in range(len(hidden))]
        host_n_visible = torch.stack(n_visible).expand(host_valid.shape[0], -1)
        row_counts = AttentionStats.counts(host_valid, host_n_visible)
        return host_blocks, to_device(host_n_visible, self.valid.device), row_counts

    def layer_of(self, module) -> tuple[int, bool]:
        """(layer, cross) of an attention module's call: its `layer_idx`, or the adapter's AttentionSite for
        this application of the module (calls counted per mini-batch)."""
        if not self.attention_sites:
            return module.layer_idx, False
        sites = [site for site in self.attention_sites if site.module is module]
        if not sites:
            return module.layer_idx, False
        calls = self._calls.get(id(module), 0)
        self._calls[id(module)] = calls + 1
        site = sites[calls % len(sites)]
        return site.layer, site.cross

    def blocks(self, causal: bool | None = None) -> list:
        """The batch's (query rows, VisibleKeys of each sequence, or of all) on the model's device, moved there
        once per batch and only when the torch ops run (the Triton kernel masks by itself); `causal`, where
        it is not the model's (T5's decoder)."""
        if causal is not None and causal != self.geometry.causal:
            if causal not in self._other_blocks:
                device = self.valid.device
                host_blocks = self._masks[causal][0]
                self._other_blocks[causal] = [(rows, [k.to(device) for k in keys]) for rows, keys in host_blocks]
            return self._other_blocks[causal]
        if self._blocks is None:
            device = self.valid.device
            self._blocks = [(rows, [k.to(device) for k in keys]) for rows, keys in self._host_blocks]
        return self._blocks

    def attend(self, layer, query, key, value, scaling, bias=None, cross=False) -> torch.Tensor:
        """Attention output (B, T, H, d_head) of one layer; records its q/k means and row statistics. `bias`: an
        additive score bias (T5's relative positions, (1 or B, H, T, T)); `cross`: a cross-attention, recorded
        apart (same query and key lengths: the decoder reads the encoder's text teacher-forced)."""
        causal = self.geometry.is_causal(layer) and not cross
        if query.shape[2] != self.valid.shape[1] or key.shape[2] != query.shape[2]:
            return self.attend_on_grid(layer, query, key, value, scaling, bias, causal, cross)
        if cross:
            self.cross_q[layer].update(query, self.valid, self.all_valid, self.n_valid)
            self.cross_k[layer].update(key, self.valid, self.all_valid, self.n_valid)
            output, row_stats, _ = self._attention(query, key, value, scaling, bias, causal)
            _, n_visible, row_counts = self._masks[causal]
            self.cross_attention[layer].update(row_stats, self.valid, n_visible, row_counts)
            return output.transpose(1, 2).contiguous()
        rope = "post" if self.geometry.rotary_dims else "pre"
        self.q[(layer, rope)].update(query, self.valid, self.all_valid, self.n_valid, self.seq_valid)
        self.k[(layer, rope)].update(key, self.valid, self.all_valid, self.n_valid, self.seq_valid)
        if key.shape[1] != query.shape[1]:  # grouped-query attention: query head h uses key head h // group
            key = key.repeat_interleave(self.geometry.group, dim=1)
            value = value.repeat_interleave(self.geometry.group, dim=1)
        if self.qk_sample is not None:
            self.qk_sample.record(layer, rope, query, key)
        if self.score_hist is not None:
            self.score_hist.update(layer, query, key, scaling, self.valid, causal, bias=bias)
        output, row_stats, colsum = self._attention(query, key, value, scaling, bias, causal)
        _, n_visible, row_counts = self._masks[causal]
        self.attention[layer].update(row_stats, self.valid, n_visible, row_counts)
        self.sinks[layer].update(colsum, self.valid, row_counts[0])
        if self.stream is not None:
            self.feed_attention(layer, query, key, output, scaling, causal=causal, bias=bias)
        return output.transpose(1, 2).contiguous()

    def attend_on_grid(self, layer, query, key, value, scaling, bias, causal=False, cross=False) -> torch.Tensor:
        """A layer whose queries are not the batch's positions, or whose keys are fewer than its queries (MiT's
        spatial reduction, CvT's strided keys, Whisper's decoder on its own tokens and its cross-attention to the
        encoder's frames): every query and key valid (images are never padded, the decoder's tokens are as many
        for every clip); causal only where queries and keys are the same positions. The torch ops; its statistics
        as any layer's (neither the q/k sample nor the score histogram)."""
        b, _, t_q, _ = query.shape
        t_k = key.shape[2]
        if not self.all_valid or (causal and t_q != t_k):
            raise ValueError(f"layer {layer}: {t_q} queries and {t_k} keys on a padded batch, or causal")
        if (t_q, t_k, causal) not in self._grid_masks:
            device = self.valid.device
            rows_valid = torch.ones(b, t_q, dtype=torch.bool)
            if causal:
                host_blocks, n_visible, row_counts = self._mask(rows_valid, causal=True)
                blocks = [(rows, [k.to(device) for k in keys]) for rows, keys in host_blocks]
            else:
                blocks = [(slice(0, t_q), [VisibleKeys.build(torch.zeros(t_q, t_k, dtype=torch.bool)).to(device)])]
                n_visible = torch.full((b, t_q), t_k)
                row_counts = AttentionStats.counts(rows_valid, n_visible)
                n_visible = n_visible.to(device)
            keys_valid = torch.ones(b, t_k, dtype=torch.bool, device=device)
            self._grid_masks[(t_q, t_k, causal)] = (blocks, rows_valid.to(device), keys_valid, n_visible, row_counts)
        blocks, rows_valid, keys_valid, n_visible, row_counts = self._grid_masks[(t_q, t_k, causal)]
        q_stats, k_stats = (
            (self.cross_q[layer], self.cross_k[layer]) if cross else (self.q[(layer, "pre")], self.k[(layer, "pre")])
        )
        q_stats.update(query, rows_valid, True, row_counts[0])
        k_stats.update(key, keys_valid, True, b * t_k)
        output, row_stats, colsum = attention_torch.attend(
            query, key, value, scaling, blocks, True, self.workers, self.scratch, bias=bias, valid=rows_valid
        )
        (self.cross_attention if cross else self.attention)[layer].update(row_stats, rows_valid, n_visible, row_counts)
        if not cross:
            self.sinks[layer].update(colsum, keys_valid, row_counts[0], rows_valid)
        return output.transpose(1, 2).contiguous()

    def _attention(self, query, key, value, scaling, bias, causal) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(output (B, H, T, d_v), row statistics, column sums over the valid rows (B, H, T)): the Triton kernel
        where it takes the shape (it has no score bias), else the torch ops."""
        computed = None
        if self.kernel is not None and bias is None:  # None where the kernel declines the shape (one warning)
            computed = self.kernel.try_attend(query, key, value, scaling, self.valid, causal)
        if computed is not None:
            return computed
        return attention_torch.attend(
            query,
            key,
            value,
            scaling,
            self.blocks(causal),
            self.all_valid,
            self.workers,
            self.scratch,
            bias=bias,
            valid=self.valid,
        )

    def feed_attention(self, layer, query, key, output, scaling, causal, bias) -> None:
        """The stream measures' attention sites of one layer; the (B, H, T, T) maps only where one listens."""
        sites = {"q": query, "k": key, "attention_output": output}
        if self.stream.wants("attention_scores") or self.stream.wants("attention_probs"):
            sites["attention_scores"], sites["attention_probs"] = attention_maps(
                query, key, scaling, self.valid, causal, bias=bias
            )
        for site, x in sites.items():
            self.stream.feed(layer, site, x, self.valid, scaling=scaling)

    def record_pre_rotary(self, layer, q, k, rope: str = "pre") -> None:
        """q and/or k (None: not held by this site) before the rotation, or before their norm (`pre_norm`)."""
        for stats, x in ((self.q, q), (self.k, k)):
            if x is not None:
                stats[(layer, rope)].update(x, self.valid, self.all_valid, self.n_valid, self.seq_valid)
        if self.qk_sample is not None:
            self.qk_sample.record(layer, rope, q, k)

    def reserve(self, layer: int, site: str, width: int | None = None) -> None:
        """Allocate a hooked site's accumulators and sample buffer once, before any forward pass: every
        batch writes into them, and nothing that outlives a pass is allocated amid the model's temporaries.
        `width`: the site's vector size where it is not d_model (ALBERT's embedding size)."""
        key = (layer, site)
        self.vectors[key] = VectorStats(width or self.geometry.d_model, self.device, self.units)
        if self.stream is not None:
            self.stream.expect(layer, site, width)
        width = width or self.geometry.d_model
        if site in SAMPLED_SITES:
            pinned = self.device.type == "cuda"  # so that copies into it need not wait: see finish()
            self.samples[key] = torch.empty(len(self.sample.seq), width, pin_memory=pinned)

    def record_vectors(self, layer: int, site: str, x: torch.Tensor) -> None:
        key = (layer, site)
        valid, batch_sample = self.valid, self._batch_sample
        if x.shape[1] != valid.shape[1]:  # a site on positions of its own (a CNN stage's feature-map cells)
            valid, batch_sample = self._grid(key, x.shape[1])
        self.vectors[key].add(self._vector_parts(x, valid, outliers=site in SAMPLED_SITES))
        if self.stream is not None:
            self.stream.feed(layer, site, x, valid)
        if site in SAMPLED_SITES:
            rows, index = batch_sample  # the sample is sorted: its rows in this batch are a slice
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

    def _grid(self, key: tuple[int, str], t: int) -> tuple[torch.Tensor, tuple]:
        """(valid, this batch's sampled rows) of a site whose `t` positions are not the batch's: every one valid
        (images are never padded), sampled by a draw of their own over the whole evaluation batch, with the same
        seed (`site_samples`, which hidden.parquet reads; its sample buffer is sized on the first batch), its tokens
        named by `grid_token_ids` (-1 where there are none)."""
        if not self.all_valid:
            raise ValueError(f"site {key}: {t} positions where the batch has {self.valid.shape[1]}, and padding")
        n_seqs, n_tokens, seed = self.grid_sampling
        if t not in self._grid_samples:
            ones = torch.ones(n_seqs, t, dtype=torch.bool)
            ids = self.grid_token_ids.get(t, torch.full((n_seqs, t), -1))
            self._grid_samples[t] = Sample.draw(ids, ones, n_tokens, seed)
        sample = self.site_samples[key] = self._grid_samples[t]
        self.site_lengths[key] = t
        if key in self.samples and self.samples[key].shape[0] != len(sample.seq):
            self.samples[key] = torch.empty(
                len(sample.seq), self.samples[key].shape[1], pin_memory=self.device.type == "cuda"
            )
        if t not in self._grids:
            b = self.valid.shape[0]
            batch_sample = sample.in_batch(self._first_seq, b, t, self.valid.device)
            self._grids[t] = (torch.ones(b, t, dtype=torch.bool, device=self.valid.device), batch_sample)
        return self._grids[t]

    def _vector_parts(self, x: torch.Tensor, valid: torch.Tensor, outliers: bool = False) -> dict:
        """VectorStats sums of x; with `outliers` (the sampled sites) also its outlier statistics. Several sites
        often hold one tensor (a block's output is the next block's LayerNorm input, twice with a parallel
        residual; no hooked module changes its input in place): the sums of the last few tensors are kept, by weak
        reference so that no tensor outlives its use."""
        for ref, part in self._recent:
            if ref() is x and (not outliers or "m2" in part):
                return part
        part = VectorStats.partial(x, valid, outliers=outliers, per_sequence=self.units is not None)
        self._recent = [(weakref.ref(x), part)] + self._recent[:3]
        return part


class Hooks:
    """Forward hooks that feed a Recorder; a context manager so they never outlive the extraction."""

    def __init__(self, adapter: Adapter, base: nn.Module, geometry: Geometry, recorder: Recorder):
        self.handles = []
        recorder.attention_sites = adapter.attention_sites(base)
        recorder.mask_is_bias = adapter.mask_is_bias
        recorder.query_prescaled = adapter.query_prescaled
        calls = {}  # per (kind, module): what each of its applications in one forward records, in order
        for site in adapter.resid_sites(base):
            recorder.reserve(site.layer, site.site, site.width)

            def on_resid(args, output, layer=site.layer, name=site.site, cells=site.channels_first):
                x = first_tensor(output)
                recorder.record_vectors(layer, name, x.flatten(2).transpose(1, 2) if cells else x)

            calls.setdefault(("resid", site.module), []).append(on_resid)
        for site in adapter.layernorm_sites(base):
            recorder.reserve(site.layer, f"{site.site}_in", site.width)
            recorder.reserve(site.layer, f"{site.site}_out", site.width)

            def on_layernorm(args, output, layer=site.layer, name=site.site):
                recorder.record_vectors(layer, f"{name}_in", args[0])
                recorder.record_vectors(layer, f"{name}_out", first_tensor(output))

            calls.setdefault(("norm", site.module), []).append(on_layernorm)
        for (_, module), fns in calls.items():
            self._add(module, self._in_turn(fns))
        for site in adapter.own_attention(base, geometry):

            def on_attention(module, args, output, layer=site.layer, qkv=site.qkv, scaling=site.scaling):
                recorder.attend(layer, *qkv(args), scaling)  # statistics only: the module's output stands

            self._add(site.module, on_attention)
        for site in adapter.pre_rotary_qk(base, geometry):

            def on_qkv(module, args, output, layer=site.layer, split=site.split, rope=site.rope):
                recorder.record_pre_rotary(layer, *split(output), rope=rope)

            self._add(site.module, on_qkv)

    @staticmethod
    def _in_turn(fns):
        """One hook for a module: its only site, or (a module applied several times per forward, listed once
        per application) the site of this application, counted modulo their number."""
        if len(fns) == 1:
            return lambda module, args, output: fns[0](args, output)
        count = [0]

        def hook(module, args, output):
            fn = fns[count[0] % len(fns)]
            count[0] += 1
            fn(args, output)

        return hook

    def _add(self, module: nn.Module, fn) -> None:
        self.handles.append(module.register_forward_hook(fn))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
