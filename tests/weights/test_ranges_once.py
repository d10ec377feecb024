"""A weights-only job of a Hub checkpoint asks for each byte range once: the built-in weight measures (`circuits`
and `weight_matrices`, one job) both read every layer's W_Q, W_K and W_V, and the second reads them back from the
bytes the first moved (anisweep.weights.held). Counted by the test Hub (tests/fakehub.py), per checkpoint."""

from __future__ import annotations

from collections import Counter

import pytest
from fakehub import FakeHub, online_hub, read_folder
from test_range_reads import REPO, hub_checkpoint, pythia_shaped, served
from transformers import GPTNeoXForCausalLM

from anisweep.checkpoints.base import Checkpoint
from anisweep.weights.builtin import builtin_weight_tables
from anisweep.weights.remote import HubSource

from conftest import saved

STEPS = (0, 1000)


@pytest.fixture
def two_steps(tmp_path):
    """A tiny GPT-NeoX LM with Pythia's proportions as branches step0 and step1000 (the same bytes at two commits:
    the same ranges, asked for once at each), and their local folders."""
    return {step: saved(tmp_path, GPTNeoXForCausalLM, pythia_shaped(), f"step{step}") for step in STEPS}


def hub_at(step: int) -> Checkpoint:
    ckpt = hub_checkpoint(f"step{step}")
    return Checkpoint(ckpt.family, ckpt.model, step, ckpt.tokens_seen, None, repo_id=REPO, revision=f"step{step}")


def local_at(path, step: int) -> Checkpoint:
    return Checkpoint("pythia", "pythia-70m", step, 1, None, path=str(path))


def test_builtin_weight_measures_ask_for_each_range_once_per_checkpoint(tmp_path, monkeypatch, two_steps, capsys):
    hub = FakeHub({REPO: {f"step{s}": read_folder(path) for s, path in two_steps.items()}})
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "hf", hub.url)
        remote = {s: builtin_weight_tables(hub_at(s)) for s in STEPS}
    asked = Counter(hub.ranges)
    again = {r: n for r, n in asked.items() if n > 1}
    assert asked and not again, f"{len(again)} ranges asked for more than once, e.g. {min(again)}"
    assert {path.split("/resolve/")[1].split("/")[0] for path, *_ in asked} == set(hub.commits[REPO].values())
    moved = sum(last + 1 - first for _, first, last in asked)
    assert served(hub) == moved
    reported = [line for line in capsys.readouterr().err.splitlines() if line.startswith("weights: read ")]
    assert sum(int(line.split(", ")[1].split()[0]) for line in reported) == moved
    for step, path in two_steps.items():
        rows, pairs = remote[step]
        local_rows, local_pairs = builtin_weight_tables(local_at(path, step))
        assert rows.drop("family", "model", "step", "tokens_seen").equals(
            local_rows.drop("family", "model", "step", "tokens_seen")
        )
        assert pairs == local_pairs


def test_rows_asked_for_again_are_read_back_not_requested(tmp_path, monkeypatch, two_steps):
    hub = FakeHub({REPO: {"step0": read_folder(two_steps[0])}})
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "hf", hub.url)
        source = HubSource(REPO, hub.commits[REPO]["step0"], ["model.safetensors"], two_steps[0])
        name = next(n for n in source.names() if n.endswith("query_key_value.weight"))
        spans = [(0, 8), (24, 32)]
        first = source.get_rows(name, spans)
        before, moved = len(hub.ranges), source.bytes_read
        again = source.get_rows(name, spans)
        whole, twice = source.get(name), source.get(name)
    assert again.equal(first) and twice.equal(whole)
    assert whole[0:8].equal(first[:8]) and whole[24:32].equal(first[8:])
    assert len(hub.ranges) == before + 1  # the whole matrix, once
    assert source.bytes_read == moved + whole.numel() * whole.element_size()
