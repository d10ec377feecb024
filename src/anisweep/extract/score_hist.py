"""An exact histogram of the pre-softmax attention scores per layer over every visible (query, key) pair,
with fixed bin edges from the config and an underflow and an overflow bin (score_hist.parquet; Godey et al.
2024, Fig. 7, followed across training).

The scores are recomputed here with torch ops from the q and k the attention sees, on every device and
whichever attention path runs (torch ops or the Triton kernel), one sequence and a few heads at a time."""

from __future__ import annotations

import torch

from anisweep.extract.streaming import to_device

MAX_SCORES = 2**22  # scores held at once: a few heads of one sequence


def bin_edges(low: float, high: float, n: int) -> torch.Tensor:
    if not high > low:
        raise ValueError(
            f"extract.score_bins: high = {high} must be greater than low = {low}; widen the range of the bins"
        )
    return torch.linspace(low, high, n + 1, dtype=torch.float64)


class ScoreHistogram:
    """Counts per layer: index 0 is scores < low, i in 1..n is [edge[i-1], edge[i]), n+1 is scores >= high
    (NaN scores land there too)."""

    def __init__(self, n_layers: int, low: float, high: float, n: int, device: torch.device):
        edges = bin_edges(low, high, n).float()
        self._edges = to_device(edges, torch.device(device))
        self.edges = edges.double()  # the float32 edges the scores are compared with
        self.counts = {layer: torch.zeros(n + 2, dtype=torch.int64, device=device) for layer in range(n_layers)}

    def update(self, layer: int, query, key, scaling: float, valid: torch.Tensor, causal: bool, bias=None) -> None:
        """query, key: (B, H, T, d_head) as attention scores them; valid: (B, T) bool. Chunks of whole sequences
        (or of a few heads of one) hold at most MAX_SCORES scores; hidden pairs go to a discarded extra bin."""
        b, h, t, _ = query.shape
        visible = valid[:, None, :, None] & valid[:, None, None, :]
        if causal:
            visible = visible & torch.ones(t, t, dtype=torch.bool, device=valid.device).tril()
        counts = self.counts[layer]
        discard = counts.numel()
        per_seq = h * t * t
        seqs = max(1, MAX_SCORES // per_seq)
        heads = h if seqs > 1 or per_seq <= MAX_SCORES else max(1, MAX_SCORES // (t * t))
        for first_seq in range(0, b, seqs):
            rows = slice(first_seq, first_seq + seqs)
            for first_head in range(0, h, heads):
                cols = slice(first_head, first_head + heads)
                q, k = query[rows, cols].float(), key[rows, cols].float()
                scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scaling)
                if bias is not None:  # T5's relative position bias, (1 or B, H, T, T): part of the scores
                    scores += bias[rows if bias.shape[0] > 1 else slice(None), cols].float()
                index = torch.bucketize(scores, self._edges, right=True)
                index = index.masked_fill_(~visible[rows], discard)
                counts += bin_counts(index.flatten(), discard + 1)[:discard]


def bin_counts(index: torch.Tensor, n: int, wait_free: bool | None = None) -> torch.Tensor:
    """How often each of 0..n-1 occurs in `index` (int64, every value < n). `wait_free` (the default on a GPU):
    bincount reads index's max back to size its output, so the host would wait for the device; scatter_add_
    reads nothing back. On a CPU bincount is 4x faster."""
    if wait_free is None:
        wait_free = index.device.type != "cpu"
    if not wait_free:
        return torch.bincount(index, minlength=n)
    return index.new_zeros(n).scatter_add_(0, index, index.new_ones(()).expand_as(index))
