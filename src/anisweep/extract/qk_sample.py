"""Whole per-token q and k vectors of a seeded token sample, per layer, head and rope (qk_sample.parquet): the
point clouds behind Q/K anisotropy and the SVD of queries and keys across training (anisweep.mechanism.qk_svd).

The tokens are a seeded subsample of the hidden-state sample (recorder.Sample), itself drawn from the
evaluation batch with the extract seed: every checkpoint of a model keeps the same (seq, position) pairs.
Buffers are allocated once and filled per mini-batch, so no other per-token tensor outlives its layer."""

from __future__ import annotations

import torch

from anisweep.extract.streaming import to_device


class QKSample:
    """Preallocated (n tokens, heads, d_head) float32 buffers on the CPU, one per (layer, rope, q|k)."""

    def __init__(
        self,
        sample,
        n_tokens: int,
        seed: int,
        n_heads: int,
        d_head: int,
        keys: list[tuple[int, str]],
        device: torch.device | str = "cpu",
    ):
        n = len(sample.seq)
        keep = torch.arange(n)
        if n_tokens < n:
            generator = torch.Generator().manual_seed(seed)
            keep = torch.randperm(n, generator=generator)[:n_tokens].sort().values
        self.seq, self.position, self.token_id = sample.seq[keep], sample.position[keep], sample.token_id[keep]
        self.vectors = {
            # pinned on a GPU, so that the copies into it need not wait (Recorder.finish waits once)
            (layer, rope, which): torch.empty(
                len(keep), n_heads, d_head, pin_memory=torch.device(device).type == "cuda"
            )
            for layer, rope in keys
            for which in ("q", "k")
        }
        self._rows, self._index = slice(0, 0), None

    def __len__(self) -> int:
        return len(self.seq)

    def begin_batch(self, first_seq: int, n_seqs: int, device: torch.device) -> None:
        """The sampled tokens of the mini-batch of sequences [first_seq, first_seq + n_seqs): a slice of the
        sorted sample, and their (sequence in the batch, position) indices."""
        inside = ((self.seq >= first_seq) & (self.seq < first_seq + n_seqs)).nonzero()
        self._rows = slice(int(inside[0]), int(inside[-1]) + 1) if len(inside) else slice(0, 0)
        self._index = (
            to_device(self.seq[self._rows] - first_seq, device),
            to_device(self.position[self._rows], device),
        )

    def record(self, layer: int, rope: str, q: torch.Tensor, k: torch.Tensor) -> None:
        """q, k: (B, H, T, d_head) of the current mini-batch; either may be None (a site that holds only the
        other). Keys with fewer heads than the buffer (grouped-query attention) are stored under each query head
        that uses them; ropes the sample does not keep (`pre_norm`) are left out."""
        if self._rows.stop == self._rows.start:
            return
        seqs, positions = self._index
        for which, x in (("q", q), ("k", k)):
            target = self.vectors.get((layer, rope, which))
            if x is None or target is None:
                continue
            if x.shape[1] != target.shape[1]:
                x = x.repeat_interleave(target.shape[1] // x.shape[1], dim=1)
            target[self._rows].copy_(x[seqs, :, positions, :], non_blocking=True)
