"""One layer's attention with every row statistic in Triton kernels: the GPU path of Recorder.attend.

`attend` returns what the torch path (streaming.masked_exp_ and row_statistics) computes: the output
softmax(scores) @ V over each row's visible keys, and per query row the ROW_FIELDS. A program holds a
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
  this path by FUSED_TILE_BYTES (1024 keys at d_head 64); longer rows take the scores path.
* float32 (`_scores_kernel`): Triton's float32 tl.dot rounds its inputs to TF32 (2e-3 off eager) and
  its exact "ieee" mode took 36-46 ms where TF32 took 1.9 ms (same H100 probe), so torch's float32 matmul writes the
  scores, in chunks of at most SCORES_CHUNK, the kernel turns them into p in place while it writes the
  statistics, and torch multiplies p by V: eager attention with its softmax replaced.
* Under TRITON_INTERPRET=1 (the tests, on CPU tensors) the fused kernel casts tl.dot's inputs to float32
  first: the interpreter multiplies bfloat16 as raw uint16. Products of bf16 or fp16 values are exact
  in float32, so this changes no number that matters.

Rows of queries that see no key (padding rows of a causal model with left padding) get zeros: callers
ignore them, and the output stays finite, as later layers multiply it by p = 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from anisweep.extract.streaming import ROW_FIELDS

MAX_KEYS = 2048  # keys per row that one program holds
ROW_TILE = 4096  # scores per program, BLOCK_M rows x BLOCK_N keys: ptxas (sm_90a) spills beyond, at 4 warps
FUSED_TILE_BYTES = 128 * 1024  # the key (or value) tile one fused program stages for tl.dot
SCORES_CHUNK = 2**24  # float32 scores the scores path materialises at once (64 MB)
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


def supports(query: torch.Tensor) -> bool:
    """Whether `attend` runs these rows (else the caller keeps its torch path)."""
    return query.shape[-2] <= MAX_KEYS


def attend(query, key, value, scaling: float, valid: torch.Tensor, causal: bool):
    """query, key (B, H, T, d_head), value (B, H, T, d_v); valid (B, T) bool: real tokens. A key is visible
    to a row iff it is valid and, if causal, not after the row. Returns the output (B, H, T, d_v) in
    value's dtype (stored as (B, T, H, d_v), the layout the model wants next) and the ROW_FIELDS of every
    row, (B, H, T, len(ROW_FIELDS)) float32."""
    if query.device.type != "cuda" and not INTERPRETED:
        raise ValueError("Triton attention runs on CUDA tensors, or on the CPU under TRITON_INTERPRET=1")
    b, h, t, _ = query.shape
    output = value.new_empty(b, t, h, value.shape[-1]).transpose(1, 2)
    rows = torch.empty(b, h, t, len(ROW_FIELDS), dtype=torch.float32, device=query.device)
    valid = valid.to(torch.uint8)
    if _fits_fused(query, value):
        _fused(query, key, value, scaling, valid, causal, output, rows)
    else:
        _from_scores(query, key, value, scaling, valid, causal, output, rows)
    return output, rows


def _blocks(t: int, min_rows: int) -> tuple[int, int]:
    keys = max(16, triton.next_power_of_2(t))
    return max(min_rows, min(ROW_TILE // keys, keys)), keys


def _warps(block_m: int, block_n: int) -> int:
    return 4 if block_m * block_n <= ROW_TILE else 8


def _fits_fused(query, value) -> bool:
    if query.dtype not in (torch.bfloat16, torch.float16):
        return False
    keys = max(16, triton.next_power_of_2(query.shape[-2]))
    width = max(16, triton.next_power_of_2(max(query.shape[-1], value.shape[-1])))
    return keys * width * query.element_size() <= FUSED_TILE_BYTES


def _fused(query, key, value, scaling, valid, causal, output, rows):
    b, h, t, d = query.shape
    block_m, block_n = _blocks(t, 16)  # tl.dot needs 16 rows
    _fused_kernel[(triton.cdiv(t, block_m), h, b)](
        query,
        key,
        value,
        valid,
        output,
        rows,
        scaling,
        t,
        d,
        value.shape[-1],
        *query.stride(),
        *key.stride(),
        *value.stride(),
        *output.stride(),
        *rows.stride(),
        valid.stride(0),
        CAUSAL=causal,
        UPCAST=INTERPRETED,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_DV=max(16, triton.next_power_of_2(value.shape[-1])),
        num_warps=_warps(block_m, block_n),
    )


def _from_scores(query, key, value, scaling, valid, causal, output, rows):
    b, h, t, _ = query.shape
    block_m, block_n = _blocks(t, 1)
    buffer = query.new_empty(min(SCORES_CHUNK, b * h * t * t), dtype=torch.float32)
    for seqs, heads in _score_chunks(b, h, t):
        q, k, v = query[seqs, heads], key[seqs, heads], value[seqs, heads]
        scores = buffer[: q.shape[0] * q.shape[1] * t * t].view(q.shape[0], q.shape[1], t, t)
        torch.matmul(q.float(), k.float().transpose(-1, -2), out=scores).mul_(scaling)
        chunk_rows = rows[seqs, heads]
        _scores_kernel[(triton.cdiv(t, block_m), q.shape[1], q.shape[0])](
            scores,
            valid[seqs],
            chunk_rows,
            t,
            *scores.stride(),
            *chunk_rows.stride(),
            valid.stride(0),
            CAUSAL=causal,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            num_warps=_warps(block_m, block_n),
        )
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
    v = _tile(v_ptr + seq * sv_b + head * sv_h, keys, n_keys, sv_t, DV, sv_d, BLOCK_DV)
    if UPCAST:
        q, k = q.to(tl.float32), k.to(tl.float32)
    scores = tl.dot(q, tl.trans(k)) * scaling
    visible = _visible(valid_ptr + seq * s_valid, rows, keys, T, CAUSAL)
    row_ptrs = rows_ptr + seq * sr_b + head * sr_h + rows * sr_t
    e, z, n = _softmax_sums(scores, visible, row_ptrs, rows < T, sr_f)
    p = e.to(v.dtype)  # the torch path's e @ V / Z, in the value dtype as eager attention multiplies
    if UPCAST:
        p, v = p.to(tl.float32), v.to(tl.float32)
    out = tl.dot(p, v) / z[:, None]
    dims = tl.arange(0, BLOCK_DV)
    out_ptrs = out_ptr + seq * so_b + head * so_h + rows[:, None] * so_t + dims[None, :] * so_d
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < T) & (dims[None, :] < DV))
    _order_statistics(e, z, n, visible, row_ptrs, rows < T, sr_f)


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
    """Float32 scores in, the row statistics out, and p = e / Z written over the scores."""
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
def _order_statistics(e, z, n, visible, row_ptrs, row_mask, sr_f):
    """Writes the min, lower and upper middle (sorted positions (n-1)//2 and n//2) and max of each row's
    visible p = e / Z. Only the bits of e stay live through the bisection."""
    seen = n > 0
    _store(row_ptrs + P_MIN * sr_f, tl.min(tl.where(visible, e, float("inf")), axis=1) / z, seen, row_mask)
    _store(row_ptrs + P_MAX * sr_f, tl.max(e, axis=1) / z, seen, row_mask)
    bits = tl.where(visible, e.to(tl.int32, bitcast=True), INF_BITS)  # e >= 0 orders as its bits; hidden last
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
