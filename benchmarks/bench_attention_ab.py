"""One layer's attention through extract's torch path, two source trees interleaved in one process (run by hand).

    git archive <commit> src | tar -x -C /tmp/old
    python benchmarks/bench_attention_ab.py --old /tmp/old/src [--new src] [--seq-len 512] [--repeat 15]

One thread, 8 sequences x 12 heads x 64 dims, random q, k, v, no padding: sdpa, the old tree's attend and the new
one's, in turn, each repetition; prints the median process CPU ms of each, causal (pythia-160m's attention) and
bidirectional (bert-base's). Fails where the two trees' outputs, row statistics or column sums differ in any bit.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def load(path: str):
    """anisweep's attention modules from the source tree `path`, imported afresh."""
    for name in [name for name in sys.modules if name.startswith("anisweep")]:
        del sys.modules[name]
    sys.path.insert(0, path)
    try:
        from anisweep.extract import attention_torch, streaming
    finally:
        sys.path.remove(path)
    return attention_torch, streaming


def measure(trees: dict, causal: bool, t: int, repeat: int) -> dict:
    b, h, d = 8, 12, 64
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, t, h, d, generator=g).transpose(1, 2) for _ in range(3))  # as transformers hands them
    hidden = torch.ones(t, t, dtype=torch.bool).triu(1) if causal else torch.zeros(t, t, dtype=torch.bool)
    valid = torch.ones(b, t, dtype=torch.bool)
    runs = {"sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)}
    for name, (attention, streaming) in trees.items():
        blocks = [
            (rows, [streaming.VisibleKeys.build(hidden[rows, : (rows.stop if causal else t)])])
            for rows in attention.row_blocks(t, causal)
        ]
        workers, scratch = attention.Workers(1), attention.Scratch()
        runs[name] = lambda a=attention, bl=blocks, w=workers, s=scratch: a.attend(
            q, k, v, 0.125, bl, True, w, s, valid=valid
        )
    times = {name: [] for name in runs}
    with torch.inference_mode():
        old, new = runs["old"](), runs["new"]()
        if not all(torch.equal(x, y) for x, y in zip(old, new)):
            raise SystemExit("the two trees' attention differs")
        for _ in range(repeat):
            for name, run in runs.items():
                started = time.process_time()
                run()
                times[name].append((time.process_time() - started) * 1e3)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the old source tree (its src folder)")
    ap.add_argument("--new", default="src")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=15)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    trees = {"old": load(a.old), "new": load(a.new)}
    print("| attention | sdpa | old | new | new / old |")
    print("|---|---|---|---|---|")
    for causal in (True, False):
        ms = measure(trees, causal, a.seq_len, a.repeat)
        kind = "causal (pythia-160m)" if causal else "bidirectional (bert-base)"
        print(f"| {kind} | {ms['sdpa']:.0f} | {ms['old']:.0f} | {ms['new']:.0f} | {ms['new'] / ms['old']:.2f} |")


if __name__ == "__main__":
    main()
