"""The `flat` part (CPU): extract's memory as n_sequences grows (--flat-n, in batches of --batch, at the longest of
--seq-lens, keeping the sweep config's whole hidden-state sample), against the plain forward of one batch from the
`ratios` part."""

from __future__ import annotations

import sys

from .core import spawn, sweep_settings
from .memory import ratios

TABLE_HEAD = "| model | n_sequences x seq | extract peak RSS (MB) | vs plain batch | live tensors (MB) |"


def table_line(f: dict) -> str:
    return (
        f"| {f['shape']} | {f['n_sequences']}x{f['seq_len']} | {f['memory']['rss_hwm_mb']:.0f} | "
        f"{f['rss_ratio']:.2f}x | {f['memory']['live_peak_mb']:.0f} |"
    )


def flat_rows(a, shape: str, rows: list[dict]) -> list[dict]:
    """extract's memory as n_sequences grows (batches of --batch), against the plain forward of one batch."""
    t = max(a.seq_lens)
    plain = next(
        r["plain_memory"] for r in rows if r["shape"] == shape and r["seq_len"] == t and r["variant"] == "extract"
    )
    out = []
    for n in a.flat_n:
        print(f"[{shape}] extract memory, {n} sequences of {t} in batches of {a.batch} ...", flush=True)
        m = spawn(
            sys.executable,
            "memory",
            shape=shape,
            seq_len=t,
            n_sequences=n,
            variants=["extract"],
            sample_tokens=sweep_settings(shape)["sample_tokens"],
            threads=a.threads,
            batch=a.batch,
        )
        out.append({"shape": shape, "seq_len": t, "n_sequences": n, **ratios(m, plain), "memory": m})
        print(
            f"  n={n:4d}  peak RSS {m['rss_hwm_mb']:.0f} MB ({out[-1]['rss_ratio']:.2f}x plain)  "
            f"live {m['live_peak_mb']:.0f} MB",
            flush=True,
        )
    return out
