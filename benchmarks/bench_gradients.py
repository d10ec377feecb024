"""Benchmark the gradient analysis against extract's forward on the same model and batch (run by hand).

    python benchmarks/bench_gradients.py [--shapes toy-neox bert-base pythia-160m] [--n-sequences 16]
        [--seq-len 128] [--batch 8] [--threads 2] [--repeat 3] [--device cpu] [--out benchmarks/out/gradients.json]

Models are built from config with random weights (no download), in their LM class (the gradient pass needs the
head): `toy-neox` / `toy-bert` (the default sweep's toys, d = 64), `bert-mini` (BertForMaskedLM, d = 256, 4
layers, 30522 tokens), `pythia-70m` (GPTNeoXForCausalLM, d = 512, 6 layers, 50304 tokens), `bert-base` (d = 768,
12 layers, 30522 tokens), `pythia-160m` (d = 768, 12 layers, 50304 tokens). Per shape, in one
process, interleaved over --repeat repetitions (median reported):

* `extract`: anisweep.extract.run.run, the base model's recorded forward, as the extract rule runs it;
* `gradient_pass`: anisweep.tangent.backward.gradient_pass, forward through the LM head plus backward to the sites;
* `analysis`: anisweep.tangent.analysis.analyse (semi-NMF, PCA, random controls, shares, isotropy per stratum);

reported as ratios to `extract`. Peak memory, each variant in a fresh process: on a CPU the kernel's
high-water mark of resident memory (VmHWM, reset through /proc/self/clear_refs after one warm-up pass) minus
the resident memory before the measured pass; on CUDA torch.cuda.max_memory_allocated minus the allocation
before the pass.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch


def _shape(arch: str, d: int, layers: int, heads: int, ff: int, vocab: int) -> tuple[str, dict]:
    size = dict(hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=ff)
    return arch, {**size, "vocab_size": vocab}


SHAPES = {
    "toy-neox": _shape("gpt_neox", 64, 4, 4, 256, 2048),
    "toy-bert": _shape("bert", 64, 4, 4, 256, 2048),
    "bert-mini": _shape("bert", 256, 4, 4, 1024, 30522),
    "pythia-70m": _shape("gpt_neox", 512, 6, 8, 2048, 50304),
    "bert-base": _shape("bert", 768, 12, 12, 3072, 30522),
    "pythia-160m": _shape("gpt_neox", 768, 12, 12, 3072, 50304),
}


def build(shape: str, folder: Path, seq_len: int) -> Path:
    from transformers import BertConfig, BertForMaskedLM, GPTNeoXConfig, GPTNeoXForCausalLM

    arch, kw = SHAPES[shape]
    path = folder / shape
    if (path / "config.json").exists():
        return path
    torch.manual_seed(0)
    if arch == "bert":
        model = BertForMaskedLM(BertConfig(max_position_embeddings=max(512, seq_len), **kw))
    else:
        config = GPTNeoXConfig(
            max_position_embeddings=max(2048, seq_len), rotary_pct=0.25, use_parallel_residual=True, **kw
        )
        model = GPTNeoXForCausalLM(config)
    model.save_pretrained(path)
    return path


def batch_for(shape: str, n: int, t: int, seed: int = 0) -> dict:
    vocab = SHAPES[shape][1]["vocab_size"]
    g = torch.Generator().manual_seed(seed)
    # Zipf-like ids so that the frequency strata are not degenerate
    ranks = torch.arange(1, vocab - 9, dtype=torch.float64)
    ids = torch.multinomial(1 / ranks, n * t, replacement=True, generator=g).reshape(n, t) + 10
    return {"input_ids": ids, "attention_mask": torch.ones(n, t, dtype=torch.long)}


class Case:
    def __init__(self, path: Path, shape: str, args):
        from anisweep.adapters import adapter_for
        from anisweep.extract.model import ExtractSettings, load_model
        from anisweep.tangent.backward import load_lm
        from anisweep.tangent.batch import causal_lm_batch, masked_lm_batch
        from anisweep.tangent.settings import GradientSettings

        self.device = torch.device(args.device)
        self.batch = batch_for(shape, args.n_sequences, args.seq_len)
        self.settings = ExtractSettings(
            n_sequences=args.n_sequences, seq_len=args.seq_len, batch_size=args.batch, device=args.device,
            sample_tokens=min(4096, args.n_sequences * args.seq_len),
        )  # fmt: skip
        self.loaded = load_model(path, device=self.device)
        self.lm_model, self.adapter = load_lm(path, device=self.device)
        self.geometry = adapter_for(self.lm_model.config).geometry(self.lm_model.config)
        self.grad_settings = GradientSettings(enabled=True)
        arch = SHAPES[shape][0]
        ids, valid = self.batch["input_ids"], self.batch["attention_mask"].bool()
        if arch == "bert":
            self.lm = masked_lm_batch(ids, valid, 4, [0, 1, 2, 3, 4], SHAPES[shape][1]["vocab_size"], 0.15, 0)
        else:
            self.lm = causal_lm_batch(ids, valid)
        self.result = None

    def run(self, variant: str) -> None:
        from anisweep.extract.run import run
        from anisweep.tangent.analysis import analyse
        from anisweep.tangent.backward import gradient_pass

        g = self.geometry
        if variant == "extract":
            run(self.loaded, self.batch, self.settings, progress=False)
        elif variant == "gradient_pass":
            self.result = gradient_pass(
                self.lm_model, self.adapter, g.d_model, g.n_layers, self.lm, self.grad_settings,
                self.settings.batch_size, progress=False,
            )  # fmt: skip
        else:
            if self.result is None:
                self.run("gradient_pass")
            analyse(self.result, self.grad_settings, g.d_model, progress=False)
        if self.device.type == "cuda":
            torch.cuda.synchronize()


VARIANTS = ("extract", "gradient_pass", "analysis")


def speed(path: Path, shape: str, args) -> dict:
    case = Case(path, shape, args)
    for variant in VARIANTS:  # warm-up
        case.run(variant)
    seconds = {v: [] for v in VARIANTS}
    for rep in range(args.repeat):
        order = VARIANTS[rep % 3 :] + VARIANTS[: rep % 3]
        for variant in order:
            started = time.perf_counter()
            case.run(variant)
            seconds[variant].append(time.perf_counter() - started)
    median = {v: statistics.median(s) for v, s in seconds.items()}
    return {
        "seconds": median,
        "ratio_to_extract": {v: median[v] / median["extract"] for v in VARIANTS},
        "all_seconds": seconds,
    }


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(path: Path, shape: str, variant: str, args) -> dict:
    case = Case(path, shape, args)
    if variant == "analysis":
        case.run("gradient_pass")
    case.run(variant)  # warm-up
    if case.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        case.run(variant)
        return {"peak_bytes": torch.cuda.max_memory_allocated() - before}
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    before = _rss_kb("VmRSS")
    case.run(variant)
    return {"peak_bytes": (_rss_kb("VmHWM") - before) * 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["toy-neox", "toy-bert", "bert-mini", "pythia-70m"])
    parser.add_argument("--n-sequences", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--models", default="/tmp/anisweep-bench-models", help="where the random-weight models are saved"
    )
    parser.add_argument("--out", default="benchmarks/out/gradients.json")
    parser.add_argument("--child", nargs=2, metavar=("SHAPE", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = Path(args.models)
    if args.child:
        shape, variant = args.child
        print(json.dumps(memory_child(build(shape, folder, args.seq_len), shape, variant, args)))
        return
    report = {
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": args.threads},
        "settings": {k: v for k, v in vars(args).items() if k != "child"},
        "shapes": {},
    }
    for shape in args.shapes:
        path = build(shape, folder, args.seq_len)
        entry = speed(path, shape, args)
        memory = {}
        for variant in VARIANTS:
            command = [sys.executable, __file__, *sys.argv[1:], "--child", shape, variant]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            memory[variant] = json.loads(out.strip().splitlines()[-1])["peak_bytes"]
        entry["peak_bytes"] = memory
        entry["peak_ratio_to_extract"] = {v: memory[v] / max(memory["extract"], 1) for v in VARIANTS}
        report["shapes"][shape] = entry
        print(shape, json.dumps({k: entry[k] for k in ("seconds", "ratio_to_extract", "peak_bytes")}), flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # after every shape: a stopped run keeps its part
        Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
