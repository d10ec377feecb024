"""benchmarks/count_launches.py on the toys: the operators extract dispatches per mini-batch stay under a bound, so
that a new statistic cannot quietly add launches per site; and the counter sees such an addition."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "count_launches.py"
spec = importlib.util.spec_from_file_location("count_launches", SCRIPT)
counter = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = counter  # its dataclasses look their module up
spec.loader.exec_module(counter)

#: extract's ops per mini-batch over a plain forward's, on the toys (2 sequences of 16 tokens, 2 layers): today's
#: figure and 1% more, which one new op per site and mini-batch exceeds
BOUNDS = {("pythia-tiny", "torch"): 15.8, ("pythia-tiny", "triton"): 15.2}


@pytest.fixture(scope="module")
def pythia_tiny():
    return counter.measure("pythia-tiny", 2, 16)


@pytest.mark.slow  # the toy's count on meta: ~17 s, shared by the tests below
@pytest.mark.parametrize("path", ["torch", "triton"])
def test_extract_dispatches_at_most_its_bound_of_a_plain_forwards_ops(pythia_tiny, path):
    assert pythia_tiny[path]["ratio"] <= BOUNDS[("pythia-tiny", path)], pythia_tiny[path]["by_function"]


@pytest.mark.slow
def test_the_torch_paths_count_does_not_grow_with_the_batch_on_a_device(pythia_tiny):
    """On a GPU (and meta) the sequences that share one mask take their attention in one chunk, not one each."""
    twice = counter.measure("pythia-tiny", 4, 16, paths=["torch"])
    assert twice["torch"]["total"] == pythia_tiny["torch"]["total"]


@pytest.mark.slow
def test_every_op_is_attributed_to_a_site_a_layer_and_a_function(pythia_tiny):
    counts = pythia_tiny["triton"]
    for breakdown in ("by_site", "by_layer", "by_function", "by_op"):
        assert sum(counts[breakdown].values()) == counts["total"]
    assert {"resid", "attention", "qk_pre", "model"} <= set(counts["by_site"])
    assert any(op.startswith("triton:") for op in counts["by_op"])  # the kernels' launches, counted instead of run


@pytest.mark.slow  # a second count of the toy: ~7 s on meta
def test_a_new_op_per_site_shows_in_the_count(monkeypatch, pythia_tiny):
    from anisweep.extract import streaming

    partial = streaming.VectorStats.partial

    def one_more(x, valid, *args, **kwargs):
        part = partial(x, valid, *args, **kwargs)
        return part | {"extra": part["norm_range"].neg().sqrt()}  # two ops more per site and batch

    monkeypatch.setattr(streaming.VectorStats, "partial", staticmethod(one_more))
    grown = counter.measure("pythia-tiny", 2, 16, paths=["triton"])
    assert grown["triton"]["total"] > pythia_tiny["triton"]["total"]
    assert grown["triton"]["ratio"] > BOUNDS[("pythia-tiny", "triton")]


def test_a_plain_forward_counts_sdpa_as_one_launch():
    model = counter.meta_model("bert-tiny")
    plain = counter.count_plain(model, counter.batch("bert-tiny", 2, 16))
    assert plain.by("op")["scaled_dot_product_attention"] == 2  # one per layer
    assert torch.device("meta") == next(model.parameters()).device
