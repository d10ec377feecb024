"""Exact statistics accumulated over every valid token while the batch streams through the model.

Everything is accumulated in float64 so that a sweep over ~10^6 tokens loses no precision; sums within
one mini-batch (over the keys of one attention row, over the tokens of one batch) are taken in float32
first. Nothing here keeps per-token tensors beyond the mini-batch being processed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class VectorStats:
    """Sums over the valid tokens of one site: n, sum x, sum x/||x||, sum ||x||, sum ||x||^2, min/max ||x||.

    Tokens with a NaN or inf component are counted in `n_nonfinite` and left out of every sum, so a
    diverged checkpoint is flagged rather than silently averaged. Zero vectors (a zeroed padding embedding)
    have no direction: they are in n but counted in `n_zero`, which avg_cos leaves out, as geometry.unit_sum
    does. The sums stay on the device of the model:
    on a GPU nothing here waits for it (`partial` never reads a value back); the counts and norm sums are read
    when the tables are built (`n`, `sum_norm`, ...).
    """

    def __init__(self, d: int, device: torch.device | str = "cpu"):
        f64 = {"dtype": torch.float64, "device": device}
        self.sum_x = torch.zeros(d, **f64)
        self.sum_unit = torch.zeros(d, **f64)
        self.counts = torch.zeros(3, dtype=torch.int64, device=device)  # n, n_nonfinite, n_zero
        self.norm_sums = torch.zeros(2, **f64)  # sum ||x||, sum ||x||^2
        self.norm_range = torch.full((2,), float("inf"), **f64)  # min, max ||x||: filled, not copied from the host
        self.norm_range[1] = float("-inf")

    n = property(lambda self: int(self.counts[0]))
    n_nonfinite = property(lambda self: int(self.counts[1]))
    n_zero = property(lambda self: int(self.counts[2]))
    sum_norm = property(lambda self: float(self.norm_sums[0]))
    sum_norm_sq = property(lambda self: float(self.norm_sums[1]))
    norm_min = property(lambda self: float(self.norm_range[0]))
    norm_max = property(lambda self: float(self.norm_range[1]))

    @staticmethod
    def partial(x: torch.Tensor, valid: torch.Tensor, wait_free: bool | None = None) -> dict:
        """x: (..., d); valid: bool of x.shape[:-1]. The sums over the valid tokens of x, taken in float32
        within one mini-batch and in float64 across mini-batches: enough for avg_cos over 10^6 tokens to ~1e-10.

        `wait_free` (the default on a GPU) masks instead of branching on the data, so the host never waits for
        the device; on a CPU, where reading a value back costs nothing, the branches skip work (a float64 norm
        and a masked copy of x cost 4x the rest there)."""
        x = x.reshape(-1, x.shape[-1]).float()
        valid = valid.reshape(-1)
        if wait_free is None:
            wait_free = x.device.type != "cpu"
        if wait_free:
            norms = torch.linalg.vector_norm(x, dim=-1, dtype=torch.float64)  # finite iff every component is
            keep = valid & torch.isfinite(norms)
            x = torch.where(keep[:, None], x, 0.0)
        else:
            norms = torch.linalg.vector_norm(x, dim=-1)
            if not bool(torch.isfinite(norms).all()):  # a NaN or inf component, or a norm beyond float32:
                norms = torch.linalg.vector_norm(x, dim=-1, dtype=torch.float64)
            keep = valid & torch.isfinite(norms)
            if not bool(keep.all()):
                x, norms = x[keep], norms[keep]
                keep = keep[keep]
        counts = torch.stack([keep.sum(), (valid.sum() - keep.sum()), (keep & (norms == 0)).sum()])
        inverse = torch.where(keep, 1.0 / norms.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
        weights = torch.stack([keep.float(), inverse.float()])
        sum_x, sum_unit = (weights @ x).double()  # one pass over x for both sums
        norms = torch.where(keep, norms.double(), 0.0)
        return {
            "counts": counts,
            "sum_x": sum_x,
            "sum_unit": sum_unit,
            "norm_sums": torch.stack([norms.sum(), norms.dot(norms)]),
            "norm_range": _norm_range(norms, keep),
        }

    def add(self, part: dict) -> None:
        self.counts += part["counts"]
        self.sum_x += part["sum_x"]
        self.sum_unit += part["sum_unit"]
        self.norm_sums += part["norm_sums"]
        low, high = part["norm_range"]
        self.norm_range = torch.stack([self.norm_range[0].minimum(low), self.norm_range[1].maximum(high)])


def _norm_range(norms: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """[min, max] of the kept norms; [inf, -inf] when none is kept."""
    inf = norms.new_full((1,), float("inf"))  # new_tensor would copy from the host and, on a GPU, wait
    low = torch.cat([torch.where(keep, norms, inf), inf]).amin()
    high = torch.cat([torch.where(keep, norms, -inf), -inf]).amax()
    return torch.stack([low, high])


class HeadVectorStats:
    """Per-head sums of q (or k) vectors and of their norms over valid tokens: x is (B, H, T, d_head)."""

    def __init__(self, n_heads: int, d_head: int, device: torch.device | str = "cpu"):
        self.n = 0
        self.sum_x = torch.zeros(n_heads, d_head, dtype=torch.float64, device=device)
        self.sum_norm = torch.zeros(n_heads, dtype=torch.float64, device=device)

    def update(self, x: torch.Tensor, valid: torch.Tensor, all_valid: bool = False, n_valid: int | None = None) -> None:
        """valid: (B, T) bool; `all_valid` skips the masking when the caller knows there is no padding;
        `n_valid`, valid's count when the caller has it (from a CPU copy: no wait for the device)."""
        x = x.float()
        if not all_valid:
            x = x * valid[:, None, :, None]
        self.n += int(valid.sum()) if n_valid is None else n_valid
        # float32 sums within one mini-batch, float64 across; one dim at a time is ~6x faster than (0, 2)
        self.sum_x += x.sum(dim=2).sum(dim=0).double()
        self.sum_norm += torch.linalg.vector_norm(x, dim=-1).sum(dim=2).sum(dim=0).double()


# Per query row, written by `masked_exp_` and `row_statistics`, reduced by AttentionStats.update.
# per query row, with s the scores shifted so that the row's visible max m is 0: sum_j p_j s_j, the order
# statistics of p, m, the sum and the norm of the visible s, and Z = sum_j exp(s_j)
ROW_FIELDS = ("p_dot_shifted", "p_min", "p_lower", "p_upper", "p_max", "score_max", "shifted_sum", "shifted_norm", "z")
ORDER_FIELDS = slice(ROW_FIELDS.index("p_min"), ROW_FIELDS.index("p_max") + 1)  # VisibleKeys.index's order


@dataclass
class VisibleKeys:
    """Which of L keys each of R query rows sees, and where sorting puts each row's order statistics.

    Hidden keys are confined to the columns `cols` (for causal row blocks, the diagonal block), so
    masking touches only those. `fill` (0 on visible keys, -inf or +inf on hidden ones, which have
    p = 0) is added to the probabilities before a full-row sort: it sends just enough hidden keys to
    -inf that the visible lower middle lands at the fixed column (L-1)//2 whatever the row's visible
    count. `index` holds the sorted columns of the visible min, lower middle, upper middle and max.
    """

    n_keys: int
    n_visible: torch.Tensor  # (R,) int64
    index: torch.Tensor  # (R, 4) int64
    cols: slice | None = None  # the columns that hold hidden keys
    hidden: torch.Tensor | None = None  # (R, width of cols) bool, True where the key is not visible
    fill: torch.Tensor | None = None  # (R, width of cols) float32

    @classmethod
    def build(cls, hidden: torch.Tensor) -> VisibleKeys:
        """hidden: (R, L) bool. Build it from the mask's CPU copy and move it with `to`: the column range of the
        hidden keys is read as Python ints, which on a GPU would wait for the device."""
        n_keys = hidden.shape[-1]
        n = n_keys - hidden.sum(dim=-1)
        middle = (n_keys - 1) // 2
        n_below = middle - torch.div(n - 1, 2, rounding_mode="floor")  # hidden keys sent to -inf
        index = torch.stack([n_below, torch.full_like(n, middle), middle + 1 - n % 2, n_below + n - 1], dim=-1)
        keys = cls(n_keys, n, index.clamp(0, n_keys - 1))
        hidden_cols = hidden.any(dim=0).nonzero().flatten()
        if len(hidden_cols):
            keys.cols = slice(int(hidden_cols[0]), int(hidden_cols[-1]) + 1)
            to_low = hidden.cumsum(dim=-1) <= n_below[:, None]
            fill = torch.where(to_low, float("-inf"), float("inf")).masked_fill(~hidden, 0.0)
            keys.hidden, keys.fill = hidden[:, keys.cols], fill[:, keys.cols]
        return keys

    def to(self, device: torch.device | str) -> VisibleKeys:
        """This on `device`; copies to a GPU go through pinned memory, so the host does not wait for it."""
        device = torch.device(device)
        if device.type == "cpu":
            return self

        def move(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else to_device(x, device)

        return VisibleKeys(
            self.n_keys, move(self.n_visible), move(self.index), self.cols, move(self.hidden), move(self.fill)
        )


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor copied to `device` without the host waiting for it (pinned, non-blocking on a GPU)."""
    if device.type == "cuda" and x.device.type == "cpu":
        x = x.contiguous().pin_memory()
    return x.to(device, non_blocking=True)


def _sort_rows_(x: torch.Tensor) -> torch.Tensor:
    """Sort the last dim in place: on CPU numpy's vectorised sort is ~50x faster than torch.sort."""
    if x.device.type == "cpu":
        x.numpy().sort(axis=-1)
        return x
    return x.sort(dim=-1).values


def masked_exp_(scores: torch.Tensor, keys: VisibleKeys, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Unnormalised softmax over the visible keys of scores (n, R, L) float32: shifts `scores` in place so
    that each row's visible max m is 0 (hidden ones are left near the dtype's min), writes m, the per-row
    sum and norm of the visible shifted scores and Z = sum_j exp(s_j - m) to rows (n, R, len(ROW_FIELDS)),
    and returns e = exp(shifted) in `out`, exactly 0 on hidden keys. p = e / Z.

    The sums are of the shifted scores, whose mean lies within the row's spread of 0, so that the variance
    from them does not cancel when every score sits far from 0 (a bias term)."""
    lowest = torch.finfo(scores.dtype).min
    if keys.hidden is not None:
        scores[..., keys.cols].masked_fill_(keys.hidden, lowest)
    row_max = rows[..., ROW_FIELDS.index("score_max")]
    torch.amax(scores, dim=-1, out=row_max)
    scores.sub_(row_max[..., None])
    if keys.hidden is not None:
        scores[..., keys.cols].masked_fill_(keys.hidden, 0.0)  # for the sums
    torch.sum(scores, dim=-1, out=rows[..., ROW_FIELDS.index("shifted_sum")])
    torch.linalg.vector_norm(scores, dim=-1, out=rows[..., ROW_FIELDS.index("shifted_norm")])
    if keys.hidden is not None:
        scores[..., keys.cols].masked_fill_(keys.hidden, lowest)  # for the softmax
    torch.exp(scores, out=out)
    torch.sum(out, dim=-1, out=rows[..., ROW_FIELDS.index("z")])
    return out


def row_statistics(shifted: torch.Tensor, e: torch.Tensor, keys: VisibleKeys, rows: torch.Tensor) -> None:
    """From masked_exp_'s shifted scores and e, writes sum_j p_j s_j (s shifted so that its visible max is
    0) and the visible min, lower and upper middle and max of p = e / Z to rows; consumes `shifted` and
    `e` (sorted in place). Min, median and max come from one sort of each row."""
    z = rows[..., ROW_FIELDS.index("z")]
    torch.sum(shifted.mul_(e), dim=-1, out=rows[..., ROW_FIELDS.index("p_dot_shifted")])
    rows[..., ROW_FIELDS.index("p_dot_shifted")].div_(z)
    if keys.fill is not None:
        e[..., keys.cols].add_(keys.fill)
    ordered = _sort_rows_(e)
    order = rows[..., ORDER_FIELDS]
    torch.gather(ordered, -1, keys.index.expand(*ordered.shape[:-1], 4), out=order)
    order.div_(z[..., None])


class AttentionStats:
    """Per-head sums over valid query rows of one layer's attention probabilities and scores."""

    FIELDS = ("entropy", "entropy_norm", "p_max", "p_median", "p_min")

    def __init__(self, n_heads: int, device: torch.device | str = "cpu"):
        zeros = lambda: torch.zeros(n_heads, dtype=torch.float64, device=device)  # noqa: E731
        self.sums = {name: zeros() for name in self.FIELDS}
        self.n_rows = 0
        self.n_rows_norm = 0
        self.n_pairs = 0
        self.score_sum = zeros()  # sum over rows of n_visible * the row's mean score
        self.score_row_sq_sum = zeros()  # sum over rows of n_visible * the row's mean score squared
        self.score_m2_within = zeros()  # sum over rows of their squared deviations from the row's mean

    @staticmethod
    def counts(valid: torch.Tensor, n_visible: torch.Tensor) -> tuple[int, int, int]:
        """The query rows of a batch, those with more than one visible key, and the visible (row, key) pairs."""
        return int(valid.sum()), int((valid & (n_visible > 1)).sum()), int((n_visible * valid).sum())

    def update(
        self,
        rows: torch.Tensor,
        valid: torch.Tensor,
        n_visible: torch.Tensor,
        counts: tuple[int, int, int] | None = None,
    ) -> None:
        """rows: (B, H, T, len(ROW_FIELDS)) of one layer; valid: (B, T) query rows to count; n_visible: (B, T);
        `counts`, AttentionStats.counts of valid and n_visible when the caller has them (no device wait).

        With s the scores shifted so that the visible max is 0 and Z = sum_j exp(s_j), the entropy
        -sum_j p_j log p_j = log Z - sum_j p_j s_j: no log of T x T values, and no cancellation since both
        terms are >= 0 (as accurate as summing entr(p) of float32 p; unshifted scores would lose
        ~eps * max|s| per row).
        """
        r = dict(zip(ROW_FIELDS, rows.double().unbind(-1)))
        entropy = torch.log(r["z"]) - r["p_dot_shifted"]
        norm_rows = valid & (n_visible > 1)
        per_row = {
            "entropy": (entropy, valid),
            "entropy_norm": (entropy / torch.log(n_visible.double().clamp_min(2))[:, None], norm_rows),
            "p_max": (r["p_max"], valid),
            "p_median": (0.5 * (r["p_lower"] + r["p_upper"]), valid),
            "p_min": (r["p_min"], valid),
        }
        for name, (values, keep) in per_row.items():
            self.sums[name] += torch.where(keep[:, None], values, 0.0).sum(dim=(0, 2))
        # per row its visible scores' mean and sum of squared deviations, from the shifted sums (float32
        # within a row, where the shift keeps them from cancelling); across rows in float64 (Chan et al.)
        keep = valid[:, None]
        n = n_visible.double().clamp_min(1)[:, None]
        shifted_sum = r["shifted_sum"]
        row_mean = r["score_max"] + shifted_sum / n
        row_m2 = (r["shifted_norm"].square() - shifted_sum * shifted_sum / n).clamp_min(0.0)
        self.score_sum += torch.where(keep, n * row_mean, 0.0).sum(dim=(0, 2))
        self.score_row_sq_sum += torch.where(keep, n * row_mean * row_mean, 0.0).sum(dim=(0, 2))
        self.score_m2_within += torch.where(keep, row_m2, 0.0).sum(dim=(0, 2))
        n_rows, n_rows_norm, n_pairs = counts or self.counts(valid, n_visible)
        self.n_rows += n_rows
        self.n_rows_norm += n_rows_norm
        self.n_pairs += n_pairs

    def means(self) -> dict[str, torch.Tensor]:
        out = {f"{name}_mean": self.sums[name] / max(self.n_rows, 1) for name in self.FIELDS}
        out["entropy_norm_mean"] = self.sums["entropy_norm"] / max(self.n_rows_norm, 1)
        n_pairs = max(self.n_pairs, 1)
        score_mean = self.score_sum / n_pairs
        between = (self.score_row_sq_sum - self.score_sum * score_mean).clamp_min(0.0)
        variance = (self.score_m2_within + between) / n_pairs
        out["score_mean"] = score_mean
        out["score_std"] = variance.sqrt()
        return out
