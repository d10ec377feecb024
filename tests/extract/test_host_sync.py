"""No host synchronisation inside extract's forward passes (issue 27), checked rather than assumed.

The trap: the whole of `run` (each mini-batch's setup and forward pass, with the Recorder, its Hooks and the
registered attention function; models loaded on `meta`, the mask's CPU copy as `host_valid`) runs on the
`meta` device, whose tensors have shapes but no values. Whatever reads a value back fails there, and two modes
refuse, with the line that asked, what would make a GPU's host wait:
- ReadTrap (a TorchFunctionMode): `.item()`, `bool()`, `int()`, `float()`, `.tolist()`, `.numpy()` of a device
  tensor, and device tensors made from Python data (`torch.tensor(data, device=...)`, `new_tensor`: a blocking
  copy from the host that the dispatcher never shows);
- CopyTrap (a TorchDispatchMode, on the ops as the device runs them, composite ones decomposed): the ops whose
  result or output shape the host reads (`_local_scalar_dense`, `nonzero`, `bincount`, `unique`, indexing by a
  boolean mask, ...) and copies between host and device that are not non-blocking (`.to(device)`, `.cpu()`).
  The copies extract means to make, non-blocking copies of the sampled tokens into its host buffers (pinned on
  CUDA, read after Recorder.finish's one synchronize), cannot run out of meta: CopyTrap records them instead
  of running them, and the test checks that they land in those buffers and nowhere else.

On meta the code takes the branches a CUDA run takes wherever it asks `device.type != "cpu"`: VectorStats'
masks instead of branches, one attention chunk per sequence, torch.sort, VisibleKeys moved to the device,
scatter_add_ for the score histogram, the sample's non-blocking copies. The branches that ask for "cuda" (the
pinning, the Triton kernel, finish's synchronize) it cannot take: `attention: auto` runs the torch path off
CUDA, as a GPU does for the shapes the kernel declines. test_on_a_gpu_no_op_of_a_run_synchronises checks those
on a GPU, with torch's own sync debug mode.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
import transformers
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from anisweep.extract.model import ExtractSettings, load_model
from anisweep.extract.run import run

from conftest import bert_config, llama_config, neox_config, padded_batch, saved

aten = torch.ops.aten

READS = {  # ops whose result the host reads, or whose output's shape depends on the values
    aten._local_scalar_dense,
    aten.is_nonzero,
    aten.equal,
    aten.nonzero,
    aten.nonzero_numpy,
    aten.masked_select,
    aten.bincount,
    aten._unique,
    aten._unique2,
    aten.unique_dim,
    aten.unique_consecutive,
    aten.unique_dim_consecutive,
    aten.repeat_interleave,  # by a tensor of repeats: int repeats decompose to expand and clone first
}
MASKED = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}  # by a boolean mask: a nonzero
TENSOR_READS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__"}
FROM_HOST_DATA = {torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor}


class HostSyncError(AssertionError):
    pass


@contextlib.contextmanager
def host_sync_trap():
    """Refuse, inside the context, everything that makes the host wait for a tensor on a device (any device
    but the CPU); yields the CopyTrap, whose `copies` are the non-blocking copies into host memory."""
    copies = CopyTrap()
    with ReadTrap(), copies:
        yield copies


class ReadTrap(TorchFunctionMode):
    """The host reading a device tensor's value (`bool(t)`, `.item()`, `.tolist()`, ...), and tensors made on a
    device from Python data (`torch.tensor(data, device=...)`, `new_tensor`, `t[i] = number`: a blocking copy the
    dispatcher does not show)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in TENSOR_READS and args[0].device.type != "cpu":
            refuse(f"Tensor.{name} reads a device value back")
        if name == "__setitem__" and args[0].device.type != "cpu" and not isinstance(args[2], torch.Tensor):
            # on CUDA the number becomes a host tensor copied in (on meta it is made on meta, which CopyTrap allows)
            refuse(f"Tensor.__setitem__ copies a Python value into {args[0].device}, and the host waits for it")
        if func in FROM_HOST_DATA:
            device = kwargs.get("device") or (args[0].device if func is torch.Tensor.new_tensor else "cpu")
            if torch.device(device).type != "cpu":
                refuse(f"{name} copies Python data to {device}, and the host waits for it")
        return func(*args, **kwargs)


class CopyTrap(TorchDispatchMode):
    """Every op as the device runs it: refuses those whose output depends on a device value's being read, and
    copies between host and device that are not non-blocking. The non-blocking copies of device tensors
    into host memory (extract's sample copies) cannot run out of meta: they are recorded, not run."""

    def __init__(self):
        super().__init__()
        self.copies: list[tuple[torch.Tensor, torch.Tensor]] = []  # (host target, device source)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            with self:  # check the ops it is made of, as the device's kernels see them
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        on_device = any(t.device.type != "cpu" for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
        packet = func.overloadpacket
        if on_device and packet in READS:
            refuse(f"{func} reads a device value back")
        if on_device and packet in MASKED and any(is_mask(i) for i in args[1]):
            refuse(f"{func} by a boolean mask (a nonzero)")
        if packet is aten._to_copy:
            target = torch.device(kwargs.get("device") or args[0].device)
            check_copy(func, args[0].device, target, kwargs.get("non_blocking", False))
        if packet is aten.copy_:
            target, source = args[:2]
            non_blocking = kwargs.get("non_blocking", len(args) > 2 and args[2])
            if check_copy(func, source.device, target.device, non_blocking) == "to host":
                self.copies.append((target, source))
                return target
        return func(*args, **kwargs)


def check_copy(func, source: torch.device, target: torch.device, non_blocking: bool) -> str | None:
    """None for a copy within the host or within the device; else "to device" or "to host" (into memory the
    caller holds, copy_), or refused."""
    if (source.type == "cpu") == (target.type == "cpu"):
        return None
    if not non_blocking:
        refuse(f"{func}: a blocking copy from {source} to {target}")
    if target.type != "cpu":
        return "to device"
    if func.overloadpacket is not aten.copy_:
        refuse(f"{func}: a device tensor copied into fresh host memory, which the host reads only after a wait")
    return "to host"


def is_mask(index) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def refuse(message: str):
    """Raise, naming the line of anisweep (or of the model) that asked for it."""
    frames = [f for f in traceback.extract_stack()[:-2] if "anisweep" in f.filename or "transformers" in f.filename]
    where = f" at {frames[-1].filename}:{frames[-1].lineno} ({frames[-1].line})" if frames else ""
    raise HostSyncError(message + where)


MODELS = {
    "bert": (transformers.BertModel, bert_config),
    "gpt_neox": (transformers.GPTNeoXForCausalLM, neox_config),
    "llama": (transformers.LlamaModel, llama_config),  # grouped-query attention: the repeated key heads
}


def run_on_meta(tmp_path, kind: str, score_bins=True):
    cls, config = MODELS[kind]
    loaded = load_model(saved(tmp_path, cls, config(), kind), device="meta")
    bins = {"low": -4.0, "high": 4.0, "n": 16} if score_bins else None
    settings = ExtractSettings(batch_size=2, sample_tokens=20, qk_sample_tokens=8, device="meta", score_bins=bins)
    with host_sync_trap() as trap:
        recorder = run(loaded, padded_batch(), settings, progress=False)
    return recorder, trap


def host_buffers(recorder) -> dict[int, str]:
    """The host buffers the sampled tokens are copied into (pinned on CUDA), by their storage's address."""
    named = [(f"sample {key}", b) for key, b in recorder.samples.items()]
    named += [(f"qk_sample {key}", b) for key, b in recorder.qk_sample.vectors.items()]
    return {b.untyped_storage().data_ptr(): name for name, b in named}


@pytest.mark.slow  # over ~1.5 s: the quick subset leaves it to the full run
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_a_whole_extract_run_never_waits_for_the_device(tmp_path, kind):
    recorder, trap = run_on_meta(tmp_path, kind)
    assert recorder.attention[0].sums["entropy"].device.type == "meta"
    assert recorder.score_hist.counts[0].device.type == "meta"
    assert recorder.attention[0].n_rows == int(padded_batch()["attention_mask"].sum())
    buffers = host_buffers(recorder)
    targets = [buffers.get(target.untyped_storage().data_ptr()) for target, _ in trap.copies]
    assert None not in targets  # no copy to the host but into the sample's buffers
    assert set(targets) == set(buffers.values())  # and every one of them filled
    assert all(source.device.type == "meta" for _, source in trap.copies)


def test_the_trap_catches_a_read_back(tmp_path, monkeypatch):
    """An `.item()` slipped into the attention statistics' update, once per layer, fails the run."""
    from anisweep.extract.streaming import AttentionStats

    update = AttentionStats.update

    def reads_back(self, rows, *args, **kwargs):
        rows.sum().item()
        return update(self, rows, *args, **kwargs)

    monkeypatch.setattr(AttentionStats, "update", reads_back)
    with pytest.raises(HostSyncError, match="reads a device value back"):
        run_on_meta(tmp_path, "bert")


@pytest.mark.parametrize(
    "wait",
    [
        lambda x: x.sum().item(),
        lambda x: bool(x.any()),
        lambda x: x.nonzero(),
        lambda x: x[x > 0],
        lambda x: torch.bincount(x.long()),
        lambda x: torch.tensor([1.0], device=x.device),
        lambda x: torch.zeros(3).to(x.device),
        lambda x: x.__setitem__(1, float("-inf")),
        lambda x: x.cpu(),
        lambda x: x.to("cpu", non_blocking=True),
    ],
    ids=[
        "item",
        "bool",
        "nonzero",
        "mask",
        "bincount",
        "tensor",
        "to device",
        "setitem",
        "cpu",
        "to fresh host memory",
    ],
)
def test_the_trap_refuses_each_kind_of_wait(wait):
    x = torch.zeros(3, device="meta")
    with host_sync_trap(), pytest.raises(HostSyncError):
        wait(x)


def test_the_trap_lets_non_blocking_copies_through_and_records_those_to_the_host():
    x, host = torch.zeros(3, device="meta"), torch.empty(3)
    with host_sync_trap() as trap:
        assert torch.ones(3).to(x.device, non_blocking=True).device == x.device
        host[:2].copy_(x[:2], non_blocking=True)
    assert [(t.data_ptr(), s.device.type) for t, s in trap.copies] == [(host.data_ptr(), "meta")]


def test_the_score_histogram_counts_alike_without_bincount():
    """bin_counts' GPU way (scatter_add_, no read back) against bincount, the CPU's, including empty bins."""
    from anisweep.extract.score_hist import bin_counts

    index = torch.randint(0, 7, (1000,), generator=torch.Generator().manual_seed(0))
    index[index == 3] = 9
    expected = torch.bincount(index, minlength=11)
    assert torch.equal(bin_counts(index, 11, wait_free=True), expected)
    assert torch.equal(bin_counts(index, 11), expected)


GPU_RUN = """
import sys, warnings
from pathlib import Path
import torch, transformers
from anisweep.extract import attention_triton
from anisweep.extract.model import ExtractSettings, load_model
from anisweep.extract.run import run
import conftest

assert not attention_triton.INTERPRETED
models = [(transformers.BertModel, conftest.bert_config), (transformers.GPTNeoXForCausalLM, conftest.neox_config)]
for i, (cls, config) in enumerate(models):
    loaded = load_model(conftest.saved(Path(sys.argv[1]), cls, config(), str(i)), device="cuda")
    for attention in ("triton", "torch"):
        settings = ExtractSettings(batch_size=2, sample_tokens=20, qk_sample_tokens=8, device="cuda",
                                   attention=attention, score_bins={"low": -4.0, "high": 4.0, "n": 16})
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                run(loaded, conftest.padded_batch(), settings, progress=False)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        # the Triton path turns a launch's error into a fallback to the torch path, with a warning that says why
        assert not [w for w in caught if "synchroniz" in str(w.message)], [str(w.message) for w in caught]
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_no_op_of_a_run_synchronises(tmp_path):
    """On a GPU, torch's own check: with the sync debug mode at `error`, every op that synchronises the host with
    the device raises, on the CUDA branches meta does not take (pinned copies, the compiled Triton kernels).
    In a process without TRITON_INTERPRET, which conftest sets for the CPU's tests."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-c", GPU_RUN, str(tmp_path)], env=env, check=True)
