"""The weight hash in extract.json is of the bytes extract loaded, never a stale one from fetch's manifest (a
checkpoint re-saved after its fetch, then --rerun-incomplete); files that change while extract reads them stop it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest
from safetensors.torch import load_file, save_file

import anisweep.checkpoints.weight_files as weight_files
from anisweep.checkpoints.fetch import fetch
from anisweep.checkpoints.weight_files import WeightFiles, WeightFilesChanged, hash_files
from anisweep.extract.model import ExtractSettings
from anisweep.extract.run import extract_checkpoint
from anisweep.measures.sweep import find_duplicates

from hubcache import save_tiny_pythia

SETTINGS = ExtractSettings(n_sequences=2, seq_len=16, batch_size=2, sample_tokens=32, device="cpu")
TEXTS = ["the cat sat on the mat and the dog sat on the log " * 20] * 4


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_hash_streams_files_in_sorted_order(tmp_path, monkeypatch):
    (tmp_path / "b.bin").write_bytes(b"B" * (3 << 20))
    (tmp_path / "a.bin").write_bytes(b"A" * 10)
    monkeypatch.setattr(weight_files, "CHUNK", 1 << 20)
    assert hash_files(tmp_path, ["b.bin", "a.bin"]) == hashlib.sha256(b"A" * 10 + b"B" * (3 << 20)).hexdigest()


def test_extract_json_holds_the_hash_of_the_bytes_extract_loaded_not_the_manifests(tmp_path):
    """A checkpoint re-saved with other weights after its fetch: the manifest's (old-style) hash is stale, and
    extract.json records the files' true hash, which the sweep's duplicate detection reads."""
    from anisweep.checkpoints.base import Checkpoint

    run = tmp_path / "run"
    folder = save_tiny_pythia(run / "step1", seed=0)
    ckpt = Checkpoint("local", "run", 1, None, None, path=str(folder))
    manifest = fetch(ckpt, tmp_path / "weights")
    manifest |= {"weights_sha256": "0" * 64, "weight_files_sha256": {"model.safetensors": "0" * 64}}
    shutil.copy(save_tiny_pythia(tmp_path / "other", seed=1) / "model.safetensors", folder / "model.safetensors")
    info = extract_checkpoint(manifest, TEXTS, SETTINGS, tmp_path / "out", progress=False)
    written = json.loads((tmp_path / "out" / "extract.json").read_text())["checkpoint"]
    true = sha256(folder / "model.safetensors")
    assert info["checkpoint"]["weights_sha256"] == written["weights_sha256"] == true
    assert written["weight_files_sha256"] == {"model.safetensors": true}
    assert written["weights_bytes"] == (folder / "model.safetensors").stat().st_size
    # a later step holding the old bytes is no duplicate of this one
    old = {"family": "local", "model": "run", "step": 2, "weights_sha256": "0" * 64}
    assert find_duplicates([written, old]) == []


def test_weight_files_that_change_after_the_hash_stop_extract(tmp_path):
    folder = save_tiny_pythia(tmp_path / "step1")
    read = WeightFiles.read(folder)
    read.check_unchanged("local/run/step1")  # untouched: no error
    tensors = load_file(folder / "model.safetensors")
    path = folder / "model.safetensors"
    save_file({k: v + 1 for k, v in tensors.items()}, path, metadata={"format": "pt"})
    later = read.stats["model.safetensors"][1] + 10**9  # the same size; a save a second later (coarse clocks)
    os.utime(path, ns=(later, later))
    with pytest.raises(WeightFilesChanged, match=r"local/run/step1: model.safetensors in .* changed while extract"):
        read.check_unchanged("local/run/step1")


def test_extract_stops_when_the_files_change_while_it_loads_them(tmp_path, monkeypatch):
    from anisweep.extract import run as extract_run

    folder = save_tiny_pythia(tmp_path / "step1")
    load = extract_run.load_model

    def load_while_another_process_saves(path, *args, **kwargs):
        loaded = load(path, *args, **kwargs)
        st = (folder / "model.safetensors").stat()
        os.utime(folder / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        return loaded

    monkeypatch.setattr(extract_run, "load_model", load_while_another_process_saves)
    manifest = {"family": "local", "model": "run", "step": 1, "path": str(folder), "tokenizer_path": str(folder)}
    with pytest.raises(WeightFilesChanged, match="run extract again once the checkpoint is saved"):
        extract_checkpoint(manifest, TEXTS, SETTINGS, tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "extract.json").exists()
