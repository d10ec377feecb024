"""The copies of a checkpoint's fetched weights that fetch shares with the jobs reading them after extract
(anisweep.weights.fetched): hard links (no byte copied), read in place, removed by the job."""

from __future__ import annotations

import json
import shutil

import torch
from transformers import GPTNeoXForCausalLM

from anisweep.weights.fetched import fetched_source, release, share

from conftest import neox_config, saved


def fetched_folder(tmp_path, into_folder=True):
    """A folder as fetch leaves it: its manifest, and the downloaded weights in `weights/` (or, from the Hugging
    Face cache, elsewhere)."""
    model = saved(tmp_path, GPTNeoXForCausalLM, neox_config(), "lm")
    folder = tmp_path / "weights/pythia/pythia-70m/step1000"
    folder.mkdir(parents=True)
    path = folder / "weights" if into_folder else model
    if into_folder:
        shutil.copytree(model, path)
    manifest = {"repo_id": "EleutherAI/pythia-70m", "path": str(path), "tokenizer_path": None, "commit": "c" * 40}
    (folder / "checkpoint.json").write_text(json.dumps(manifest))
    return folder, model


def test_a_shared_copy_is_hard_links_read_in_place_and_removed_by_its_job(tmp_path):
    folder, model = fetched_folder(tmp_path)
    copy = folder.with_name("step1000.read-by-weights")
    assert share(folder, [copy]) == [copy]
    original, linked = folder / "weights/model.safetensors", copy / "weights/model.safetensors"
    assert linked.stat().st_ino == original.stat().st_ino  # the same file: no byte copied
    shutil.rmtree(folder)  # extract done: its temp folder deleted
    source, _ = fetched_source(copy)
    name = "gpt_neox.embed_in.weight"
    expected = GPTNeoXForCausalLM.from_pretrained(model).state_dict()[name]
    assert torch.equal(source.get(name), expected)
    release(copy)
    assert not copy.exists()


def test_weights_fetch_did_not_download_are_not_shared(tmp_path):
    """From the Hugging Face cache (fetch.keep_weights, offline): the jobs read the cache themselves."""
    folder, _ = fetched_folder(tmp_path, into_folder=False)
    copy = folder.with_name("step1000.read-by-weights")
    assert share(folder, [copy]) == []
    assert fetched_source(copy) is None and not copy.exists()
    release(copy)  # no copy: nothing to do


def test_where_hard_links_fail_nothing_is_shared(tmp_path, monkeypatch, capsys):
    """A file system without hard links: fetch still succeeds, and the jobs read by range requests."""
    folder, _ = fetched_folder(tmp_path)
    copy = folder.with_name("step1000.read-by-weights")

    def no_links(src, dst, **kwargs):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr("anisweep.weights.fetched.os.link", no_links)
    assert share(folder, [copy]) == []
    assert not copy.exists() and not copy.with_name(copy.name + ".partial").exists()
    assert "read by range requests" in capsys.readouterr().err
