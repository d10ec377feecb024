"""The Triton attention kernels compiled ahead of time, without a GPU, for every shape the sweeps run (run by hand).

    python benchmarks/compile_kernels.py [--arch 90 80] [--out-dir benchmarks/out] [--jobs N]

Run it without TRITON_INTERPRET. For each architecture (sm_90, sm_80), dtype (bfloat16 and float16: the fused kernel
where its tiles fit, else the scores kernel; float32: the scores kernel), d_head (64, 80, 128), keys per row T
(128 ... 4096) and causal or not, `attention_triton.plan` picks the kernel, blocks and warps that `attend` would
launch, on tensors laid out as extract passes them (B, T, H, d transposed, B = 2, H = 12); Triton's own binder
specialises the launch's arguments as a real launch would (strides of 1 as constants, 16-byte alignment), and
triton.compile builds it for that target. ptxas's -v log (Triton's TRITON_DUMP_PTXAS_LOG) gives the registers and
spills (Triton's n_regs and n_spills come from the driver, once a device loads the binary), Triton's metadata the
shared memory. A configuration fits when nothing spills and its shared memory is
within the architecture's per-block limit. Rows of more than MAX_KEYS keys compile nothing: extract runs them as
torch ops. Everything here is static (what ptxas allocates), not timed.

Writes out/kernel_compile.json and out/kernel_compile.md and prints the table.
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import re
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from contextlib import redirect_stdout
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource
from triton.compiler.compiler import make_backend
from triton.runtime.jit import create_function_from_signature

from anisweep.extract import attention_triton
from anisweep.extract.streaming import ROW_FIELDS

HERE = Path(__file__).resolve()
ARCHS = (90, 80)
# Shared memory one block may use (the opt-in maximum), from the CUDA C++ Programming Guide's table of compute
# capabilities: 227 KB on 9.0 (H100), 163 KB on 8.0 (A100). Assumed, as no device is here to ask.
SHARED_LIMIT = {90: 227 * 1024, 80: 163 * 1024}
DTYPES = ("bfloat16", "float16", "float32")
D_HEADS = (64, 80, 128)
KEYS = (128, 256, 512, 1024, 2048, 4096)
BATCH, HEADS = 2, 12
COLUMNS = (
    "arch",
    "kernel",
    "dtype",
    "d_head",
    "T",
    "causal",
    "BLOCK_M",
    "BLOCK_N",
    "num_warps",
    "registers",
    "spill_stores",
    "spill_loads",
    "shared",
    "fits",
)


def configurations(archs) -> list[dict]:
    return [
        {"arch": arch, "dtype": dtype, "d_head": d, "T": t, "causal": causal}
        for arch in archs
        for dtype in DTYPES
        for d in D_HEADS
        for t in KEYS
        for causal in (False, True)
    ]


def first_launch(config: dict) -> attention_triton.Launch | None:
    """The (first) kernel launch of `attend` on this shape, or None where extract keeps the torch path."""
    b, h, t, d, dtype = BATCH, HEADS, config["T"], config["d_head"], getattr(torch, config["dtype"])
    query, key, value = (torch.empty(b, t, h, d, dtype=dtype).transpose(1, 2) for _ in range(3))  # as HF passes
    if not attention_triton.supports(query):
        return None
    chosen = attention_triton.plan(query, value)
    valid = torch.ones(b, t, dtype=torch.uint8)
    rows = torch.empty(b, h, t, len(ROW_FIELDS))
    if chosen.fused:
        output = value.new_empty(b, t, h, d).transpose(1, 2)
        return attention_triton.fused_launch(query, key, value, d**-0.5, valid, config["causal"], output, rows, chosen)
    scores = torch.empty(b, h, t, t)  # one chunk of the scores path's buffer
    return attention_triton.scores_launch(scores, valid, rows, config["causal"], chosen)


def specialised(launch: attention_triton.Launch, arch: int):
    """ASTSource and options of the launch for the target, specialised by the JIT's own binder."""
    fn, backend = launch.kernel, make_backend(GPUTarget("cuda", arch, 32))
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **launch.meta)
    options, signature, constexprs, attrs = fn._pack_args(backend, launch.meta, bound, specialization, options)
    return ASTSource(fn, signature, constexprs, attrs), options


def compile_key(config: dict) -> str:
    """Configurations with one key compile to one binary (the scores kernel ignores d_head and dtype)."""
    launch = first_launch(config)
    if launch is None:
        return f"torch-{config}"
    src, options = specialised(launch, config["arch"])
    return f"{config['arch']}-{src.hash()}-{options.num_warps}"


def compile_one(config: dict) -> dict:
    launch = first_launch(config)
    row = dict(config, kernel="torch", BLOCK_M=None, BLOCK_N=None, num_warps=None)
    row.update(registers=None, spill_stores=None, spill_loads=None, shared=None, fits=True, error=None)
    if launch is None:
        return row
    row.update(
        kernel=launch.kernel.__name__.strip("_"),
        BLOCK_M=launch.meta["BLOCK_M"],
        BLOCK_N=launch.meta["BLOCK_N"],
        num_warps=launch.meta["num_warps"],
    )
    src, options = specialised(launch, config["arch"])
    log = io.StringIO()
    try:
        with redirect_stdout(log):
            kernel = triton.compile(src, target=GPUTarget("cuda", config["arch"], 32), options=options.__dict__)
    except Exception as error:  # a configuration that does not compile is a row of the table, not the end of it
        return dict(row, fits=False, error=f"{type(error).__name__}: {str(error).strip().split(chr(10), 1)[0]}")
    row.update(ptxas_usage(log.getvalue()), shared=kernel.metadata.shared)
    row["fits"] = row["spill_stores"] == row["spill_loads"] == 0 and row["shared"] <= SHARED_LIMIT[config["arch"]]
    return row


def ptxas_usage(log: str) -> dict:
    registers = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if registers is None or spills is None:
        raise RuntimeError(f"no register or spill counts in ptxas's log:\n{log}")
    return {
        "registers": int(registers.group(1)),
        "spill_stores": int(spills.group(1)),
        "spill_loads": int(spills.group(2)),
    }


def _init_worker() -> None:
    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")  # the default is what a launch gets
    triton.knobs.nvidia.dump_ptxas_log = True  # printed by make_cubin; compile_one reads it
    triton.knobs.compilation.always_compile = True  # a cache hit would skip ptxas and its log


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = ["—" if row[name] is None else str(row[name]) for name in COLUMNS]
        cells[COLUMNS.index("kernel")] += f" ({row['error']})" if row["error"] else ""
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, nargs="+", default=list(ARCHS), choices=ARCHS)
    ap.add_argument("--out-dir", default=str(HERE.parent / "out"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    a = ap.parse_args(argv)
    if attention_triton.INTERPRETED:
        raise SystemExit("compile_kernels: unset TRITON_INTERPRET; the interpreter compiles nothing")
    started = time.perf_counter()
    _init_worker()
    configs = configurations(a.arch)
    keys = [compile_key(config) for config in configs]
    unique = {key: config for key, config in zip(keys, configs)}
    # spawned workers: a forked one inherits locks held by the parent's threads (torch, Triton) and can wait forever
    with ProcessPoolExecutor(a.jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker) as pool:
        compiled = dict(zip(unique, pool.map(compile_one, unique.values())))
    rows = [dict(compiled[key], **config) for key, config in zip(keys, configs)]
    seconds = time.perf_counter() - started
    report = {
        "triton": triton.__version__,
        "ptxas": {arch: get_ptxas(arch).version for arch in a.arch},
        "shared_limit": {arch: SHARED_LIMIT[arch] for arch in a.arch},
        "max_keys": attention_triton.MAX_KEYS,
        "compiles": len(unique),
        "seconds": round(seconds, 1),
        "configurations": rows,
    }
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel_compile.json").write_text(json.dumps(report, indent=1) + "\n")
    summary = (
        f"Triton {triton.__version__}; {len(unique)} compiles for {len(rows)} configurations in {seconds:.0f} s. "
        f"Static (ptxas -v), not timed. Shared-memory limits per block: "
        + ", ".join(f"sm_{arch} {SHARED_LIMIT[arch]} bytes" for arch in a.arch)
        + f". kernel 'torch': T > MAX_KEYS = {attention_triton.MAX_KEYS}, extract runs these rows as torch ops.\n\n"
    )
    table = summary + markdown(rows)
    (out / "kernel_compile.md").write_text(table)
    print(table)
    misfits = [row for row in rows if not row["fits"]]
    if misfits:
        print(f"{len(misfits)} configurations spill, exceed shared memory or fail to compile")
    return 1 if misfits else 0


if __name__ == "__main__":
    raise SystemExit(main())
