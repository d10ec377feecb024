"""Where one layer's attention time goes in extract, against the fused sdpa kernel (run by hand).

    python benchmarks/bench_attention.py [--batch 8] [--seq-len 512] [--heads 12] [--d-head 64] [--repeat 15]

One thread, float32, random q/k/v of a bert-base layer (8 x 512 by default). Times, medians over
--repeat: sdpa (what a plain forward runs); extract's whole attention for the layer
(`Recorder.attend`: scores, softmax, output, every statistic); and two parts of it measured alone on
the same data, the two matmuls (scores and output, in extract's chunks) and the row sort that gives the
exact median. The rest is the elementwise passes over the scores (softmax and the statistics' sums).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from anisweep.adapters.base import Geometry
from anisweep.extract import attention_torch
from anisweep.extract import recorder as recorder_mod

HERE = Path(__file__).resolve()


def median_ms(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--d-head", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--out", default=str(HERE.parent / "out" / "attention.json"))
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    b, h, t, d = a.batch, a.heads, a.seq_len, a.d_head
    q, k, v = (torch.randn(b, t, h, d).transpose(1, 2) for _ in range(3))  # the layout HF passes
    valid = torch.ones(b, t, dtype=torch.bool)
    geometry = Geometry(n_layers=1, n_heads=h, d_model=h * d, d_head=d, rotary_dims=0, causal=False)
    recorder = recorder_mod.Recorder(
        geometry, recorder_mod.Sample.draw(torch.zeros(b, t, dtype=torch.long), valid, 1, 0), torch.device("cpu")
    )
    recorder.begin_batch(valid, 0)
    qc, kc, vc = (x.contiguous().flatten(0, 1) for x in (q, k, v))
    per_chunk = max(1, attention_torch.CHUNK_ELEMENTS // (t * t))  # heads per chunk, as extract takes them
    chunk_scores, output = torch.empty(per_chunk, t, t), torch.empty(b * h, t, d)
    scores = torch.empty(b * h, t, t)

    def matmuls():  # into one reused buffer, as extract's per-thread scratch
        for first in range(0, b * h, per_chunk):
            chunk = slice(first, first + per_chunk)
            n = len(range(b * h)[chunk])
            torch.bmm(qc[chunk], kc[chunk].transpose(1, 2), out=chunk_scores[:n])
            torch.bmm(chunk_scores[:n], vc[chunk], out=output[chunk])

    def sort():
        scores.copy_(torch.rand_like(scores))  # timed alone too: the sort is the difference
        return scores

    with torch.inference_mode():
        times = {
            "sdpa": median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), a.repeat),
            "extract_attention": median_ms(lambda: recorder.attend(0, q, k, v, d**-0.5), a.repeat),
            "matmuls": median_ms(matmuls, a.repeat),
            "sort_and_refill": median_ms(lambda: sort().numpy().sort(axis=-1), a.repeat),
            "refill": median_ms(sort, a.repeat),
        }
    times["sort"] = times.pop("sort_and_refill") - times.pop("refill")
    times["passes"] = times["extract_attention"] - times["matmuls"] - times["sort"]
    result = {
        "shape": {"batch": b, "seq_len": t, "heads": h, "d_head": d},
        "threads": 1,
        "ms": times,
        "torch": torch.__version__,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2))
    for name, ms in times.items():
        print(f"{name:18s} {ms:7.1f} ms  ({ms / times['sdpa']:.2f}x sdpa)")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
