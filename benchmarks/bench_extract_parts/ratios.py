"""The `ratios` part (CPU): speed and memory of every variant against the plain forward, at --batch x each of
--seq-lens: speed in one `speed` process per venv (TransformerLens in its own, with its own plain baseline), memory in
one `memory` process per variant."""

from __future__ import annotations

import sys
from pathlib import Path

from .core import spawn
from .memory import ratios
from .speed import spawn_speed

TABLE_HEAD = "| model | batch x seq | variant | speed vs plain | peak RSS vs plain | live tensors vs plain |"
VARIANT_NAMES = {
    "extract": "anisweep extract",
    "hf_keep_all": "HF keep-all (eager)",
    "tl": "TransformerLens run_with_cache",
}


def table_line(r: dict) -> str:
    return (
        f"| {r['shape']} | {r['batch']}x{r['seq_len']} | {VARIANT_NAMES[r['variant']]} | "
        f"{r['speed_ratio']:.2f}x | {r['rss_ratio']:.2f}x | {r['live_ratio']:.2f}x |"
    )


def ratio_rows(a, shape: str, t: int) -> list[dict]:
    """Speed (one process per venv) and memory (one process per variant) of every variant at batch x t."""
    common = dict(threads=a.threads, batch=a.batch)
    tl_ok = a.tl_python and Path(a.tl_python).exists()
    print(f"[{shape} {a.batch}x{t}] speed ...", flush=True)
    sp = spawn_speed(a, shape, t, ["plain", "extract", "hf_keep_all"], a.repeat or 7)
    if tl_ok:
        sp_tl = spawn_speed(a, shape, t, ["plain", "tl"], a.repeat or 7, python=a.tl_python)
        sp["tl"] = sp_tl["tl"]
        sp["tl"]["plain_tokens_per_s_same_process"] = sp_tl["plain"]["tokens_per_s"]
    mem = {}
    for name in ("plain", "extract", "hf_keep_all"):
        print(f"[{shape} {a.batch}x{t}] memory {name} ...", flush=True)
        mem[name] = spawn(
            sys.executable, "memory", shape=shape, seq_len=t, n_sequences=a.batch, variants=[name], **common
        )
    if tl_ok:
        for name in ("plain", "tl"):
            print(f"[{shape} {a.batch}x{t}] memory {name} (TransformerLens venv) ...", flush=True)
            mem[f"tl_{name}"] = spawn(
                a.tl_python,
                "memory",
                shape=shape,
                seq_len=t,
                n_sequences=a.batch,
                variants=[name],
                tl_env=True,
                **common,
            )
    rows = []
    for name in sp:
        if name == "plain":
            continue
        m, base = (mem["tl_tl"], mem["tl_plain"]) if name == "tl" else (mem[name], mem["plain"])
        row = {
            "shape": shape,
            "batch": a.batch,
            "seq_len": t,
            "variant": name,
            "speed_ratio": sp[name]["speed_ratio"],
            "cpu_speed_ratio": sp[name]["cpu_speed_ratio"],
            "tokens_per_s": sp[name]["tokens_per_s"],
            "plain_tokens_per_s": sp["plain"]["tokens_per_s"],
            **ratios(m, base),
            "memory": m,
            "plain_memory": base,
            "speed": sp[name],
        }
        rows.append(row)
        print(
            f"  {name:12s} speed {row['speed_ratio']:.2f}x (cpu {row['cpu_speed_ratio']:.2f}x)  "
            f"peak RSS {row['rss_ratio']:.2f}x  live {row['live_ratio']:.2f}x "
            f"(activations {row['live_activation_ratio']:.2f}x)",
            flush=True,
        )
    return rows
