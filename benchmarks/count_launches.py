"""How many operators extract dispatches for one mini-batch, beside a plain forward's: the kernel launches a GPU pays
for, counted on the meta device (shapes, no values), so that it runs on any machine in seconds.

Models are built from config on `meta` with random weights (bert-base, pythia-160m, pythia-1.4b and OLMo-2-1B
shapes; the `-tiny` ones are the tests' toys). Each is run three ways over one all-valid mini-batch:
- `plain`: the base model's forward with sdpa attention and no hooks, the reference of every ratio;
- `torch`: anisweep.extract.run.run with `attention: torch`, the path a GPU takes for rows over 2,048 keys and
  score-biased models; on meta it takes the branches a GPU takes (masks instead of branches, one attention chunk
  per sequence), not the CPU's;
- `triton`: the same with `attention: triton`, each kernel launch counted once instead of run.

What is counted: every aten operator whose arguments or result live on the device (meta), less those that launch
no kernel (views, allocations: `NO_KERNEL`); the composite operators as the ops they decompose into, as a device
runs them; sdpa as one launch (a fused kernel on a GPU, its math decomposition on meta). Host-side ops (the masks
extract builds on the CPU) are left out. On an H200's profile this count agreed with cudaLaunchKernel within 1%.

Each op of extract is attributed to the innermost function of the package that dispatched it (`function`) and to
the Recorder's site it was recording (`site`: a hooked site's name, `attention` for a layer's attention and its
q/k, `qk_pre` for q/k before the rotation, `batch` for a mini-batch's setup and finish; `model` outside them), with
its layer.

    python benchmarks/count_launches.py                       # every shape, table and JSON under benchmarks/out/
    python benchmarks/count_launches.py --shapes bert-base --batch 4 8 --seq-len 512
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

OUT = Path(__file__).resolve().parent / "out"
aten = torch.ops.aten

TINY = {"vocab_size": 60, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
NEOX = {"rotary_pct": 0.25, "use_parallel_residual": True, "tie_word_embeddings": False}
SHAPES = {  # name -> (transformers class, config class, config)
    "bert-base": (
        "BertModel",
        "BertConfig",
        {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12}
        | {"intermediate_size": 3072, "max_position_embeddings": 512},
    ),
    "pythia-160m": (
        "GPTNeoXModel",
        "GPTNeoXConfig",
        {"vocab_size": 50304, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12}
        | {"intermediate_size": 3072, "max_position_embeddings": 2048, **NEOX},
    ),
    "pythia-1.4b": (
        "GPTNeoXModel",
        "GPTNeoXConfig",
        {"vocab_size": 50304, "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16}
        | {"intermediate_size": 8192, "max_position_embeddings": 2048, **NEOX},
    ),
    "OLMo-2-1B": (
        "Olmo2Model",
        "Olmo2Config",
        {"vocab_size": 100352, "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16}
        | {"num_key_value_heads": 16, "intermediate_size": 8192, "max_position_embeddings": 4096}
        | {"rope_theta": 500000.0, "rms_norm_eps": 1e-6},
    ),
    "bert-tiny": ("BertModel", "BertConfig", {**TINY, "max_position_embeddings": 64}),
    "pythia-tiny": ("GPTNeoXModel", "GPTNeoXConfig", {**TINY, "max_position_embeddings": 64, **NEOX}),
    "olmo2-tiny": ("Olmo2Model", "Olmo2Config", {**TINY, "max_position_embeddings": 64}),
}
REAL_SHAPES = [name for name in SHAPES if not name.endswith("-tiny")]
PATHS = ("torch", "triton")

#: ops that launch no kernel on a GPU: views and allocations
NO_KERNEL = {
    aten.empty,
    aten.empty_strided,
    aten.empty_like,
    aten.new_empty,
    aten.new_empty_strided,
    aten.resize_,
    aten.set_,
    aten.detach,
    aten.alias,
    aten.lift_fresh,
    aten._unsafe_view,
    aten._reshape_alias,
    aten.sym_size,
    aten.sym_stride,
    aten.sym_numel,
    aten.sym_storage_offset,
}
SDPA = {torch.nn.functional.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}
PACKAGE = f"{Path('src', 'anisweep')}"
MODEL_CODE = f"{Path('site-packages', 'transformers')}"
#: Recorder methods that name the site being recorded: method -> the site, or the local variable that holds it
SITE_FRAMES = {
    "record_vectors": "site",
    "attend": "attention",
    "attend_on_grid": "attention",
    "record_pre_rotary": "qk_pre",
    "begin_batch": "batch",
    "finish": "batch",
}


@dataclass
class Counts:
    """The ops of one pass: (phase, site, layer, function, op) -> count."""

    ops: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    def of(self, phases) -> Counts:
        return Counts(Counter({key: n for key, n in self.ops.items() if key[0] in phases}))

    def by(self, *fields: str) -> dict:
        index = [("phase", "site", "layer", "function", "op").index(name) for name in fields]
        out = Counter()
        for key, n in self.ops.items():
            if n:
                out[" ".join(str(key[i]) for i in index)] += n
        return dict(out.most_common())


class OpCounter(TorchDispatchMode):
    """Counts the device ops dispatched inside it (see the module's doc for what counts)."""

    def __init__(self):
        super().__init__()
        self.counts = Counts()
        self.paused = 0
        self.phase = "setup"  # or the mini-batch (1, 2, ...) whose loop step is running, or "end" after the loop

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if composite(func):
            with self:  # count the ops it is made of, as a device's kernels run them
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        if func.overloadpacket is aten.copy_ and args[0].device.type == "cpu" and args[1].device.type != "cpu":
            out = args[0]  # a copy into host memory (the sample's): meta holds no data to copy
        else:
            out = func(*args, **kwargs)
        if not self.paused and launches(func) and on_device((args, kwargs, out)):
            self.add(func.overloadpacket.__name__)
        return out

    def add(self, op: str, n: int = 1) -> None:
        self.counts.ops[(self.phase, *attribution(sys._getframe(2)), op)] += n

    def batches(self, iterable, **_):
        """Stands in for run's tqdm: each mini-batch's loop step is a phase of its own."""
        for i, item in enumerate(iterable, start=1):
            self.phase = i
            yield item
        self.phase = "end"


class OneLaunchSdpa(TorchFunctionMode):
    """sdpa counted as the one fused kernel a GPU runs, not as the math ops meta decomposes it into."""

    def __init__(self, counter: OpCounter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in SDPA:
            return func(*args, **kwargs)
        self.counter.add("scaled_dot_product_attention")
        self.counter.paused += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.counter.paused -= 1


@functools.cache
def composite(func) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


@functools.cache
def launches(func) -> bool:
    return not func.is_view and func.overloadpacket not in NO_KERNEL


def on_device(tree) -> bool:
    return any(t.device.type != "cpu" for t in tree_leaves(tree) if isinstance(t, torch.Tensor))


def attribution(frame) -> tuple[str, object, str]:
    """(site, layer, function) of the op dispatched from `frame` (see the module's doc)."""
    function = None
    while frame is not None:
        code = frame.f_code
        if function is None and MODEL_CODE in code.co_filename:
            return "model", "-", "model"  # the model's own op, even where extract's adapter called the model
        if PACKAGE in code.co_filename:
            if function is None:
                module = code.co_filename.rsplit(PACKAGE, 1)[1].strip("/\\").removesuffix(".py")
                function = f"{module.replace('/', '.').replace(chr(92), '.')}.{code.co_qualname}"
            site = SITE_FRAMES.get(code.co_name)
            if site is not None and code.co_filename.endswith("recorder.py"):
                local = frame.f_locals
                return local.get(site, site), local.get("layer", "-"), function
        frame = frame.f_back
    return ("model" if function is None else "extract"), "-", function or "model"


@contextlib.contextmanager
def counting():
    """An OpCounter, with sdpa counted as one launch and every Triton launch counted instead of run."""
    counter = OpCounter()
    with contextlib.ExitStack() as stack:
        stack.enter_context(triton_launches_counted(counter))
        stack.enter_context(OneLaunchSdpa(counter))
        stack.enter_context(counter)
        yield counter


@contextlib.contextmanager
def triton_launches_counted(counter: OpCounter):
    """attention_triton's launches counted as one op each (its kernels cannot run on meta); its wrapper's ops run."""
    try:
        from anisweep.extract import attention_triton
    except ImportError:  # no Triton: the triton path is not counted
        yield
        return
    launch, interpreted = attention_triton.Launch.__call__, attention_triton.INTERPRETED

    def count(self):
        counter.add(f"triton:{getattr(self.kernel, '__name__', type(self.kernel).__name__)}")

    attention_triton.Launch.__call__, attention_triton.INTERPRETED = count, True  # INTERPRETED: off CUDA, it runs
    try:
        yield
    finally:
        attention_triton.Launch.__call__, attention_triton.INTERPRETED = launch, interpreted


def meta_model(shape: str, dtype: torch.dtype = torch.float32):
    import transformers

    cls_name, config_name, config = SHAPES[shape]
    with torch.device("meta"):
        model = getattr(transformers, cls_name)(getattr(transformers, config_name)(**config))
    return model.to(dtype).eval()


def batch(shape: str, n: int, seq_len: int) -> dict:
    vocab = SHAPES[shape][2]["vocab_size"]
    ids = torch.randint(4, vocab, (n, seq_len), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones(n, seq_len, dtype=torch.long)}


@torch.inference_mode()
def count_plain(model, inputs: dict) -> Counts:
    model.set_attn_implementation("sdpa")
    with counting() as counter:  # no mask: the batch has no padding, and HF reads a mask's values to skip it
        model(input_ids=inputs["input_ids"].to("meta", non_blocking=True))
    return counter.counts


def count_extract(model, inputs: dict, attention: str) -> tuple[Counts, Counts]:
    """(the ops of a mini-batch, those once per checkpoint) of extract over `inputs` (every statistic at the
    settings' defaults, one in eight tokens sampled): two mini-batches run, the second's loop step is the
    mini-batch's, the rest (the accumulators' setup, what the first batch adds, the finish) once per checkpoint."""
    import warnings

    from anisweep.adapters import adapter_for
    from anisweep.extract import run as run_module
    from anisweep.extract.model import ExtractSettings, LoadedModel
    from anisweep.extract.recorder import ATTENTION_NAME, register_attention

    register_attention()
    model.set_attn_implementation(ATTENTION_NAME)
    adapter = adapter_for(model.config)
    loaded = LoadedModel(model, adapter.base_model(model), adapter, adapter.geometry(model.config))
    n, t = inputs["input_ids"].shape
    settings = ExtractSettings(
        n_sequences=2 * n, seq_len=t, batch_size=n, sample_tokens=max(1, n * t // 4), device="meta", attention=attention
    )
    tqdm = run_module.tqdm
    with warnings.catch_warnings(), counting() as counter:
        warnings.simplefilter("error")  # a fallback from the triton path to the torch one would count the wrong path
        run_module.tqdm = counter.batches
        try:
            run_module.run(loaded, {name: x.repeat(2, 1) for name, x in inputs.items()}, settings, progress=False)
        finally:
            run_module.tqdm = tqdm
    batch = counter.counts.of({2})
    once = Counts(Counter(counter.counts.ops))
    for (_, *key), n in batch.ops.items():
        once.ops[(1, *key)] -= n
    once.ops.subtract(batch.ops)
    return batch, once


def measure(shape: str, n: int, seq_len: int, paths=PATHS, dtype: torch.dtype = torch.float32) -> dict:
    """The plain forward's count and each path's, with the ratios, per site, per layer and per function."""
    model = meta_model(shape, dtype)
    inputs = batch(shape, n, seq_len)
    plain = count_plain(model, inputs).of({"setup"})
    out = {"shape": shape, "n_sequences": n, "seq_len": seq_len, "dtype": str(dtype).removeprefix("torch.")}
    out["plain"] = plain.total
    for path in paths:
        counts, setup = count_extract(model, inputs, path)
        out[path] = {
            "total": counts.total,
            "once_per_checkpoint": setup.total,
            "ratio": counts.total / plain.total,
            "by_site": counts.by("site"),
            "by_layer": counts.by("layer"),
            "by_function": counts.by("function"),
            "by_op": counts.by("op"),
            "by_function_op": dict(list(counts.by("function", "op").items())[:40]),
        }
    return out


def growth(small: dict, large: dict, path: str = "torch") -> float:
    """Ops a path adds per added sequence, from two counts of the same shape."""
    return (large[path]["total"] - small[path]["total"]) / (large["n_sequences"] - small["n_sequences"])


def markdown(results: list[dict], seq_len: int) -> str:
    lines = [
        f"Operators dispatched for one mini-batch of {seq_len} tokens a sequence, counted on the meta device "
        "(benchmarks/count_launches.py); the ratio is to a plain sdpa forward's.",
        "",
        "| shape | sequences | plain | extract, triton path | ratio | extract, torch path | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        cells = [str(r["plain"])]
        for path in ("triton", "torch"):
            cells += ["-", "-"] if path not in r else [str(r[path]["total"]), f"{r[path]['ratio']:.1f}x"]
        lines.append(f"| {r['shape']} | {r['n_sequences']} | " + " | ".join(cells) + " |")
    by_shape = {}
    for r in results:
        by_shape.setdefault(r["shape"], []).append(r)
    grown = [(shape, rs) for shape, rs in by_shape.items() if len(rs) > 1 and all("torch" in r for r in rs)]
    if grown:
        lines += [
            "",
            "| shape | torch path: ops per added sequence | triton path: ops per added sequence |",
            "|---|---:|---:|",
        ]
        for shape, rs in grown:
            small, large = rs[0], rs[-1]
            triton = f"{growth(small, large, 'triton'):.0f}" if all("triton" in r for r in rs) else "-"
            lines.append(f"| {shape} | {growth(small, large):.0f} | {triton} |")
    for r in results:
        if r is not by_shape[r["shape"]][-1]:
            continue
        for path in ("triton", "torch"):
            if path not in r:
                continue
            top = list(r[path]["by_function"].items())[:10]
            lines += ["", f"{r['shape']} x {r['n_sequences']}, {path} path: the largest senders", ""]
            lines += ["| function | ops | per layer |", "|---|---:|---:|"]
            n_layers = SHAPES[r["shape"]][2]["num_hidden_layers"]
            lines += [f"| {name} | {n} | {n / n_layers:.0f} |" for name, n in top]
            sites = list(r[path]["by_site"].items())
            lines += ["", "| site | ops |", "|---|---:|"] + [f"| {name} | {n} |" for name, n in sites]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=REAL_SHAPES, choices=list(SHAPES))
    ap.add_argument("--batch", nargs="+", type=int, default=[4, 8], help="sequences per mini-batch (default 4 8)")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    ap.add_argument("--out", type=Path, default=OUT / "launches", help="writes OUT.json and OUT.md")
    a = ap.parse_args(argv)
    results = []
    for shape in a.shapes:
        for n in a.batch:
            started = time.perf_counter()
            r = measure(shape, n, a.seq_len, a.paths, getattr(torch, a.dtype))
            paths = ", ".join(f"{p} {r[p]['total']} ({r[p]['ratio']:.1f}x)" for p in a.paths)
            print(f"{shape} x {n}: plain {r['plain']}, {paths} [{time.perf_counter() - started:.1f} s]", flush=True)
            results.append(r)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    a.out.with_suffix(".md").write_text(markdown(results, a.seq_len))
    print(markdown(results, a.seq_len))


if __name__ == "__main__":
    main()
