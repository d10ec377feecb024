"""The attention of one layer as torch ops, with every per-row statistic: the CPU path, and the GPU's where
Triton is missing or the rows are too long for its kernel (anisweep.extract.attention_triton)."""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import torch

from anisweep.extract.streaming import LOG2_E, ROW_FIELDS, masked_exp_, row_statistics

CHUNK_ELEMENTS = 2**20
#: on a GPU, scores a chunk holds at most (64 MB in float32): the sequences of a batch that share one mask together,
#: so that the launches do not grow with the batch, in a bounded buffer
DEVICE_CHUNK_ELEMENTS = 2**24
ROW_BLOCKS, MIN_ROW_BLOCK = 8, 32
TINY = torch.finfo(torch.float32).tiny


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


def chunks(n_seqs: int, n_heads: int, n_scores: int, device: torch.device, shared: bool):
    """(sequences, heads) slices whose n_scores each are processed together: on CPU about CHUNK_ELEMENTS
    scores, so that a chunk's scores and probabilities stay in cache and its ops are few enough that
    their fixed costs do not add up; on a GPU up to DEVICE_CHUNK_ELEMENTS, at least a whole sequence. A chunk
    spans several sequences only when they share one mask (`shared`)."""
    if device.type == "cpu":
        per_chunk = max(1, CHUNK_ELEMENTS // n_scores)
    else:
        per_chunk = max(n_heads, DEVICE_CHUNK_ELEMENTS // n_scores)
    if per_chunk < n_heads or not shared:
        step = min(per_chunk, n_heads)
        return [
            (slice(seq, seq + 1), slice(first, first + step))
            for seq in range(n_seqs)
            for first in range(0, n_heads, step)
        ]
    step = per_chunk // n_heads
    return [(slice(first, first + step), slice(None)) for first in range(0, n_seqs, step)]


def row_blocks(seq_len: int, causal: bool) -> list[slice]:
    """Query rows processed together. Causal row blocks skip the keys no row of the block sees, which
    saves ~40% of the work: the scores of rows [r0, r1) are computed against keys [0, r1) only."""
    if not causal:
        return [slice(0, seq_len)]
    size = max(MIN_ROW_BLOCK, seq_len // ROW_BLOCKS)
    return [slice(r0, min(r0 + size, seq_len)) for r0 in range(0, seq_len, size)]


def attend(
    query,
    key,
    value,
    scaling: float,
    blocks,
    all_valid: bool,
    workers: Workers,
    scratch: Scratch,
    bias=None,
    valid=None,
):
    """Attention output (B, H, T, d_v) (stored as (B, T, H, d_v), the layout the model wants next), per-row
    statistics (B, H, T, len(ROW_FIELDS)) and column sums (B, H, L) of one layer, in chunks of (sequences, heads,
    query rows). `blocks` are the batch's (query rows, VisibleKeys of
    each sequence, or of all when `all_valid`) from `row_blocks`. `bias`, (1 or B, H, T, T): added to the scaled
    scores before the softmax (T5's relative position bias); the score statistics include it. `valid`, (B, T)
    bool: the query rows whose probabilities the column sums add up, sum_i p_ij over them (the attention key j
    receives: streaming.SinkStats); without it the column sums are None."""
    b, h, t, _ = query.shape
    if bias is not None:  # in bits, as the scores
        bias = bias.float().mul(LOG2_E).expand(b, h, t, key.shape[2])
    output = value.new_empty(b, t, h, value.shape[-1]).transpose(1, 2)  # stored as the model reads it next
    row_stats = query.new_empty(b, h, t, len(ROW_FIELDS), dtype=torch.float32)
    # one partial sum per row block: the blocks of one sequence and head run on different threads
    parts = None if valid is None else query.new_zeros(len(blocks), b, h, key.shape[2], dtype=torch.float32)
    weights = None if valid is None else valid.float()[:, None, :].expand(b, h, t)
    query, key = query.float(), key.float()
    zero = query.new_zeros(())
    plan = [
        (i, rows, keys, seqs, heads)
        for i, (rows, keys) in enumerate(blocks)
        for seqs, heads in chunks(b, h, (rows.stop - rows.start) * keys[0].n_keys, query.device, all_valid)
    ]
    if any(seqs.stop - seqs.start > 1 for *_, seqs, _ in plan):
        # chunks of several sequences read (sequences x heads) as one batch dim: a view only where the heads of
        # one sequence follow each other, else a copy per chunk (causal blocks copy the keys again for each)
        query, key, value = query.contiguous(), key.contiguous(), value.contiguous()

    def chunk(seqs, heads, rows, keys, part):
        keys_slice = slice(0, keys.n_keys)
        # a view whenever the chunk is one sequence or whole heads, as chunks makes them: the out=
        # writes below land in row_stats (and in output where the chunk is one sequence, else copied there)
        flat = lambda x, pos: x[seqs, heads, pos].flatten(0, 1)  # noqa: E731
        q, k = flat(query, rows), flat(key, keys_slice)
        chunk_rows, target = flat(row_stats, rows), output[seqs, heads, rows]
        one_sequence = seqs.stop - seqs.start == 1
        chunk_output = target[0] if one_sequence else scratch.get("output", (*q.shape[:2], value.shape[-1]), value)
        shape = (q.shape[0], q.shape[1], k.shape[1])
        scores = torch.baddbmm(
            zero, q, k.transpose(-1, -2), beta=0.0, alpha=scaling * LOG2_E, out=scratch.get("scores", shape, q)
        )
        if bias is not None:
            scores.add_(bias[seqs, heads, rows, keys_slice].reshape(shape))
        e = masked_exp_(scores, keys, chunk_rows, out=scratch.get("e", shape, q))
        torch.bmm(e.to(value.dtype), flat(value, keys_slice), out=chunk_output)
        chunk_output.div_(chunk_rows[..., ROW_FIELDS.index("z"), None])
        if not one_sequence:
            target.copy_(chunk_output.view(target.shape))
        if part is not None:  # sum_i p_ij = sum_i (valid_i / Z_i) e_ij: one pass over e, before it is partitioned
            z = chunk_rows[..., ROW_FIELDS.index("z")]
            w = flat(weights, rows) / z.clamp_min(TINY)  # 0 on padding rows, whose Z may be 0
            flat(part, keys_slice).copy_(torch.bmm(w[:, None, :], e).squeeze(1))
        row_statistics(scores, e, keys, chunk_rows)

    tasks = [
        partial(chunk, seqs, heads, rows, keys[0 if all_valid else seqs.start], None if parts is None else parts[i])
        for i, rows, keys, seqs, heads in plan
    ]
    workers.run(tasks)
    colsum = None if parts is None else (parts[0] if len(blocks) == 1 else parts.sum(dim=0))
    return output, row_stats, colsum
