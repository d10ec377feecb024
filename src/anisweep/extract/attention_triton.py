"""One layer's attention with every row statistic in Triton kernels: the GPU path of Recorder.attend.

`attend` returns what the torch path (streaming.masked_exp_ and row_statistics) computes: the output
softmax(scores) @ V over each row's visible keys, per query row the ROW_FIELDS, and per key the attention it
receives from the valid query rows, sum_i p_ij (column sums: each program adds its rows' share from the
probabilities it holds, with one atomic add per key). A program holds a
block of query rows against the whole row of keys (rows of up to MAX_KEYS keys), so the softmax, its
sums and the order statistics need one read of the scores and no second kernel.

Choices, and why:
* Order statistics without a sort. p_min, p_max and the lower and upper middle of p = e / Z come from
  e = exp(s - max), which lies in [0, 1]: a positive float orders like its int32 bit pattern, so a
  31-step bisection on the bits, one count of the visible keys at or below the midpoint per step, finds
  the lower middle exactly (a value of the row, as a sort would give). The upper middle is the same
  value when enough keys tie with it, else the smallest e above it: one more masked min, not a second
  bisection. (On an H100, 32 x 12 heads x 512 tokens, an on-chip `tl.sort` of the rows took 16 ms where a
  naive fused kernel with the bisection took 1.23 ms.)
* bfloat16 and float16 (`_fused_kernel`): the scores and the output come from `tl.dot` in the kernel
  (float32 accumulation of exact products, as the torch path's float32 scores), so the scores never
  leave the chip. The key and value tiles of a whole row are staged for tl.dot at once, which bounds
  this path by the registers (FUSED_MAX_KEYS = 512, d_head up to FUSED_MAX_WIDTH = 128); longer rows, or
  wider heads, take the scores path. The kernel writes the order statistics before it loads V, so that
  e, its bits and V's tile are never all live: loaded first, V made 512 keys spill.
* Blocks and warps (`plan`): a program holds BLOCK_M query rows against the whole row, BLOCK_N keys (T to
  the next power of two); ROW_TILE // BLOCK_N rows, at least 16 for the fused kernel's tl.dot; 4 warps up
  to ROW_TILE scores per program, 8 beyond. Measured statically, by ptxas (benchmarks/compile_kernels.py,
  out/kernel_compile.md: Triton 3.9, and 3.6 by hand, sm_90a and sm_80, d_head 64, 80, 128, 128 to 2048 keys),
  not timed: nothing spills, the fused kernel uses up to 254 of 255 registers (239 under 3.6; 512 keys,
  d_head 128, 8 warps) and 144 KB of shared memory (sm_80 allows 163 KB a block), the scores kernel up to 148
  (184 under 3.6). At 1024
  keys the fused kernel spilled on sm_90a with 8 warps or 16, and 512 keys on 4 warps spilled.
* float32 (`_scores_kernel`): Triton's float32 tl.dot rounds its inputs to TF32 (2e-3 off eager) and
  its exact "ieee" mode took 36-46 ms where TF32 took 1.9 ms (same H100 probe), so torch's float32 matmul writes the
  scores, in chunks of at most SCORES_CHUNK, the kernel turns them into p in place while it writes the
  statistics, and torch multiplies p by V: eager attention with its softmax replaced.
* Under TRITON_INTERPRET=1 (the tests, on CPU tensors) the fused kernel casts tl.dot's inputs to float32
  first: the interpreter multiplies bfloat16 as raw uint16. Products of bf16 or fp16 values are exact
  in float32, so this changes no number that matters.

Rows of queries that see no key (padding rows of a causal model with left padding) get zeros: callers
ignore them, and the output stays finite, as later layers multiply it by p = 0. Rows outside the range
(more than MAX_KEYS keys, a dtype other than float32, bfloat16 and float16) and shapes whose launch fails
(a compile error at the first launch) go to the caller's torch path: `try_attend` returns None, with one
FallbackWarning per shape.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from anisweep.extract.streaming import LOG2_E, ROW_FIELDS, SCORE_FIELDS

MAX_KEYS = 2048  # keys per row that one program holds
ROW_TILE = 4096  # scores per program (BLOCK_M rows x BLOCK_N keys) on 4 warps; 8 beyond: 16 x 512 on 4 spilled
FUSED_TILE_BYTES = 128 * 1024  # the key (or value) tile one fused program stages for tl.dot
FUSED_MAX_KEYS = 512  # the fused kernel spills at 1024 keys on sm_90a, with 8 warps or 16
FUSED_MAX_WIDTH = 128  # d_head and d_v, padded, that the fused kernel was compiled for; wider takes the scores path
SCORES_CHUNK = 2**24  # float32 scores the scores path materialises at once (64 MB)
FUSED_DTYPES = (torch.bfloat16, torch.float16)
DTYPES = (torch.float32, *FUSED_DTYPES)
INF_BITS = tl.constexpr(0x7F800000)  # the int32 bits of +inf, above those of every finite e >= 0
BISECTION_STEPS = tl.constexpr(31)  # the candidates [0, INF_BITS] halved 31 times leave one

P_DOT_SHIFTED, P_MIN, P_LOWER, P_UPPER, P_MAX, SCORE_MAX, SHIFTED_SUM, SHIFTED_NORM, Z = (
    tl.constexpr(ROW_FIELDS.index(name))
    for name in (
        "p_dot_shifted",
        "p_min",
        "p_lower",
        "p_upper",
        "p_max",
        "score_max",
        "shifted_sum",
        "shifted_norm",
        "z",
    )
)


@dataclass(frozen=True)
class Plan:
    """What `attend` runs on rows of T keys: the fused kernel or the scores one, BLOCK_M query rows of BLOCK_N
    keys per program, and the warps of a program."""

    fused: bool
    block_m: int
    block_n: int
    num_warps: int


@dataclass(frozen=True)
class Launch:
    """One launch of a kernel: what `attend` runs, and what benchmarks/compile_kernels.py compiles ahead of time."""

    kernel: object
    grid: tuple[int, int, int]
    args: tuple
    meta: dict  # the constexprs and num_warps

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.meta)


def outside_range(t: int, dtype: torch.dtype) -> str | None:
    """Why rows of t keys in `dtype` are outside the range the kernels were compiled and checked for (the
    caller keeps its torch path), or None."""
    if dtype not in DTYPES:
        return f"{dtype} is not one of {', '.join(map(str, DTYPES))}"
    if t > MAX_KEYS:
        return f"{t} keys per row, above MAX_KEYS = {MAX_KEYS}"
    return None


def supports(query: torch.Tensor) -> bool:
    """Whether `attend` runs these rows (else the caller keeps its torch path)."""
    return outside_range(query.shape[-2], query.dtype) is None


class FallbackWarning(UserWarning):
    """A shape's attention runs as torch ops: the kernels do not take it, or it failed at its launch."""


_fallen_back: dict[tuple, str] = {}  # shape -> why its attention runs as torch ops in this process


def try_attend(query, key, value, scaling: float, valid: torch.Tensor, causal: bool):
    """`attend`'s output and row statistics, or None where the caller's torch path must run these rows instead:
    they are outside the kernels' range, or the launch failed (the first launch of a shape compiles its kernel; a
    compile error must not stop a sweep). Each such shape is warned of once, then left to the torch path."""
    shape = (query.shape[-2], query.shape[-1], value.shape[-1], query.dtype, causal)
    if shape in _fallen_back:
        return None
    why = outside_range(query.shape[-2], query.dtype)
    if why is None:
        try:
            return attend(query, key, value, scaling, valid, causal)
        except Exception as error:  # whatever failed, the torch path computes the same numbers
            why = f"{type(error).__name__}: {str(error).strip().split(chr(10), 1)[0]}"
    _fallen_back[shape] = why
    t, d_head, d_value, dtype, _ = shape
    warnings.warn(
        f"extract: attention of rows of {t} keys, d_head {d_head}, d_v {d_value}, {dtype}, "
        f"{'causal' if causal else 'not causal'} runs as torch ops, slower on a GPU ({why})",
        FallbackWarning,
        stacklevel=2,
    )
    return None


def plan(query, value) -> Plan:
    """The kernel, blocks and warps of `attend` on these (B, H, T, d) rows, T <= MAX_KEYS."""
    fused = _fits_fused(query, value)
    block_m, block_n = _blocks(query.shape[-2], 16 if fused else 1)  # tl.dot needs 16 rows
    return Plan(fused, block_m, block_n, _warps(block_m, block_n))


def attend(query, key, value, scaling: float, valid: torch.Tensor, causal: bool):
    """query, key (B, H, T, d_head), value (B, H, T, d_v); valid (B, T) bool: real tokens. A key is visible
    to a row iff it is valid and, if causal, not after the row. Returns the output (B, H, T, d_v) in
    value's dtype (stored as (B, T, H, d_v), the layout the model wants next), the ROW_FIELDS of every
    row, (B, H, T, len(ROW_FIELDS)) float32 (SCORE_FIELDS in bits, as the torch path's), and the column sums
    over the valid rows, (B, H, T) float32."""
    if query.device.type != "cuda" and not INTERPRETED:
        raise ValueError("Triton attention runs on CUDA tensors, or on the CPU under TRITON_INTERPRET=1")
    b, h, t, _ = query.shape
    output = value.new_empty(b, t, h, value.shape[-1]).transpose(1, 2)
    rows = torch.empty(b, h, t, len(ROW_FIELDS), dtype=torch.float32, device=query.device)
    colsum = torch.zeros(b, h, t, dtype=torch.float32, device=query.device)  # the programs add into it
    valid = valid.to(torch.uint8)
    chosen = plan(query, value)
    if chosen.fused:
        fused_launch(query, key, value, scaling, valid, causal, output, rows, chosen, colsum)()
    else:
        _from_scores(query, key, value, scaling, valid, causal, output, rows, chosen, colsum)
    # the kernels work in nats (tl.exp; exp2 made the scores kernel spill on sm_80): the rows' unit is bits
    rows[..., SCORE_FIELDS] *= LOG2_E
    return output, rows, colsum


def _blocks(t: int, min_rows: int) -> tuple[int, int]:
    keys = max(16, triton.next_power_of_2(t))
    return max(min_rows, min(ROW_TILE // keys, keys)), keys


def _warps(block_m: int, block_n: int) -> int:
    return 4 if block_m * block_n <= ROW_TILE else 8


def _fits_fused(query, value) -> bool:
    if query.dtype not in FUSED_DTYPES:
        return False
    keys = max(16, triton.next_power_of_2(query.shape[-2]))
    width = max(16, triton.next_power_of_2(max(query.shape[-1], value.shape[-1])))
    tile_bytes = keys * width * query.element_size()
    return keys <= FUSED_MAX_KEYS and width <= FUSED_MAX_WIDTH and tile_bytes <= FUSED_TILE_BYTES


def fused_launch(query, key, value, scaling, valid, causal, output, rows, chosen: Plan, colsum=None) -> Launch:
    """The fused kernel's launch on (B, H, T, d) query, key and value; valid (B, T) uint8; colsum (B, H, T) float32
    zeros that the column sums are added into (a scratch tensor where None: benchmarks/compile_kernels.py)."""
    if colsum is None:
        colsum = rows.new_zeros(rows.shape[:3])
    b, h, t, d = query.shape
    args = (
        query,
        key,
        value,
        valid,
        output,
        rows,
        colsum,
        scaling,
        t,
        d,
        value.shape[-1],
        *query.stride(),
        *key.stride(),
        *value.stride(),
        *output.stride(),
        *rows.stride(),
        *colsum.stride(),
        valid.stride(0),
    )
    meta = dict(
        CAUSAL=causal,
        UPCAST=INTERPRETED,
        BLOCK_M=chosen.block_m,
        BLOCK_N=chosen.block_n,
        BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_DV=max(16, triton.next_power_of_2(value.shape[-1])),
        num_warps=chosen.num_warps,
    )
    return Launch(_fused_kernel, (triton.cdiv(t, chosen.block_m), h, b), args, meta)


def scores_launch(scores, valid, rows, causal, chosen: Plan) -> Launch:
    """The scores kernel's launch on (B, H, T, T) float32 scores; valid (B, T) uint8, rows (B, H, T, fields)."""
    b, h, t, _ = scores.shape
    args = (scores, valid, rows, t, *scores.stride(), *rows.stride(), valid.stride(0))
    meta = dict(CAUSAL=causal, BLOCK_M=chosen.block_m, BLOCK_N=chosen.block_n, num_warps=chosen.num_warps)
    return Launch(_scores_kernel, (triton.cdiv(t, chosen.block_m), h, b), args, meta)


def _from_scores(query, key, value, scaling, valid, causal, output, rows, chosen: Plan, colsum):
    b, h, t, _ = query.shape
    buffer = query.new_empty(min(SCORES_CHUNK, b * h * t * t), dtype=torch.float32)
    for seqs, heads in _score_chunks(b, h, t):
        q, k, v = query[seqs, heads], key[seqs, heads], value[seqs, heads]
        scores = buffer[: q.shape[0] * q.shape[1] * t * t].view(q.shape[0], q.shape[1], t, t)
        torch.matmul(q.float(), k.float().transpose(-1, -2), out=scores).mul_(scaling)
        scores_launch(scores, valid[seqs], rows[seqs, heads], causal, chosen)()
        # column sums over the valid rows from the p the kernel wrote (in the kernel, they spill registers on sm_80)
        row_weights = valid[seqs].to(scores.dtype)[:, None, None, :]
        colsum[seqs, heads] = torch.matmul(row_weights, scores).squeeze(-2)
        output[seqs, heads] = torch.matmul(scores.to(v.dtype), v)  # scores now hold p


def _score_chunks(b: int, h: int, t: int) -> list[tuple[slice, slice]]:
    """(sequences, heads) slices of at most SCORES_CHUNK scores (or one head's, if more)."""
    heads_per_chunk = max(1, SCORES_CHUNK // (t * t))
    if heads_per_chunk < h:
        return [
            (slice(s, s + 1), slice(first, first + heads_per_chunk))
            for s in range(b)
            for first in range(0, h, heads_per_chunk)
        ]
    step = heads_per_chunk // h
    return [(slice(first, first + step), slice(None)) for first in range(0, b, step)]


@triton.jit
def _fused_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    valid_ptr,
    out_ptr,
    rows_ptr,
    cs_ptr,
    scaling,
    T,
    D,
    DV,
    sq_b,
    sq_h,
    sq_t,
    sq_d,
    sk_b,
    sk_h,
    sk_t,
    sk_d,
    sv_b,
    sv_h,
    sv_t,
    sv_d,
    so_b,
    so_h,
    so_t,
    so_d,
    sr_b,
    sr_h,
    sr_t,
    sr_f,
    sc_b,
    sc_h,
    sc_t,
    s_valid,
    CAUSAL: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    block, head, seq = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    keys = tl.arange(0, BLOCK_N)
    n_keys = T
    if CAUSAL:  # no row of the block sees beyond its last row
        n_keys = tl.minimum(T, (block + 1) * BLOCK_M)
    q = _tile(q_ptr + seq * sq_b + head * sq_h, rows, T, sq_t, D, sq_d, BLOCK_D)
    k = _tile(k_ptr + seq * sk_b + head * sk_h, keys, n_keys, sk_t, D, sk_d, BLOCK_D)
    if UPCAST:
        q, k = q.to(tl.float32), k.to(tl.float32)
    scores = tl.dot(q, tl.trans(k)) * scaling
    visible = _visible(valid_ptr + seq * s_valid, rows, keys, T, CAUSAL)
    row_ptrs = rows_ptr + seq * sr_b + head * sr_h + rows * sr_t
    e, z, n = _softmax_sums(scores, visible, row_ptrs, rows < T, sr_f)
    _column_sums(e, z, valid_ptr + seq * s_valid, rows, keys, n_keys, T, cs_ptr + seq * sc_b + head * sc_h, sc_t)
    _order_statistics(e, z, n, visible, row_ptrs, rows < T, sr_f)  # before V's load: fewer tiles live at once
    v = _tile(v_ptr + seq * sv_b + head * sv_h, keys, n_keys, sv_t, DV, sv_d, BLOCK_DV)
    p = e.to(v.dtype)  # the torch path's e @ V / Z, in the value dtype as eager attention multiplies
    if UPCAST:
        p, v = p.to(tl.float32), v.to(tl.float32)
    out = tl.dot(p, v) / z[:, None]
    dims = tl.arange(0, BLOCK_DV)
    out_ptrs = out_ptr + seq * so_b + head * so_h + rows[:, None] * so_t + dims[None, :] * so_d
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < T) & (dims[None, :] < DV))


@triton.jit
def _scores_kernel(
    s_ptr,
    valid_ptr,
    rows_ptr,
    T,
    ss_b,
    ss_h,
    ss_t,
    ss_k,
    sr_b,
    sr_h,
    sr_t,
    sr_f,
    s_valid,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Float32 scores in, the row statistics out, p = e / Z written over the scores (the caller sums its columns)."""
    block, head, seq = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    keys = tl.arange(0, BLOCK_N)
    ptrs = s_ptr + seq * ss_b + head * ss_h + rows[:, None] * ss_t + keys[None, :] * ss_k
    in_bounds = (rows[:, None] < T) & (keys[None, :] < T)
    scores = tl.load(ptrs, mask=in_bounds, other=0.0)
    visible = _visible(valid_ptr + seq * s_valid, rows, keys, T, CAUSAL)
    row_ptrs = rows_ptr + seq * sr_b + head * sr_h + rows * sr_t
    e, z, n = _softmax_sums(scores, visible, row_ptrs, rows < T, sr_f)
    tl.store(ptrs, e / z[:, None], mask=in_bounds)
    _order_statistics(e, z, n, visible, row_ptrs, rows < T, sr_f)


@triton.jit
def _tile(ptr, index, n, s_index, width, s_width, BLOCK_W: tl.constexpr):
    """x[index, :width] of a (n, width) matrix, zeros beyond."""
    cols = tl.arange(0, BLOCK_W)
    mask = (index[:, None] < n) & (cols[None, :] < width)
    return tl.load(ptr + index[:, None] * s_index + cols[None, :] * s_width, mask=mask, other=0.0)


@triton.jit
def _visible(valid_ptr, rows, keys, T, CAUSAL: tl.constexpr):
    valid_key = tl.load(valid_ptr + keys, mask=keys < T, other=0) != 0
    visible = valid_key[None, :] & (rows[:, None] < T)
    if CAUSAL:
        visible = visible & (keys[None, :] <= rows[:, None])
    return visible


@triton.jit
def _softmax_sums(s, visible, row_ptrs, row_mask, sr_f):
    """Writes the sums of ROW_FIELDS of the rows of scores s (BLOCK_M, BLOCK_N) over their visible keys;
    returns e = exp(s - max) (0 where hidden), Z and the number of visible keys. Rows that see no key
    get zeros and Z = 1."""
    n = tl.sum(visible.to(tl.int32), axis=1)
    seen = n > 0
    m = tl.where(seen, tl.max(tl.where(visible, s, float("-inf")), axis=1), 0.0)
    shifted = tl.where(visible, s - m[:, None], 0.0)
    _store(row_ptrs + SCORE_MAX * sr_f, m, seen, row_mask)
    _store(row_ptrs + SHIFTED_SUM * sr_f, tl.sum(shifted, axis=1), seen, row_mask)
    _store(row_ptrs + SHIFTED_NORM * sr_f, tl.sqrt(tl.sum(shifted * shifted, axis=1)), seen, row_mask)
    e = tl.where(visible, tl.exp(shifted), 0.0)
    z = tl.where(seen, tl.sum(e, axis=1), 1.0)
    _store(row_ptrs + Z * sr_f, z, seen, row_mask)
    _store(row_ptrs + P_DOT_SHIFTED * sr_f, tl.sum(e * shifted, axis=1) / z, seen, row_mask)
    return e, z, n


@triton.jit
def _column_sums(e, z, valid_ptr, rows, keys, n_keys, T, cs_ptr, sc_t):
    """Adds the block's share of each key's column sum, sum over its valid query rows of p = e / Z, into cs_ptr."""
    row_valid = tl.load(valid_ptr + rows, mask=rows < T, other=0) != 0
    weight = tl.where(row_valid, 1.0 / z, 0.0)
    tl.atomic_add(cs_ptr + keys * sc_t, tl.sum(e * weight[:, None], axis=0), mask=keys < n_keys)


@triton.jit
def _order_statistics(e, z, n, visible, row_ptrs, row_mask, sr_f):
    """Writes the min, lower and upper middle (sorted positions (n-1)//2 and n//2) and max of each row's
    visible p = e / Z. Only the bits of e stay live through the bisection. The minimum comes from the bits, before
    the maximum: its order here is what spilled no register under Triton 3.6 and 3.9 (compile_kernels.py)."""
    seen = n > 0
    bits = tl.where(visible, e.to(tl.int32, bitcast=True), INF_BITS)  # e >= 0 orders as its bits; hidden last
    smallest = tl.min(bits, axis=1).to(tl.float32, bitcast=True)  # the smallest visible e, as min of its bits
    _store(row_ptrs + P_MIN * sr_f, smallest / z, seen, row_mask)
    _store(row_ptrs + P_MAX * sr_f, tl.max(e, axis=1) / z, seen, row_mask)
    lower = _kth_smallest(bits, tl.maximum(n - 1, 0) // 2)
    n_at_most = tl.sum((bits <= lower[:, None]).to(tl.int32), axis=1)
    above = tl.min(tl.where(bits > lower[:, None], bits, INF_BITS), axis=1)
    upper = tl.where(n_at_most > n // 2, lower, above)  # lower itself when it fills position n//2 too
    _store(row_ptrs + P_LOWER * sr_f, lower.to(tl.float32, bitcast=True) / z, seen, row_mask)
    _store(row_ptrs + P_UPPER * sr_f, upper.to(tl.float32, bitcast=True) / z, seen, row_mask)


@triton.jit
def _store(ptrs, value, seen, row_mask):
    tl.store(ptrs, tl.where(seen, value, 0.0), mask=row_mask)


@triton.jit
def _kth_smallest(bits, k):
    """The k-th smallest (from 0) of each row of int32 `bits` in [0, INF_BITS], by bisection."""
    lo = tl.zeros_like(k)
    hi = tl.full(k.shape, INF_BITS, tl.int32)
    for _ in range(BISECTION_STEPS):
        mid = lo + (hi - lo) // 2
        enough = tl.sum((bits <= mid[:, None]).to(tl.int32), axis=1) > k
        hi = tl.where(enough, mid, hi)
        lo = tl.where(enough, lo, mid + 1)
    return lo


INTERPRETED = type(_fused_kernel).__name__ == "InterpretedFunction"
