"""Exact statistics accumulated over every valid token while the batch streams through the model.

Everything is summed in float64 so that a sweep over ~10^6 tokens loses no precision; nothing here keeps
per-token tensors beyond the mini-batch being processed.
"""

from __future__ import annotations

import torch


def _f64_sum(x: torch.Tensor, dims) -> torch.Tensor:
    return x.sum(dim=dims, dtype=torch.float64)


class VectorStats:
    """Sums over the valid tokens of one site: n, sum x, sum x/||x||, sum ||x||, sum ||x||^2, min/max ||x||.

    Tokens with a NaN or inf component are counted in `n_nonfinite` and left out of every sum, so a
    diverged checkpoint is flagged rather than silently averaged.
    """

    def __init__(self, d: int, device: torch.device | str = "cpu"):
        self.n = 0
        self.n_nonfinite = 0
        self.sum_x = torch.zeros(d, dtype=torch.float64, device=device)
        self.sum_unit = torch.zeros(d, dtype=torch.float64, device=device)
        self.sum_norm = 0.0
        self.sum_norm_sq = 0.0
        self.norm_min = float("inf")
        self.norm_max = float("-inf")

    def update(self, x: torch.Tensor, valid: torch.Tensor) -> None:
        """x: (..., d); valid: bool of x.shape[:-1]."""
        x = x.reshape(-1, x.shape[-1])
        valid = valid.reshape(-1)
        finite = torch.isfinite(x).all(dim=-1)
        self.n_nonfinite += int((valid & ~finite).sum())
        keep = valid & finite
        x = x[keep].to(torch.float64)
        if x.shape[0] == 0:
            return
        norms = torch.linalg.vector_norm(x, dim=-1)
        self.n += x.shape[0]
        self.sum_x += x.sum(dim=0)
        self.sum_unit += (x / norms.clamp_min(torch.finfo(torch.float64).tiny)[:, None]).sum(dim=0)
        self.sum_norm += float(norms.sum())
        self.sum_norm_sq += float((norms * norms).sum())
        self.norm_min = min(self.norm_min, float(norms.min()))
        self.norm_max = max(self.norm_max, float(norms.max()))


class HeadVectorStats:
    """Per-head sums of q (or k) vectors and of their norms over valid tokens: x is (B, H, T, d_head)."""

    def __init__(self, n_heads: int, d_head: int, device: torch.device | str = "cpu"):
        self.n = 0
        self.sum_x = torch.zeros(n_heads, d_head, dtype=torch.float64, device=device)
        self.sum_norm = torch.zeros(n_heads, dtype=torch.float64, device=device)

    def update(self, x: torch.Tensor, valid: torch.Tensor) -> None:
        """valid: (B, T) bool."""
        weight = valid[:, None, :, None].to(x.dtype)
        self.n += int(valid.sum())
        self.sum_x += _f64_sum(x * weight, (0, 2))
        norms = torch.linalg.vector_norm(x.to(torch.float32), dim=-1) * valid[:, None, :]
        self.sum_norm += _f64_sum(norms, (0, 2))


def _median_of_visible(p: torch.Tensor, allowed: torch.Tensor, n_visible: torch.Tensor) -> torch.Tensor:
    """Median over the visible keys of each row (the mean of the two middle values for an even count)."""
    ordered = p.masked_fill(~allowed, float("inf")).sort(dim=-1).values
    lo = ((n_visible - 1).clamp_min(0) // 2).expand(p.shape[:-1]).unsqueeze(-1)
    hi = (n_visible // 2).clamp_max(p.shape[-1] - 1).expand(p.shape[:-1]).unsqueeze(-1)
    return 0.5 * (ordered.gather(-1, lo) + ordered.gather(-1, hi)).squeeze(-1)


class AttentionStats:
    """Per-head sums over valid query rows of one layer's attention probabilities and scores.

    `update` takes the pre-softmax scores q.k/sqrt(d_head), the probabilities and the mask of visible
    (query, key) pairs for one sequence at a time, so temporaries stay at one sequence's H x T x T.
    """

    FIELDS = ("entropy", "entropy_norm", "p_max", "p_median", "p_min")

    def __init__(self, n_heads: int, device: torch.device | str = "cpu"):
        zeros = lambda: torch.zeros(n_heads, dtype=torch.float64, device=device)  # noqa: E731
        self.sums = {name: zeros() for name in self.FIELDS}
        self.n_rows = 0
        self.n_rows_norm = 0
        self.n_pairs = 0
        self.score_sum = zeros()
        self.score_sq_sum = zeros()

    def update(self, scores: torch.Tensor, p: torch.Tensor, allowed: torch.Tensor, rows: torch.Tensor) -> None:
        """scores, p: (H, T, T) float32; allowed: (T, T) bool of visible keys; rows: (T,) valid queries."""
        allowed = allowed & rows[:, None]
        n_visible = allowed.sum(dim=-1)
        entropy = torch.special.entr(p.masked_fill(~allowed, 0.0)).sum(dim=-1)
        log_n = torch.log(n_visible.to(p.dtype))
        norm_rows = rows & (n_visible > 1)
        per_row = {
            "entropy": entropy,
            "entropy_norm": torch.where(norm_rows, entropy / log_n.clamp_min(1e-30), 0.0),
            "p_max": p.masked_fill(~allowed, 0.0).amax(dim=-1),
            "p_min": p.masked_fill(~allowed, float("inf")).amin(dim=-1),
            "p_median": _median_of_visible(p, allowed, n_visible),
        }
        for name, values in per_row.items():
            self.sums[name] += _f64_sum(torch.where(rows, values, 0.0), -1)
        self.n_rows += int(rows.sum())
        self.n_rows_norm += int(norm_rows.sum())
        visible_scores = scores.masked_fill(~allowed, 0.0).to(torch.float64)
        self.score_sum += visible_scores.sum(dim=(-1, -2))
        self.score_sq_sum += (visible_scores * visible_scores).sum(dim=(-1, -2))
        self.n_pairs += int(allowed.sum())

    def means(self) -> dict[str, torch.Tensor]:
        out = {f"{name}_mean": self.sums[name] / max(self.n_rows, 1) for name in self.FIELDS}
        out["entropy_norm_mean"] = self.sums["entropy_norm"] / max(self.n_rows_norm, 1)
        score_mean = self.score_sum / max(self.n_pairs, 1)
        variance = (self.score_sq_sum / max(self.n_pairs, 1) - score_mean * score_mean).clamp_min(0.0)
        out["score_mean"] = score_mean
        out["score_std"] = variance.sqrt()
        return out
