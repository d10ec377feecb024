"""Exact statistics accumulated over every valid token while the batch streams through the model.

Everything is accumulated in float64 so that a sweep over ~10^6 tokens loses no precision; sums within
one mini-batch (over the keys of one attention row, over the tokens of one batch) are taken in float32
first, but for the variances: each mini-batch's M2 (sum of squared deviations) about its own mean, merged in
float64 by Chan et al.'s update (anisweep.moments). Nothing here keeps per-token tensors beyond the mini-batch
being processed, but for the (sequences x tokens) membership of the mini-batch's shape, which every site and every
mini-batch of that shape shares (_batch_membership).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from anisweep.moments import merge, merged_m2, pooled_m2, safe


@dataclass(frozen=True)
class Units:
    """The resampling units of the evaluation batch (anisweep.measures.bootstrap): its sequences in consecutive groups
    of `size`, so that there are at most `extract.units` of them (every sequence its own unit where they are no more).
    The accumulators below keep, beside their sums over every token, each sequence's scalar sums and each unit's
    vector sums (d floats per unit and site: a unit of several sequences bounds what a large evaluation batch keeps),
    from which a measure built of sums is recomputed exactly for any reweighting of the units."""

    n_sequences: int
    size: int

    @classmethod
    def of(cls, n_sequences: int, max_units: int) -> Units | None:
        """None where `max_units` is 0 (no per-unit sums)."""
        if max_units <= 0 or n_sequences <= 0:
            return None
        return cls(n_sequences, -(-n_sequences // max_units))

    @property
    def n_units(self) -> int:
        return -(-self.n_sequences // self.size)

    def of_sequences(self, first_seq: int, n_seqs: int, device) -> torch.Tensor:
        """The unit of each of the sequences first_seq .. first_seq + n_seqs - 1: one tensor per mini-batch, which
        every site of it shares (built once, not once per site)."""
        return _unit_index(self.size, first_seq, n_seqs, torch.device(device))


@functools.lru_cache(maxsize=4)
def _unit_index(size: int, first_seq: int, n_seqs: int, device: torch.device) -> torch.Tensor:
    return torch.div(torch.arange(first_seq, first_seq + n_seqs, device=device), size, rounding_mode="floor")


def _membership(seq: torch.Tensor, n_seqs: int, dtype: torch.dtype) -> torch.Tensor:
    """(n_seqs, rows): 1 where the row belongs to the sequence, else 0."""
    return (seq[None, :] == torch.arange(n_seqs, device=seq.device)[:, None]).to(dtype)


@functools.lru_cache(maxsize=2)  # a full mini-batch's shape and the last one's
def _batch_membership(n_seqs: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64, float32) _membership of every row of a (n_seqs x width) mini-batch: it depends on the batch's shape
    only, so that the sites of a mini-batch, and the mini-batches of one shape, share one (no ops of their own)."""
    seq = torch.div(torch.arange(n_seqs * width, device=device), width, rounding_mode="floor")
    member = _membership(seq, n_seqs, torch.float64)
    return member, member.float()


#: How many of a site's largest activations (tokens by their largest |component|) VectorStats keeps, and how many
#: keys by the attention they receive SinkStats keeps per head: the tables' `rank` 0 .. TOP_K - 1.
TOP_K = 8


class VectorStats:
    """Sums over the valid tokens of one site: n, sum x, sum x/||x||, sum ||x||, sum ||x||^2, min/max ||x|| and
    M2 of ||x|| (the sum of its squared deviations from the mean); where the outlier statistics are taken, per
    dimension M2 of x_j and of x_j/||x|| (rogue dimensions: anisweep.measures.rogue) and max |x_j|; and the TOP_K
    tokens with the largest |component| (massive activations: anisweep.measures.massive), each with its sequence,
    position, dimension and whether it is its sequence's first valid token.

    Every M2 is the mini-batch's own, about its own mean in float64, merged across mini-batches by Chan et al.'s
    update (anisweep.moments): a variance is never sum x^2 / n - mean^2, which cancels where a dimension's mean
    is large against its spread (a rogue dimension). Where the outlier statistics are taken, the sums are in
    float64 within the mini-batch too, about a shift near the mini-batch's mean (_outlier_sums), so that each
    dimension's mean and variance are exact to float64 rounding.

    With `units`, each sequence's scalar sums and each unit's vector sums are kept instead of the sums over every
    token, which are theirs, added (and the M2 of the norms merged) when read: a mini-batch adds its sequences'
    sums, and nothing else, to the accumulators.

    Tokens with a NaN or inf component are counted in `n_nonfinite` and left out of every sum, so a
    diverged checkpoint is flagged rather than silently averaged. Zero vectors (a zeroed padding embedding)
    have no direction: they are in n but counted in `n_zero`, which avg_cos leaves out, as geometry.unit_sum
    does (the unit vectors' M2 is over the others). The sums stay on the device of the model:
    on a GPU nothing here waits for it (`partial` never reads a value back); the counts and norm sums are read
    when the tables are built (`n`, `sum_norm`, ...).
    """

    #: each sequence's scalar sums (seq_scalars' columns) and each unit's vector sums (unit_sums' rows)
    SEQ_SCALARS = ("n", "n_zero", "sum_norm", "m2_norm")
    UNIT_VECTORS = ("sum_x", "sum_unit")

    def __init__(self, d: int, device: torch.device | str = "cpu", units: Units | None = None):
        f64 = {"dtype": torch.float64, "device": device}
        self.units = units
        if units is not None:  # SEQ_SCALARS and the valid tokens (those not kept: non-finite) of each sequence
            self.seq_table = torch.zeros(units.n_sequences, len(self.SEQ_SCALARS) + 1, **f64)
            self.seq_scalars = self.seq_table[:, : len(self.SEQ_SCALARS)]
            # (units, UNIT_VECTORS, d); where the outlier statistics are taken a third row, each unit's sum u_j^2
            self.unit_sums = torch.zeros(units.n_units, len(self.UNIT_VECTORS), d, **f64)
        else:
            self.vector_sums = torch.zeros(len(self.UNIT_VECTORS), d, **f64)  # sum x, sum x/||x||
            self.counts = torch.zeros(3, dtype=torch.int64, device=device)  # n, n_nonfinite, n_zero
            self.norm_sums = torch.zeros(2, **f64)  # sum ||x||, sum ||x||^2
            self._norm_m2 = torch.zeros((), **f64)  # sum (||x|| - mean ||x||)^2: norm_m2
        # min ||x|| and -max ||x||, so that one minimum merges both; filled, not copied from the host (a wait on a GPU)
        self.norm_range = torch.full((2,), float("inf"), **f64)
        self.m2 = torch.zeros(2, d, **f64)  # per dimension: M2 of x_j, of x_j / ||x||
        self.m2_counts = torch.zeros(2, 1, **f64)  # the tokens of m2's sums: the kept ones, those of them not zero
        self.abs_max = torch.zeros(d, **f64)  # per dimension: max |x_j|
        # each mini-batch's TOP_K tokens by max_j |x_j| with its first sequence, merged once at the end (top_tokens):
        # a merge per batch and site would cost a dozen small ops each, which add up on a busy CPU
        self.tops: list[tuple[dict, int]] = []
        self.n_seqs = 0  # sequences seen: the next mini-batch's first sequence

    def _totals(self) -> tuple[int, int, int, float]:
        """(n, n_nonfinite, n_zero, sum ||x||) over every token."""
        if self.units is None:
            n, n_nonfinite, n_zero = (int(c) for c in self.counts.cpu())
            return n, n_nonfinite, n_zero, float(self.norm_sums[0])
        n, n_zero, sum_norm, _, n_valid = self.seq_table.sum(dim=0).cpu().tolist()
        return round(n), round(n_valid - n), round(n_zero), sum_norm

    n = property(lambda self: self._totals()[0])
    n_nonfinite = property(lambda self: self._totals()[1])
    n_zero = property(lambda self: self._totals()[2])
    sum_norm = property(lambda self: self._totals()[3])
    norm_min = property(lambda self: float(self.norm_range[0]))
    norm_max = property(lambda self: -float(self.norm_range[1]))
    sum_x = property(lambda self: self._vector_sums()[0])
    sum_unit = property(lambda self: self._vector_sums()[1])
    m2_x = property(lambda self: self.m2[0])
    m2_unit = property(lambda self: self.m2[1])

    def _vector_sums(self) -> torch.Tensor:
        return self.vector_sums if self.units is None else self.unit_sums[:, : len(self.UNIT_VECTORS)].sum(dim=0)

    @property
    def unit_sum_sq(self) -> torch.Tensor | None:
        """(units, d) each unit's per-dimension sum of u_j^2 (the rogue dimensions), where the outlier statistics
        were taken with units; else None."""
        if self.units is None or self.unit_sums.shape[1] == len(self.UNIT_VECTORS):
            return None
        return self.unit_sums[:, len(self.UNIT_VECTORS)]

    @property
    def sum_norm_sq(self) -> float:
        if self.units is None:
            return float(self.norm_sums[1])
        n, _, sum_norm, m2, _ = self.seq_table.cpu().unbind(dim=1)  # each sequence's: M2 + n mean^2
        return float((m2 + sum_norm.square() / safe(n)).sum())

    @property
    def norm_m2(self) -> torch.Tensor:
        """M2 of ||x|| over every token; with units, the sequences' merged: sum M2_s + sum n_s (mean_s - mean)^2."""
        if self.units is None:
            return self._norm_m2
        n, _, sum_norm, m2, _ = self.seq_table.cpu().unbind(dim=1)
        return pooled_m2(n, sum_norm, m2)

    @property
    def sum_x_sq(self) -> torch.Tensor:
        """Per dimension sum x_j^2, from the mean and M2: M2 + n mean^2."""
        return self.m2[0] + self.sum_x.square() / max(self.n, 1)

    @property
    def sum_unit_sq(self) -> torch.Tensor:
        """Per dimension sum (x_j / ||x||)^2 over the nonzero vectors, from their mean and M2."""
        return self.m2[1] + self.sum_unit.square() / max(self.n - self.n_zero, 1)

    def top_tokens(self) -> dict[str, list]:
        """The TOP_K tokens of every mini-batch, largest first: value (max_j |x_j|), seq, position, dim (its argmax),
        first (1 where the token is its sequence's first valid one); tokens that were padding (value < 0) left out.
        Ties keep the earlier token."""
        rows = []
        for top, first_seq in self.tops:
            top = {name: t.cpu() if isinstance(t, torch.Tensor) else t for name, t in top.items()}
            seq = top["index"] // top["width"]
            position = top["index"] % top["width"]
            first = position == top["first"][seq]
            for i in range(len(seq)):
                rows.append(
                    (
                        float(top["value"][i]),
                        first_seq + int(seq[i]),
                        int(position[i]),
                        int(top["dim"][i]),
                        int(first[i]),
                    )
                )
        rows = sorted((r for r in rows if r[0] >= 0), key=lambda r: (-r[0], r[1], r[2]))[:TOP_K]
        return {
            "value": [value for value, *_ in rows],
            **{name: [r[i] for r in rows] for i, name in enumerate(("seq", "position", "dim", "first"), start=1)},
        }

    @staticmethod
    def partial(
        x: torch.Tensor,
        valid: torch.Tensor,
        wait_free: bool | None = None,
        outliers: bool = False,
        per_sequence: bool = False,
    ) -> dict:
        """x: (..., d); valid: bool of x.shape[:-1]. The sums over the valid tokens of x, taken in float32
        within one mini-batch and in float64 across mini-batches (enough for avg_cos over 10^6 tokens to ~1e-10);
        with `outliers`, in float64 within the mini-batch too, with the per-dimension M2s (_outlier_sums). With
        `per_sequence`, each sequence's sums instead (`per_seq`: its SEQ_SCALARS and valid tokens, and its
        UNIT_VECTORS; VectorStats with units), of which the sums over every token are then the sums: each
        sequence's vector sums are taken over its rows by one product with a (sequences x rows) membership, whose
        cost is the sequences' count times the single sum's.

        `wait_free` (the default on a GPU) masks instead of branching on the data, so the host never waits for
        the device; on a CPU, where reading a value back costs nothing, the branches skip work (a float64 norm
        and a masked copy of x cost 4x the rest there)."""
        n_seqs = valid.reshape(-1, valid.shape[-1]).shape[0] if valid.dim() else 1
        width = valid.shape[-1] if valid.dim() else 1  # positions per sequence
        x = x.reshape(-1, x.shape[-1]).float()
        n_valid = valid.reshape(n_seqs, width).sum(dim=1) if per_sequence else None  # per sequence
        batch_valid, valid = valid, valid.reshape(-1)
        if wait_free is None:
            wait_free = x.device.type != "cpu"
        rows = None  # the kept tokens' flat index, where x is cut down to them
        if wait_free:
            norms = torch.linalg.vector_norm(x, dim=-1, dtype=torch.float64)  # finite iff every component is
            keep = valid & (norms < math.inf)  # a norm is >= 0 or NaN: finite, one op
            x = torch.where(keep[:, None], x, 0.0)
        else:
            norms = torch.linalg.vector_norm(x, dim=-1)
            if not bool(torch.isfinite(norms).all()):  # a NaN or inf component, or a norm beyond float32
                norms = torch.linalg.vector_norm(x, dim=-1, dtype=torch.float64)
            keep = valid & torch.isfinite(norms)
            if not bool(keep.all()):
                rows = keep.nonzero().flatten()
                x, norms = x[keep], norms[keep]
                keep = keep[keep]
        member = member32 = None  # (sequences, rows) where per_sequence
        if per_sequence and rows is None:
            member, member32 = _batch_membership(n_seqs, width, x.device)
        elif per_sequence:
            member = _membership(torch.div(rows, width, rounding_mode="floor"), n_seqs, torch.float64)
        if outliers:  # with each norm to float64 rounding, which the unit vectors' M2 needs
            norms, outlier_sums = _outlier_sums(x, keep, member, rows, width)
        kept_norms = torch.where(keep, norms.double(), 0.0)
        part = {"norm_range": _norm_range(kept_norms, keep), "n_seqs": n_seqs}
        if member is not None:
            part["per_seq"] = {"scalars": _sequence_norm_sums(member, keep, norms, kept_norms, n_valid)}
        else:
            counts = torch.stack([keep.sum(), (valid.sum() - keep.sum()), (keep & (norms == 0)).sum()])
            norm_sums = torch.stack([kept_norms.sum(), kept_norms.dot(kept_norms)])
            part |= {
                "counts": counts,
                "norm_sums": norm_sums,
                "norm_m2": _m2(kept_norms, keep, norm_sums[0] / safe(counts[0].double())),
            }
        if outliers:
            token_max = outlier_sums.pop("token_max")
            if member is not None:
                part["per_seq"]["sums"] = outlier_sums.pop("per_seq")  # and sum u^2: UNIT_VECTORS and one more
            _, first = _sequences(batch_valid)
            return part | outlier_sums | _largest(x, keep, token_max, rows, width, first, n_seqs)
        inverse = torch.where(keep, 1.0 / norms.clamp_min(torch.finfo(torch.float32).tiny), 0.0)
        weights = torch.stack([keep.float(), inverse.float()])
        if member is None:
            return part | {"sums": (weights @ x).double()}  # one pass over x for sum x and sum x/||x||
        # (sequences, 2, d): float32 within a sequence, float64 across
        member32 = member.float() if member32 is None else member32
        part["per_seq"]["sums"] = ((member32[:, None, :] * weights[None]) @ x).double()
        return part

    def add(self, part: dict) -> None:
        if "m2" in part:  # a site with the outlier statistics (VectorStats.partial's `outliers`)
            sums = self._vector_sums()
            self.m2 = merged_m2(self.m2_counts, sums, self.m2, part["m2_counts"], part["sums"], part["m2"])
            self.m2_counts += part["m2_counts"]
            torch.maximum(self.abs_max, part["abs_max"], out=self.abs_max)
            self.tops.append((part["top"], self.n_seqs))
        if self.units is None:
            n_a, n_b = self.counts[0].double(), part["counts"][0].double()
            self._norm_m2 = merged_m2(n_a, self.norm_sums[0], self._norm_m2, n_b, part["norm_sums"][0], part["norm_m2"])
            self.counts += part["counts"]
            self.vector_sums += part["sums"]
            self.norm_sums += part["norm_sums"]
        else:
            self._add_per_sequence(part)
        torch.minimum(self.norm_range, part["norm_range"], out=self.norm_range)
        self.n_seqs += part["n_seqs"]

    def _add_per_sequence(self, part: dict) -> None:
        if "per_seq" not in part:
            raise ValueError("VectorStats with units: feed it parts taken with per_sequence=True")
        first, n_seqs = self.n_seqs, part["n_seqs"]
        self.seq_table[first : first + n_seqs] = part["per_seq"]["scalars"]
        units = self.units.of_sequences(first, n_seqs, self.unit_sums.device)
        sums = part["per_seq"]["sums"]
        if sums.shape[1] != self.unit_sums.shape[1]:  # the outlier statistics' sites: each unit's sum u_j^2 too
            if first:
                raise ValueError("VectorStats with units: a site's parts must all take the outlier statistics, or none")
            self.unit_sums = sums.new_zeros(self.unit_sums.shape[0], *sums.shape[1:])
        self.unit_sums.index_add_(0, units, sums)

    @property
    def has_outliers(self) -> bool:
        """Whether the outlier statistics were taken here (the per-dimension M2s, max |x_j|, the top tokens)."""
        return bool(self.tops)


def _m2(values: torch.Tensor, keep: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """The sum of squared deviations of the kept `values` (0 elsewhere) from their `mean`, in float64."""
    return torch.where(keep, values - mean, 0.0).square().sum()


def _sequence_norm_sums(
    member: torch.Tensor, keep: torch.Tensor, norms: torch.Tensor, kept_norms: torch.Tensor, n_valid: torch.Tensor
) -> torch.Tensor:
    """(sequences, 5) float64: each sequence's VectorStats.SEQ_SCALARS, n, n_zero, sum ||x|| and M2 of ||x|| about
    the sequence's own mean (two passes: no cancellation), and its `n_valid` tokens."""
    kept = keep.double()
    sums = member @ torch.stack([kept, kept * (norms == 0), kept_norms], dim=1)
    mean = sums[:, 2] / safe(sums[:, 0])
    deviation = (kept_norms - mean @ member) * kept  # 0 where not kept (kept_norms, the mean: finite)
    return torch.cat([sums, (member @ deviation.square())[:, None], n_valid[:, None].double()], dim=1)


def _outlier_sums(
    x: torch.Tensor,
    keep: torch.Tensor,
    member: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    width: int = 1,
) -> tuple[torch.Tensor, dict]:
    """(each token's norm, in float64; per dimension the sums of x_j and of the unit vectors' u_j over the kept
    tokens, zero vectors having no u, and the M2 of each about its own batch mean; max_j |x_j| of each token and
    max |x_j| of each dimension), in one pass over the mini-batch, a chunk of rows at a time (_row_chunks).

    Each M2 is summed in float64 about a shift near the batch's mean (shifted moments), M2 = sum d^2 - (sum d)^2 / n
    with d = x - shift, which cancels only as much as (mean - shift)^2 / variance: x's shift is its mean to float32
    rounding, u's is that shift made a unit vector (u's mean to within u's spread), so both stay exact to float64
    rounding where the raw moments about 0 would cancel (a dimension whose mean is 1e4 times its spread).

    `member` ((sequences, rows) float64, VectorStats.partial's per_sequence): each sequence's sums of x and of u too
    and of u^2 (`per_seq`, (sequences, 3, d)), of which the sums over every row are then the sums; each chunk's
    products only with the sequences its rows are in (`rows`: the kept rows' flat index where x
    was cut down to them, `width` the positions per sequence)."""
    n = keep.sum()
    kept = keep.to(x.dtype)
    shift = ((kept @ x) / safe(n).to(x.dtype)).double()  # float32 sums: a shift, not the mean, needs no more
    norm = torch.linalg.vector_norm(shift)
    unit_shift = shift / (norm + (norm == 0))  # u's shift
    below = -unit_shift
    kept = kept.double()
    cut = rows
    whole = member is not None and rows is None  # every row of whole sequences: chunks of whole sequences
    chunks = _row_chunks(x, width if whole else 1)
    rows_max = chunks[0].stop - chunks[0].start if chunks else 0
    magnitudes = x.new_empty(rows_max, x.shape[-1])
    values = x.new_empty(rows_max, x.shape[-1], dtype=torch.float64)
    deviations = torch.empty_like(values)
    norms = x.new_empty(len(x), dtype=torch.float64)
    has_unit = torch.empty_like(norms)  # 1 at the kept tokens that are not zero vectors
    token_max = x.new_empty(len(x))
    abs_max = x.new_zeros(x.shape[-1])
    sums = norms.new_zeros(4, x.shape[-1])  # sum d, sum d^2 of x's deviations; the same of u's
    # each sequence's sum d of x's and u's deviations, and sum d^2 of u's (rogue dimensions under reweighting)
    per_seq = None if member is None else norms.new_zeros(member.shape[0], 3, x.shape[-1])
    for rows in chunks:
        seqs = None if per_seq is None else _sequences_of(rows, cut, width, len(x))
        chunk = x[rows]
        magnitude = torch.abs(chunk, out=magnitudes[: len(chunk)])
        torch.amax(magnitude, dim=-1, out=token_max[rows])
        torch.maximum(abs_max, magnitude.amax(dim=0), out=abs_max)
        value = values[: len(chunk)].copy_(chunk)
        norm = torch.linalg.vector_norm(value, dim=-1, out=norms[rows])
        deviation = torch.sub(value, shift, out=deviations[: len(chunk)])
        if per_seq is None:
            sums[0] += kept[rows] @ deviation
        elif whole:  # each sequence's rows its own block: one small product per sequence, no membership
            per_seq[seqs, 0] += _by_sequence(kept[rows], deviation, width)
        else:
            per_seq[seqs, 0] += (member[seqs, rows] * kept[rows]) @ deviation
        sums[1] += kept[rows] @ deviation.square_()
        weight = has_unit[rows].copy_(keep[rows] & (norm > 0))
        inverse = weight / torch.where(weight > 0, norm, 1.0)
        deviation = torch.addcmul(below, value, inverse[:, None], out=value)  # u - u's shift
        if per_seq is None:
            sums[2] += weight @ deviation
            sums[3] += weight @ deviation.square_()
        elif whole:
            per_seq[seqs, 1] += _by_sequence(weight, deviation, width)
            per_seq[seqs, 2] += _by_sequence(weight, deviation.square_(), width)
        else:
            weights = member[seqs, rows] * weight
            per_seq[seqs, 1] += weights @ deviation
            per_seq[seqs, 2] += weights @ deviation.square_()
    out = {}
    sums = sums.view(2, 2, -1)  # [x, u] x [sum d, sum d^2]
    first, second = sums[:, 0], sums[:, 1]
    shifts = torch.stack([shift, unit_shift])
    if per_seq is not None:  # the batch's sums of the deviations are its sequences'; theirs are then made about 0
        total = per_seq.sum(dim=0)
        first, second = total[:2], torch.stack([sums[0, 1], total[2]])
        counts = member @ torch.stack([kept, has_unit], dim=1)  # (sequences, 2): n, n_unit
        # sum u^2 = sum d^2 + 2 shift . sum d + n_unit shift^2, per dimension, before sum d is made about 0
        per_seq[:, 2].addcmul_(per_seq[:, 1], unit_shift, value=2.0).addcmul_(counts[:, 1:], unit_shift.square())
        per_seq[:, :2].addcmul_(counts[:, :, None], shifts[None])
        out["per_seq"] = per_seq  # (sequences, 3, d): sum x, sum u, sum u^2
    counts = torch.stack([n.double(), has_unit.sum()])[:, None]  # n, n_unit
    m2 = second - first.square() / safe(counts)
    return norms, {
        "sums": torch.addcmul(first, counts, shifts),  # sum x, sum u
        "m2": m2.clamp_min_(0.0),
        "m2_counts": counts,
        "token_max": token_max,
        "abs_max": abs_max.double(),
    } | out


#: How many values a CPU takes the outlier sums of at a time (2 MB in float64): a buffer that stays in cache and is
#: reused, where a float64 copy of a whole mini-batch costs about as much in page faults as in arithmetic (the
#: statistics took twice as long that way). A GPU takes the mini-batch at once.
CPU_CHUNK_ELEMENTS = 1 << 18


def _by_sequence(weights: torch.Tensor, values: torch.Tensor, width: int) -> torch.Tensor:
    """(sequences, d): each sequence's weighted sum of its `width` rows of values (rows, d)."""
    n = len(values) // width
    return torch.bmm(weights.view(n, 1, width), values.view(n, width, -1)).squeeze(1)


def _sequences_of(chunk: slice, rows: torch.Tensor | None, width: int, n_rows: int) -> slice:
    """The sequences a chunk of x's rows is in (the rows in order: the batch's, or the kept ones' flat `rows`): its
    first row's to its last row's. Read from a host tensor only where x was cut (the CPU's branch)."""
    last = min(chunk.stop, n_rows) - 1
    if rows is None:
        return slice(chunk.start // width, last // width + 1)
    return slice(int(rows[chunk.start]) // width, int(rows[last]) // width + 1)


def _row_chunks(x: torch.Tensor, multiple: int = 1) -> list[slice]:
    """Slices of about CPU_CHUNK_ELEMENTS values of x's rows on a CPU (all of them elsewhere), each a `multiple` of
    rows long but the last (whole sequences, where each sequence's sums are taken)."""
    step = max(1, len(x) if x.device.type != "cpu" else CPU_CHUNK_ELEMENTS // max(1, x.shape[-1]))
    step = max(multiple, step - step % multiple)
    return [slice(start, start + step) for start in range(0, len(x), step)]


def _largest(x, keep, token_max, rows, width: int, first, n_seqs: int) -> dict:
    """The TOP_K tokens of one mini-batch by max_j |x_j| (`token_max`; -1 at the tokens not kept): that value, their
    flat index in the batch's (sequences x `width`) positions, dimension (argmax_j), and the batch's first valid
    positions."""
    value, index = torch.where(keep, token_max, -1.0).topk(min(TOP_K, token_max.shape[0]))
    dim = x.index_select(0, index).abs().argmax(dim=-1)
    index = index if rows is None else rows.gather(0, index)
    return {"top": {"value": value, "index": index, "dim": dim, "first": first, "width": width}, "n_seqs": n_seqs}


def _sequences(valid: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(number of sequences, each one's first valid position) of a (sequences, positions) mask; a 1-d mask is one
    sequence. argmax of the mask: no value read back."""
    valid = valid.reshape(-1, valid.shape[-1]) if valid.dim() else valid.reshape(1, 1)
    return valid.shape[0], valid.to(torch.uint8).argmax(dim=-1)


def _norm_range(norms: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """[min, -max] of the kept norms (the max negated: VectorStats merges both by one minimum); [inf, inf] when none
    is kept. Exact: a negation is."""
    if not len(norms):  # the CPU's branch cut every token (all non-finite): no value to reduce
        return norms.new_full((2,), float("inf"))
    return torch.where(keep, torch.stack([norms, -norms]), float("inf")).amin(dim=-1)


class HeadVectorStats:
    """Per-head sums of q (or k) vectors and of their norms over valid tokens: x is (B, H, T, d_head). With `units`,
    each sequence's count and norm sums and each unit's vector sums instead, of which the sums are theirs, added
    when read."""

    def __init__(self, n_heads: int, d_head: int, device: torch.device | str = "cpu", units: Units | None = None):
        self.n = 0
        self.units, self.n_seqs = units, 0
        if units is None:
            self._sum_x = torch.zeros(n_heads, d_head, dtype=torch.float64, device=device)
            self._sum_norm = torch.zeros(n_heads, dtype=torch.float64, device=device)
        else:  # each sequence's valid tokens and, per head, sum ||x||; each unit's sum x per head
            self.seq_n = torch.zeros(units.n_sequences, dtype=torch.float64, device=device)
            self.seq_sum_norm = torch.zeros(units.n_sequences, n_heads, dtype=torch.float64, device=device)
            self.unit_sums = torch.zeros(units.n_units, n_heads, d_head, dtype=torch.float64, device=device)

    sum_x = property(lambda self: self._sum_x if self.units is None else self.unit_sums.sum(dim=0))
    sum_norm = property(lambda self: self._sum_norm if self.units is None else self.seq_sum_norm.sum(dim=0))

    def update(
        self,
        x: torch.Tensor,
        valid: torch.Tensor,
        all_valid: bool = False,
        n_valid: int | None = None,
        seq_valid: torch.Tensor | None = None,
    ) -> None:
        """valid: (B, T) bool; `all_valid` skips the masking when the caller knows there is no padding;
        `n_valid`, valid's count when the caller has it (from a CPU copy: no wait for the device); `seq_valid`,
        valid's count per sequence where the caller has it (the sites of a mini-batch share one)."""
        x = x.float()
        if not all_valid:
            x = x * valid[:, None, :, None]
        self.n += int(valid.sum()) if n_valid is None else n_valid
        # float32 sums within one mini-batch, float64 across; one dim at a time is ~6x faster than (0, 2)
        per_seq_x = x.sum(dim=2)
        per_seq_norm = torch.linalg.vector_norm(x, dim=-1).sum(dim=2)
        if self.units is None:
            self._sum_x += per_seq_x.sum(dim=0).double()
            self._sum_norm += per_seq_norm.sum(dim=0).double()
            return
        # float32 within a sequence, float64 across: the sums over every token are the sequences'
        first, b = self.n_seqs, x.shape[0]
        self.seq_n[first : first + b] = valid.sum(dim=1) if seq_valid is None else seq_valid
        self.seq_sum_norm[first : first + b] = per_seq_norm  # the copy casts to float64
        self.unit_sums.index_add_(0, self.units.of_sequences(first, b, x.device), per_seq_x.double())
        self.n_seqs += b


# Per query row, written by `masked_exp_` and `row_statistics`, reduced by AttentionStats.update.
# per query row, with s the scores shifted so that the row's visible max m is 0: the order statistics of p,
# m, the sum and the norm of the visible s, sum_j p_j s_j, and Z = sum_j exp(s_j)
ROW_FIELDS = ("p_min", "p_lower", "p_upper", "p_max", "score_max", "shifted_sum", "shifted_norm", "p_dot_shifted", "z")
ORDER_FIELDS = slice(ROW_FIELDS.index("p_min"), ROW_FIELDS.index("p_max") + 1)  # min, lower, upper middle, max
# The fields in the scores' unit. Both paths compute the scores in bits, s log2(e) (the scaling times log2(e): one
# rounding, like the scaling's own), so that exp(s) is 2^(s log2(e)): exp2 takes a third of exp's time on a CPU
# (SLEEF's against MKL's) and is Triton's native exponential. AttentionStats.update turns them into nats in float64.
SCORE_FIELDS = slice(ROW_FIELDS.index("score_max"), ROW_FIELDS.index("p_dot_shifted") + 1)
LOG2_E, LN_2 = 1 / math.log(2), math.log(2)


@dataclass
class VisibleKeys:
    """Which of L keys each of R query rows sees, and where partitioning puts each row's middle.

    Hidden keys are confined to the columns `cols` (for causal row blocks, the diagonal block), so
    masking touches only those. `fill` (0 on visible keys, -inf or +inf on hidden ones, which have
    p = 0) is added to the probabilities before each row is partitioned: it sends just enough hidden keys
    to -inf that the visible lower middle lands at the fixed column (L-1)//2 whatever the row's visible
    count, and the upper middle is the smallest value right of it where the count is even (`odd` False).
    `visible` (1.0 on visible keys, 0.0 on hidden ones) zeroes the hidden keys' exponentials.
    """

    n_keys: int
    n_visible: torch.Tensor  # (R,) int64
    odd: torch.Tensor  # (R,) bool: an odd number of visible keys, whose upper middle is the lower one
    cols: slice | None = None  # the columns that hold hidden keys
    hidden: torch.Tensor | None = None  # (R, width of cols) bool, True where the key is not visible
    fill: torch.Tensor | None = None  # (R, width of cols) float32
    visible: torch.Tensor | None = None  # (R, width of cols) float32, ~hidden

    @property
    def middle(self) -> int:
        """The column that holds each row's visible lower middle once the row is partitioned there."""
        return (self.n_keys - 1) // 2

    @classmethod
    def build(cls, hidden: torch.Tensor) -> VisibleKeys:
        """hidden: (R, L) bool. Build it from the mask's CPU copy and move it with `to`: the column range of the
        hidden keys is read as Python ints, which on a GPU would wait for the device."""
        n_keys = hidden.shape[-1]
        n = n_keys - hidden.sum(dim=-1)
        keys = cls(n_keys, n, n % 2 == 1)
        n_below = keys.middle - torch.div(n - 1, 2, rounding_mode="floor")  # hidden keys sent to -inf
        hidden_cols = hidden.any(dim=0).nonzero().flatten()
        if len(hidden_cols):
            keys.cols = slice(int(hidden_cols[0]), int(hidden_cols[-1]) + 1)
            to_low = hidden.cumsum(dim=-1) <= n_below[:, None]
            fill = torch.where(to_low, float("-inf"), float("inf")).masked_fill(~hidden, 0.0)
            keys.hidden, keys.fill = hidden[:, keys.cols], fill[:, keys.cols]
            keys.visible = (~keys.hidden).float()
        return keys

    def to(self, device: torch.device | str) -> VisibleKeys:
        """This on `device`; copies to a GPU go through pinned memory, so the host does not wait for it."""
        device = torch.device(device)
        if device.type == "cpu":
            return self

        def move(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else to_device(x, device)

        return VisibleKeys(
            self.n_keys,
            move(self.n_visible),
            move(self.odd),
            self.cols,
            move(self.hidden),
            move(self.fill),
            move(self.visible),
        )


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor copied to `device` without the host waiting for it (pinned, non-blocking on a GPU)."""
    if device.type == "cuda" and x.device.type == "cpu":
        x = x.contiguous().pin_memory()
    return x.to(device, non_blocking=True)


def _partition_rows_(x: torch.Tensor, kth: int) -> torch.Tensor:
    """x with each row (last dim) partitioned about column `kth`: there its kth smallest value, the smaller ones
    left of it, the others right. On a CPU in place by numpy's partition of the float32 bits as int32, which
    order non-negative floats and -inf as the floats do, and take half the time of a float sort of 512 keys
    (torch.kthvalue and a float partition are slower); elsewhere a full sort, which partitions too."""
    if x.device.type == "cpu":
        x.numpy().view("int32").partition(kth, axis=-1)
        return x
    return x.sort(dim=-1).values


def masked_exp_(scores: torch.Tensor, keys: VisibleKeys, rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Unnormalised softmax over the visible keys of scores (n, R, L) float32 in bits (SCORE_FIELDS): shifts
    `scores` in place so that each row's visible max m is 0 (hidden ones are left 0), writes m, the per-row sum
    and norm of the visible shifted scores, the visible min of 2^shifted and Z = sum_j 2^(s_j - m) to rows (n, R,
    len(ROW_FIELDS)), and returns e = 2^shifted in `out`, exactly 0 on hidden keys. p = e / Z.

    The sums are of the shifted scores, whose mean lies within the row's spread of 0, so that the variance
    from them does not cancel when every score sits far from 0 (a bias term). Hidden keys are zeroed after
    the exponential, not sent to -inf before it: exp of a huge negative number takes ten times as long."""
    lowest = torch.finfo(scores.dtype).min
    if keys.hidden is not None:
        scores[..., keys.cols].masked_fill_(keys.hidden, lowest)
    row_max = rows[..., ROW_FIELDS.index("score_max")]
    torch.amax(scores, dim=-1, out=row_max)
    scores.sub_(row_max[..., None])
    if keys.hidden is not None:
        scores[..., keys.cols].masked_fill_(keys.hidden, 0.0)
    torch.sum(scores, dim=-1, out=rows[..., ROW_FIELDS.index("shifted_sum")])
    torch.linalg.vector_norm(scores, dim=-1, out=rows[..., ROW_FIELDS.index("shifted_norm")])
    torch.exp2(scores, out=out)
    # every visible e is at most 2^0 = 1, the hidden keys' e: the min of the row is the visible one
    torch.amin(out, dim=-1, out=rows[..., ROW_FIELDS.index("p_min")])
    if keys.hidden is not None:
        out[..., keys.cols].mul_(keys.visible)
    torch.sum(out, dim=-1, out=rows[..., ROW_FIELDS.index("z")])
    return out


def row_statistics(shifted: torch.Tensor, e: torch.Tensor, keys: VisibleKeys, rows: torch.Tensor) -> None:
    """From masked_exp_'s shifted scores and e, writes sum_j p_j s_j (s shifted so that its visible max is
    0) and the visible min (from masked_exp_), lower and upper middle and max of p = e / Z to rows; consumes
    `shifted` and `e` (partitioned in place). The middles come from one partition of each row, not a sort.
    The max of e is 2^0 = 1 on every row that sees a key, whose Z is then at least 1: p_max = 1 / Z."""
    z = rows[..., ROW_FIELDS.index("z")]
    torch.sum(shifted.mul_(e), dim=-1, out=rows[..., ROW_FIELDS.index("p_dot_shifted")])
    rows[..., ROW_FIELDS.index("p_dot_shifted")].div_(z)
    torch.gt(z, 0, out=rows[..., ROW_FIELDS.index("p_max")])
    if keys.fill is not None:
        e[..., keys.cols].add_(keys.fill)
    middle = keys.middle
    e = _partition_rows_(e, middle)
    lower, upper = rows[..., ROW_FIELDS.index("p_lower")], rows[..., ROW_FIELDS.index("p_upper")]
    lower.copy_(e[..., middle])
    if middle + 1 < keys.n_keys:  # an even count's upper middle: the smallest right of the lower one
        torch.amin(e[..., middle + 1 :], dim=-1, out=upper)
        torch.where(keys.odd, lower, upper, out=upper)
    else:
        upper.copy_(lower)
    rows[..., ORDER_FIELDS].div_(z[..., None])


class AttentionStats:
    """Per-head sums over valid query rows of one layer's attention probabilities and scores."""

    FIELDS = ("entropy", "entropy_norm", "p_max", "p_median", "p_min")

    def __init__(self, n_heads: int, device: torch.device | str = "cpu", units: Units | None = None):
        zeros = lambda: torch.zeros(n_heads, dtype=torch.float64, device=device)  # noqa: E731
        self.units, self.n_seqs = units, 0
        f64 = {"dtype": torch.float64, "device": device}
        if units is None:  # the sums of FIELDS per head (`sums`)
            self._sums = torch.zeros(len(self.FIELDS), n_heads, **f64)
        else:  # each sequence's sums of FIELDS per head, and its rows (all, and those of >1 key)
            self.seq_sums = torch.zeros(units.n_sequences, len(self.FIELDS), n_heads, **f64)
            self.seq_rows = torch.zeros(units.n_sequences, 2, **f64)
        self.n_rows = 0
        self.n_rows_norm = 0
        self.n_pairs = 0
        # the scores of every visible pair: their count, mean and M2 (sum of squared deviations), merged per
        # mini-batch by Chan et al.'s update (anisweep.moments)
        self.score_n = zeros()
        self.score_mean = zeros()
        self.score_m2 = zeros()

    @property
    def sums(self) -> dict[str, torch.Tensor]:
        """FIELDS' sums over every valid row, per head; with units, the sequences' added."""
        return dict(zip(self.FIELDS, self._sums if self.units is None else self.seq_sums.sum(dim=0)))

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
        """rows: (B, H, T, len(ROW_FIELDS)) of one layer, SCORE_FIELDS in bits; valid: (B, T) query rows to count;
        n_visible: (B, T); `counts`, AttentionStats.counts of valid and n_visible when the caller has them (no
        device wait).

        With s the scores shifted so that the visible max is 0 and Z = sum_j exp(s_j), the entropy
        -sum_j p_j log p_j = log Z - sum_j p_j s_j: no log of T x T values, and no cancellation since both
        terms are >= 0 (as accurate as summing entr(p) of float32 p; unshifted scores would lose
        ~eps * max|s| per row).
        """
        rows = rows.to(torch.float64, copy=True)  # never the caller's
        rows[..., SCORE_FIELDS] *= LN_2  # bits to nats
        r = dict(zip(ROW_FIELDS, rows.unbind(-1)))
        entropy = torch.log(r["z"]) - r["p_dot_shifted"]
        norm_rows = valid & (n_visible > 1)
        per_row = torch.stack(  # (B, FIELDS, H, T), each field over its rows (`kept`)
            [
                entropy,
                entropy / torch.log(n_visible.double().clamp_min(2))[:, None],
                r["p_max"],
                0.5 * (r["p_lower"] + r["p_upper"]),
                r["p_min"],
            ],
            dim=1,
        )
        kept = torch.stack([valid, norm_rows, valid, valid, valid], dim=1)  # (B, FIELDS, T)
        per_row = torch.where(kept[:, :, None, :], per_row, 0.0)
        if self.units is None:
            self._sums += per_row.sum(dim=(0, 3))
        else:  # the sums over every row are the sequences'
            first, b = self.n_seqs, valid.shape[0]
            self.seq_sums[first : first + b] = per_row.sum(dim=3)
            self.seq_rows[first : first + b] = kept[:, :2].sum(dim=2)  # valid rows, those of > 1 key
            self.n_seqs += b
        self._add_scores(r, valid, n_visible)
        n_rows, n_rows_norm, n_pairs = counts or self.counts(valid, n_visible)
        self.n_rows += n_rows
        self.n_rows_norm += n_rows_norm
        self.n_pairs += n_pairs

    def _add_scores(self, r: dict[str, torch.Tensor], valid: torch.Tensor, n_visible: torch.Tensor) -> None:
        """Merge one mini-batch's scores into the running moments. Per row, its visible scores' mean and M2 from the
        sums of the scores shifted by the row's max (float32 within a row, where the shift, inside the row's
        spread, keeps them from cancelling); the rows' together about the batch's mean, in float64."""
        n = torch.where(valid, n_visible, 0).double()[:, None]  # (B, 1, T): the visible pairs of each kept row
        shifted_sum = r["shifted_sum"]
        row_mean = r["score_max"] + shifted_sum / safe(n)
        row_m2 = (r["shifted_norm"].square() - shifted_sum * shifted_sum / safe(n)).clamp_min(0.0)
        keep = n > 0
        batch_n = n.expand_as(row_mean).sum(dim=(0, 2))
        batch_mean = torch.where(keep, n * row_mean, 0.0).sum(dim=(0, 2)) / safe(batch_n)
        between = torch.where(keep, n * (row_mean - batch_mean[:, None]).square(), 0.0)
        batch_m2 = (torch.where(keep, row_m2, 0.0) + between).sum(dim=(0, 2))
        self.score_n, self.score_mean, self.score_m2 = merge(
            self.score_n, self.score_mean, self.score_m2, batch_n, batch_mean, batch_m2
        )

    def means(self) -> dict[str, torch.Tensor]:
        out = {f"{name}_mean": self.sums[name] / max(self.n_rows, 1) for name in self.FIELDS}
        out["entropy_norm_mean"] = self.sums["entropy_norm"] / max(self.n_rows_norm, 1)
        out["score_mean"] = self.score_mean
        out["score_std"] = (self.score_m2 / safe(self.score_n)).sqrt()
        return out


class SinkStats:
    """Per head, the attention each key receives, summed over the valid query rows (column sums of p): in total at
    each key position, on each sequence's first valid key, and the TOP_K keys that receive the most (attention
    sinks: anisweep.measures.sinks). Fed the column sums (B, H, T) the attention pass computes from its
    probabilities (attention_torch, attention_triton); nothing here reads a value back. Each mini-batch's TOP_K keys
    are kept apart and merged once, at the end (top_keys)."""

    def __init__(self, n_heads: int, device: torch.device | str = "cpu", units: Units | None = None):
        f64 = {"dtype": torch.float64, "device": device}
        self.n_heads, self.device = n_heads, device
        self.units = units
        if units is not None:  # each sequence's sum over its rows of p on its first valid key, per head
            self.seq_first = torch.zeros(units.n_sequences, n_heads, **f64)
        else:
            self._first = torch.zeros(n_heads, **f64)  # sum over rows of p on the sequence's first valid key: first
        self.received = torch.zeros(n_heads, 0, **f64)  # per key position: sum over sequences and rows of p
        self.key_counts = torch.zeros(0, dtype=torch.int64, device=device)  # per position: sequences with a valid key
        self.n_rows = 0
        self.n_seqs = 0
        self.first_importance: list[torch.Tensor] = []  # per mini-batch (B, H): first key's sum over rows / rows
        self.tops: list[tuple[dict, int]] = []  # per mini-batch: its keys that receive the most, its first sequence

    def update(self, colsum: torch.Tensor, valid: torch.Tensor, n_rows: int, rows_valid=None) -> None:
        """colsum: (B, H, T) float32, sum over the valid query rows i of p_ij; valid: (B, T) the valid keys; n_rows:
        the valid query rows' count (the caller's, read on the host); `rows_valid`, (B, T_q), the valid query rows
        where they are not the keys (a grid of queries against another of keys), else `valid`."""
        b, h, t = colsum.shape
        if t > self.received.shape[1]:  # a longer mini-batch: more key positions (shapes only, no wait)
            grow = t - self.received.shape[1]
            self.received = torch.nn.functional.pad(self.received, (0, grow))
            self.key_counts = torch.nn.functional.pad(self.key_counts, (0, grow))
        _, first = _sequences(valid)
        on_first = colsum.gather(2, first[:, None, None].expand(b, h, 1))[:, :, 0]  # (B, H)
        if self.units is None:
            self._first += on_first.sum(dim=0)
        else:  # float64 across sequences: the sum over every row is the sequences' (first)
            self.seq_first[self.n_seqs : self.n_seqs + b] = on_first
        self.received[:, :t] += colsum.sum(dim=0)
        self.key_counts[:t] += valid.sum(dim=0)
        self.n_rows += n_rows
        flat = torch.where(valid[:, None, :], colsum, -1.0).transpose(0, 1).reshape(h, b * t)  # padding keys last
        received, index = flat.topk(min(TOP_K, b * t), dim=1)
        rows = (valid if rows_valid is None else rows_valid).sum(dim=1)  # per sequence, its valid query rows
        self.first_importance.append(on_first.double() / rows[:, None].double())  # 0 / 0: NaN, a sequence of no rows
        self.tops.append(
            ({"received": received, "index": index, "rows": rows, "first": first, "width": t}, self.n_seqs)
        )
        self.n_seqs += b

    @property
    def first(self) -> torch.Tensor:
        """Per head, the sum over every valid query row of p on its sequence's first valid key."""
        return self._first if self.units is None else self.seq_first.sum(dim=0)

    def first_importances(self) -> torch.Tensor:
        """(H, sequences): each sequence's first valid key's importance, the attention it receives summed over the
        sequence's valid query rows over their number (Gu et al. 2024's first-token importance score)."""
        if not self.first_importance:
            return torch.zeros(self.n_heads, 0, dtype=torch.float64)
        return torch.cat(self.first_importance).T.cpu()

    def top_keys(self) -> dict[str, list]:
        """Per head (outer list), the TOP_K keys of the whole batch that receive the most, most first (ties: the
        earlier key), padding keys (received < 0) left out: received, rows (the valid query rows of the key's
        sequence), seq, position, first (1 where the key is its sequence's first valid one)."""
        keys = [[] for _ in range(self.n_heads)]
        for top, first_seq in self.tops:
            received, index = top["received"].double().cpu(), top["index"].cpu()
            rows, first, width = top["rows"].cpu(), top["first"].cpu(), top["width"]
            seq, position = index // width, index % width
            for head in range(self.n_heads):
                for i in range(index.shape[1]):
                    s, pos = int(seq[head, i]), int(position[head, i])
                    keys[head].append(
                        (float(received[head, i]), int(rows[s]), first_seq + s, pos, int(pos == first[s]))
                    )
        names = ("received", "rows", "seq", "position", "first")
        out = {name: [] for name in names}
        for head_keys in keys:
            kept = sorted((k for k in head_keys if k[0] >= 0), key=lambda k: (-k[0], k[2], k[3]))[:TOP_K]
            for i, name in enumerate(names):
                out[name].append([k[i] for k in kept])
        return out
