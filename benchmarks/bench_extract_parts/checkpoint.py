"""The `checkpoint` part: one checkpoint of each --shapes shape at the extract settings of its real sweep config
(SWEEPS), on --device, in a fresh process: loading the saved model, extract's run and its tables, against a plain
forward over the same sequences; and from it the projection of that whole sweep (downloads, wall and core hours).
Off the CPU it runs last, on what the budget leaves."""

from __future__ import annotations

import tempfile
import time

import torch

from .core import BUDGET_SPENT, SWEEPS, cell_text, spawn_in_budget, sweep_settings
from .models import hf_model, hf_model_config, make_batch

TABLE_HEAD = (
    "| sweep | checkpoints | GB downloaded | s per checkpoint (load + extract + tables) | "
    "plain forward s | wall h | CPU core-h |"
)


def table_line(c: dict) -> str:
    if "error" in c:
        return f"| {SWEEPS[c['shape']]['sweep']}: {cell_text(c['error'])} | | | | | | |"
    p = c["projection"]
    return (
        f"| {p['sweep']} ({c['n_sequences']}x{c['seq_len']}, {c.get('device', 'cpu')}, "
        f"{c['threads']} threads) | "
        f"{p['checkpoints']} | {p['gb_total']:.1f} | {p['seconds_per_checkpoint']:.1f} "
        f"({c['load_s']:.1f} + {c['extract_run_s']:.1f} + {c['tables_s']:.1f}) | "
        f"{c['plain_forward_s']:.1f} | {p['wall_hours']:.2f} | {p['cpu_core_hours']:.2f} |"
    )


def checkpoint(args) -> dict:
    """Wall time of one checkpoint at the extract settings of the shape's sweep config: loading the saved
    model, run, building the tables; and a plain forward over the same sequences."""
    from anisweep.extract import tables as extract_tables
    from anisweep.extract.model import ExtractSettings, load_model
    from anisweep.extract.run import run

    torch.set_num_threads(args.threads)
    settings = ExtractSettings(**{**sweep_settings(args.shape), "device": args.device})  # as the sweep's jobs
    device = settings.torch_device()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        hf_model(args.shape).save_pretrained(tmp)
        started = time.perf_counter()
        parts = load_model(tmp, settings.dtype, device)
        sync()
        load_s = time.perf_counter() - started
        batch = make_batch(args.shape, settings.n_sequences, settings.seq_len)
        started = time.perf_counter()
        recorder = run(parts, batch, settings, progress=False)
        sync()
        run_s = time.perf_counter() - started
        started = time.perf_counter()
        extract_tables.tables(
            recorder, parts, {"family": "bench", "model": args.shape, "seed": 0, "step": 0, "tokens_seen": 0}
        )
        tables_s = time.perf_counter() - started
        model = parts.model
        model.set_attn_implementation("sdpa")
        started = time.perf_counter()
        with torch.inference_mode():
            for first in range(0, settings.n_sequences, settings.batch_size):
                model(**{k: v[first : first + settings.batch_size].to(device) for k, v in batch.items()})
        sync()
        plain_s = time.perf_counter() - started
    return {
        "shape": args.shape,
        "device": str(device),
        "n_sequences": settings.n_sequences,
        "seq_len": settings.seq_len,
        "batch": settings.batch_size,
        "sample_tokens": settings.sample_tokens,
        "threads": args.threads,
        "load_s": load_s,
        "extract_run_s": run_s,
        "tables_s": tables_s,
        "plain_forward_s": plain_s,
    }


def checkpoint_row(a, shape: str) -> dict:
    """One checkpoint at the settings of the shape's sweep config, and the projection of the sweep from it."""
    import transformers

    announce = f"[{shape}] one checkpoint at the settings of {SWEEPS[shape]['config']} ..."
    row = spawn_in_budget(a, "checkpoint", "checkpoint", announce, shape=shape, threads=a.threads, device=a.device)
    if row is None:
        return {"shape": shape, **BUDGET_SPENT}
    if "error" in row:
        return {"shape": shape, "error": row["error"]}
    del row["seconds"]
    with torch.device("meta"):  # parameter counts of the checkpoints' own classes, without allocating them
        if shape == "bert":
            lm = transformers.BertForPreTraining(hf_model_config(shape))
        else:
            lm = transformers.GPTNeoXForCausalLM(hf_model_config(shape))
    sweep = SWEEPS[shape]
    n_params = sum(p.numel() for p in lm.parameters())  # tied weights once, as the weight files store them
    per_checkpoint_s = row["load_s"] + row["extract_run_s"] + row["tables_s"]
    row["projection"] = {
        **sweep,
        "params": n_params,
        "gb_per_checkpoint": n_params * sweep["bytes_per_param"] / 1e9,
        "gb_total": n_params * sweep["bytes_per_param"] * sweep["checkpoints"] / 1e9,
        "seconds_per_checkpoint": per_checkpoint_s,
        "wall_hours": per_checkpoint_s * sweep["checkpoints"] / 3600,
        "cpu_core_hours": per_checkpoint_s * sweep["checkpoints"] * a.threads / 3600,
        "gpu_hours": per_checkpoint_s * sweep["checkpoints"] / 3600 if a.device != "cpu" else None,
    }
    print(
        f"  {sweep['sweep']}: {per_checkpoint_s:.1f} s per checkpoint (run {row['extract_run_s']:.1f} s, "
        f"plain forward {row['plain_forward_s']:.1f} s), {row['projection']['gb_total']:.1f} GB",
        flush=True,
    )
    return row
