"""Fetching weights: offline through a real-layout HF cache under the real repo ids, retries, hashing."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx2
import pytest
from huggingface_hub import HfApi
from huggingface_hub._revision import ResolvedRevision
from huggingface_hub.errors import HfHubHTTPError, RevisionNotFoundError
from huggingface_hub.utils import filter_repo_objects

import anisweep.checkpoints.fetch as fetch_mod
from anisweep.checkpoints.catalogue import resolve
from anisweep.checkpoints.fetch import FetchError, RevisionNotFound, fetch, select_files
from anisweep.checkpoints.weight_files import WeightFiles
from anisweep.measures.sweep import find_duplicates

from hubcache import build_hub_cache, offline_hub, repo_cache_dir, save_tiny_bert, save_tiny_pythia

TF = b"\x89HDF\r\n\x1a\n" + b"\0" * 64  # a dummy tf_model.h5: must never be fetched


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        "pythia": save_tiny_pythia(root / "pythia", seed=0, pytorch_bin=True),  # safetensors AND .bin
        "pythia_b": save_tiny_pythia(root / "pythia_b", seed=1),
        "bert": save_tiny_bert(root / "bert", seed=0),  # MultiBERTs layout: pytorch_model.bin only
    }


@pytest.fixture
def hub(monkeypatch, tmp_path, models):
    """An offline HF cache with pythia-70m step0/1000/143000 (143000 == 1000: a defect) and MultiBERTs seed_0."""
    hf_home = offline_hub(monkeypatch, tmp_path / "hf")
    commits = build_hub_cache(
        hf_home,
        "EleutherAI/pythia-70m",
        {"step0": models["pythia_b"], "step1000": models["pythia"], "step143000": models["pythia"]},
    )
    commits |= build_hub_cache(
        hf_home,
        "google/multiberts-seed_0-step_20k",
        {"main": models["bert"]},
        extra_files={"tf_model.h5": TF},
        remote_only={"flax_model.msgpack": b"flax"},
    )
    return hf_home, commits


def ckpt(family, name, step):
    (c,) = resolve({"family": family, "name": name, "steps": [step]})
    return c


def load(path):
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok("the cat sat on the mat", return_tensors="pt")
    return model(**ids).last_hidden_state.shape


# ---------------------------------------------------------------------------------------------- offline hub


def test_cache_layout_is_what_huggingface_hub_reads(hub):
    from huggingface_hub import get_cached_repo_tree, scan_cache_dir, try_to_load_from_cache

    hf_home, commits = hub
    repo = repo_cache_dir(hf_home, "EleutherAI/pythia-70m")
    assert (repo / "refs" / "step1000").read_text() == commits["step1000"]
    link = repo / "snapshots" / commits["step1000"] / "model.safetensors"
    assert link.is_symlink() and not os.path.isabs(os.readlink(link))
    assert Path(os.path.realpath(link)).parent == repo / "blobs"
    assert try_to_load_from_cache("EleutherAI/pythia-70m", "config.json", revision="step1000") == str(
        repo / "snapshots" / commits["step1000"] / "config.json"
    )
    tree = {f.path for f in get_cached_repo_tree("google/multiberts-seed_0-step_20k")}
    assert {"tf_model.h5", "flax_model.msgpack", "pytorch_model.bin", "vocab.txt"} <= tree
    info = scan_cache_dir()
    assert {r.repo_id for r in info.repos} == {"EleutherAI/pythia-70m", "google/multiberts-seed_0-step_20k"}
    # same weights under two refs share one blob
    assert os.path.realpath(link) == os.path.realpath(repo / "snapshots" / commits["step143000"] / "model.safetensors")


def test_fetch_pythia_offline_into_dest(hub, tmp_path):
    hf_home, commits = hub
    dest = tmp_path / "work" / "pythia" / "pythia-70m" / "step1000"
    m = fetch(ckpt("pythia", "pythia-70m", 1000), dest)
    assert json.loads((dest / "checkpoint.json").read_text()) == m
    assert [p.name for p in dest.iterdir() if p.name.startswith(".")] == []  # atomic write left no tmp file
    assert m["commit"] == commits["step1000"]
    assert (m["repo_id"], m["revision"], m["step"], m["tokens_seen"], m["seed"]) == (
        "EleutherAI/pythia-70m",
        "step1000",
        1000,
        1000 * 2_097_152,
        1234,
    )
    assert Path(m["path"]) == dest / "weights"
    # only what is loaded: safetensors preferred over the .bin the repo also has; no generation_config
    assert sorted(os.listdir(m["path"])) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert m["weight_files"] == ["model.safetensors"]
    # no hash: fetch never reads the weights; extract hashes the bytes it loads (anisweep.checkpoints.weight_files)
    assert "weights_sha256" not in m and m["weights_bytes"] == (Path(m["path"]) / "model.safetensors").stat().st_size
    assert load(m["path"])[-1] == 32
    first = WeightFiles.read(m["path"]).sha256
    # the pipeline deletes dest/weights after extraction: the HF cache must survive that
    shutil.rmtree(dest / "weights")
    assert (
        repo_cache_dir(hf_home, "EleutherAI/pythia-70m") / "snapshots" / commits["step1000"] / "model.safetensors"
    ).is_file()
    # and a re-fetch into the same dest works
    again = fetch(ckpt("pythia", "pythia-70m", 1000), dest)
    assert WeightFiles.read(again["path"]).sha256 == first


def test_fetch_keep_weights_points_into_the_cache(hub, tmp_path):
    hf_home, commits = hub
    m = fetch(ckpt("pythia", "pythia-70m", 0), tmp_path / "d", keep_weights=True)
    snap = repo_cache_dir(hf_home, "EleutherAI/pythia-70m") / "snapshots" / commits["step0"]
    assert Path(m["path"]).resolve() == snap.resolve() and m["commit"] == commits["step0"]
    assert not (tmp_path / "d" / "weights").exists()
    assert load(m["path"])[-1] == 32


def test_fetch_multiberts_bin_fallback_and_no_tf(hub, tmp_path, monkeypatch):
    hf_home, commits = hub
    calls = []
    real = fetch_mod.snapshot_download
    monkeypatch.setattr(fetch_mod, "snapshot_download", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    c = ckpt("multiberts", "seed_0", 20000)
    m = fetch(c, tmp_path / "d")
    assert m["commit"] == commits["main"] and m["revision"] == "main" and m["tokens_seen"] == 20000 * 131_072
    assert m["weight_files"] == ["pytorch_model.bin"]  # no safetensors in the repo -> .bin
    assert sorted(os.listdir(m["path"])) == ["config.json", "pytorch_model.bin", "tokenizer_config.json", "vocab.txt"]
    # the patterns handed to snapshot_download exclude the TF/flax files of the repo
    repo_files = ["config.json", "pytorch_model.bin", "tf_model.h5", "flax_model.msgpack", "vocab.txt", "README.md"]
    assert sorted(filter_repo_objects(repo_files, allow_patterns=calls[0]["allow_patterns"])) == [
        "config.json",
        "pytorch_model.bin",
        "vocab.txt",
    ]
    assert load(m["path"])[-1] == 32
    # keep_weights: the snapshot holds the tf file the test planted, but it is not among the loaded files,
    # and flax_model.msgpack (listed, never downloaded) was not requested: the offline snapshot_download
    # would have raised for a missing requested file.
    m2 = fetch(c, tmp_path / "d2", keep_weights=True)
    assert WeightFiles.read(m2["path"]).sha256 == WeightFiles.read(m["path"]).sha256
    assert "tf_model.h5" not in m2["weight_files"] and not (Path(m2["path"]) / "flax_model.msgpack").exists()


def test_requesting_an_uncached_file_offline_fails(hub, monkeypatch, tmp_path):
    """Guards the test above: the real snapshot_download does fail when asked for a file the cache lacks."""
    monkeypatch.setattr(fetch_mod, "select_files", lambda files: (sorted(set(files)), ["pytorch_model.bin"]))
    with pytest.raises(
        FetchError, match=r"google/multiberts-seed_0-step_20k at revision 'main' is not in the local HF cache"
    ):
        fetch(ckpt("multiberts", "seed_0", 20000), tmp_path / "d", backoff=0)


def test_missing_revision_fails_at_once(hub, tmp_path, monkeypatch):
    calls = []
    real = HfApi.resolve_revision
    monkeypatch.setattr(HfApi, "resolve_revision", lambda self, *a, **kw: calls.append(1) or real(self, *a, **kw))
    monkeypatch.setattr(fetch_mod.time, "sleep", lambda s: pytest.fail("a missing revision must not be retried"))
    with pytest.raises(
        RevisionNotFound, match=r"EleutherAI/pythia-70m at revision 'step2000' is not in the local HF cache"
    ) as e:
        fetch(ckpt("pythia", "pythia-70m", 2000), tmp_path / "d", backoff=1.0)
    assert (e.value.repo_id, e.value.revision) == ("EleutherAI/pythia-70m", "step2000")
    assert "HF_HUB_OFFLINE" in str(e.value) and len(calls) == 1
    with pytest.raises(RevisionNotFound, match="google/multiberts-seed_1-step_20k"):
        fetch(ckpt("multiberts", "seed_1", 20000), tmp_path / "d", backoff=1.0)
    assert not (tmp_path / "d" / "checkpoint.json").exists()


# ---------------------------------------------------------------------------------------------- retries


def flaky(monkeypatch, n_failures, exc_factory):
    real = fetch_mod.snapshot_download
    calls = {"n": 0}

    def download(*a, **kw):
        calls["n"] += 1
        if calls["n"] <= n_failures:
            raise exc_factory()
        return real(*a, **kw)

    monkeypatch.setattr(fetch_mod, "snapshot_download", download)
    return calls


def connect_error():
    return httpx2.ConnectError(
        "[Errno 111] Connection refused", request=httpx2.Request("GET", "https://huggingface.co")
    )


def http_error(status):
    req = httpx2.Request("GET", "https://huggingface.co/api/models/x")
    return HfHubHTTPError(f"{status} error", response=httpx2.Response(status, request=req))


@pytest.mark.parametrize("exc", [connect_error, lambda: http_error(503), lambda: httpx2.ReadTimeout("slow")])
def test_transient_errors_are_retried(hub, tmp_path, monkeypatch, exc):
    calls = flaky(monkeypatch, 3, exc)
    m = fetch(ckpt("pythia", "pythia-70m", 1000), tmp_path / "d", retries=5, backoff=0)
    assert calls["n"] == 4 and m["weight_files"] == ["model.safetensors"]


def test_backoff_is_exponential(hub, tmp_path, monkeypatch):
    sleeps = []
    monkeypatch.setattr(fetch_mod.time, "sleep", sleeps.append)
    flaky(monkeypatch, 3, connect_error)
    fetch(ckpt("pythia", "pythia-70m", 1000), tmp_path / "d", retries=5, backoff=1.5)
    assert sleeps == [1.5, 3.0, 6.0]


def test_always_failing_raises_fetch_error(hub, tmp_path, monkeypatch):
    calls = flaky(monkeypatch, 10**6, connect_error)
    with pytest.raises(FetchError) as e:
        fetch(ckpt("multiberts", "seed_0", 20000), tmp_path / "d", retries=3, backoff=0)
    msg = str(e.value)
    assert "google/multiberts-seed_0-step_20k" in msg and "'main'" in msg
    assert "after 4 attempts" in msg and "ConnectError" in msg and "Connection refused" in msg
    assert calls["n"] == 4 and not isinstance(e.value, RevisionNotFound)
    assert isinstance(e.value.__cause__, httpx2.ConnectError)


def test_client_errors_are_not_retried(hub, tmp_path, monkeypatch):
    calls = flaky(monkeypatch, 10**6, lambda: http_error(403))
    with pytest.raises(FetchError, match=r"downloading failed for EleutherAI/pythia-70m at revision 'step1000'"):
        fetch(ckpt("pythia", "pythia-70m", 1000), tmp_path / "d", retries=5, backoff=0)
    assert calls["n"] == 1


# ---------------------------------------------------------------------------------------------- online path (faked Hub)


class FakeHub:
    """Stands in for HfApi + snapshot_download when online: serves files of a folder, counts calls."""

    def __init__(self, files: dict[str, bytes], commit="c" * 40, missing=False):
        self.files, self.commit, self.missing, self.downloads = files, commit, missing, []

    def resolve_revision(self, repo_id, revision=None, cache_dir=None, local_files_only=False):
        if self.missing:
            req = httpx2.Request("GET", f"https://huggingface.co/api/models/{repo_id}/revision/{revision}")
            raise RevisionNotFoundError("404 Revision Not Found", response=httpx2.Response(404, request=req))
        return ResolvedRevision(resolved=self.commit, initial=revision, repo_id=repo_id)

    def list_repo_files(self, repo_id, revision=None):
        return list(self.files)

    def snapshot_download(self, repo_id, *, revision, allow_patterns, cache_dir=None, local_dir=None, tqdm_class=None):
        self.downloads.append({"revision": revision, "allow_patterns": allow_patterns, "local_dir": local_dir})
        assert local_dir is not None
        for name in filter_repo_objects(list(self.files), allow_patterns=allow_patterns):
            (Path(local_dir) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(local_dir) / name).write_bytes(self.files[name])
        return str(local_dir)


def test_online_download_goes_to_dest_weights(monkeypatch, tmp_path, models):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    files = {p.name: p.read_bytes() for p in models["bert"].iterdir()} | {"tf_model.h5": TF, "README.md": b"#"}
    hub = FakeHub(files)
    monkeypatch.setattr(fetch_mod, "_hub_api", lambda: hub)
    monkeypatch.setattr(fetch_mod, "snapshot_download", hub.snapshot_download)
    m = fetch(ckpt("multiberts", "seed_3", 300000), tmp_path / "d")
    (call,) = hub.downloads
    assert call["local_dir"] == tmp_path / "d" / "weights" and call["revision"].resolved == "c" * 40
    assert sorted(call["allow_patterns"]) == ["config.json", "pytorch_model.bin", "tokenizer_config.json", "vocab.txt"]
    assert m["commit"] == "c" * 40 and m["repo_id"] == "google/multiberts-seed_3-step_300k"
    assert not (tmp_path / "d" / "weights" / "tf_model.h5").exists()
    assert load(m["path"])[-1] == 32

    hub.missing = True
    with pytest.raises(RevisionNotFound, match=r"google/multiberts-seed_3-step_300k at revision 'main' does not exist"):
        fetch(ckpt("multiberts", "seed_3", 300000), tmp_path / "e", backoff=100)


# ---------------------------------------------------------------------------------------------- local / toy


def test_fetch_local_run_in_place(tmp_path, models):
    run = tmp_path / "run"
    ck = run / "checkpoint-10"
    shutil.copytree(models["pythia"], ck)
    for f in ("tokenizer.json", "tokenizer_config.json"):  # tokenizer saved once at the run level
        shutil.move(ck / f, run / f)
    (c,) = resolve({"family": "local", "name": "my-run", "path": run, "steps": "all", "tokens_per_step": 100})
    m = fetch(c, tmp_path / "results" / "local" / "my-run" / "step10")
    assert m["path"] == str(ck) and m["commit"] is None and m["repo_id"] is None
    assert m["tokenizer_path"] == str(run) and m["tokens_seen"] == 1000
    assert m["weight_files"] == ["model.safetensors"]  # safetensors preferred over pytorch_model.bin
    assert not (tmp_path / "results" / "local" / "my-run" / "step10" / "weights").exists()  # no copy
    from transformers import AutoModel, AutoTokenizer

    AutoModel.from_pretrained(m["path"])
    AutoTokenizer.from_pretrained(m["tokenizer_path"])


def test_fetch_toy_missing_folder_or_weights(tmp_path):
    specs = {"toy-bert": {"steps": [0, 8], "batch_size": 2, "seq_len": 8}}
    c0, c8 = resolve({"family": "toy", "name": "toy-bert", "steps": "all"}, toy_root=tmp_path, toy_specs=specs)
    with pytest.raises(FetchError, match=r"toy/toy-bert/step0: checkpoint folder .*step0 does not exist"):
        fetch(c0, tmp_path / "d")
    (tmp_path / "toy-bert" / "step8").mkdir(parents=True)
    (tmp_path / "toy-bert" / "step8" / "config.json").write_text("{}")
    with pytest.raises(FetchError, match=r"no \*\.safetensors or pytorch_model\*\.bin weights"):
        fetch(c8, tmp_path / "d")


# ------------------------------------------------------------------------------- selection, hashing, duplicates


def test_select_files():
    wanted, weights = select_files(
        [
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "pytorch_model.bin",
            "tf_model.h5",
            "flax_model.msgpack",
            "onnx/model.onnx",
            "tokenizer.json",
            "special_tokens_map.json",
            "README.md",
            ".gitattributes",
        ]
    )
    assert weights == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert wanted == sorted(
        weights + ["config.json", "model.safetensors.index.json", "tokenizer.json", "special_tokens_map.json"]
    )
    wanted, weights = select_files(
        [
            "config.json",
            "pytorch_model-00001-of-00002.bin",
            "pytorch_model-00002-of-00002.bin",
            "pytorch_model.bin.index.json",
            "tf_model.h5",
            "vocab.txt",
        ]
    )
    assert weights == ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
    assert "pytorch_model.bin.index.json" in wanted and "tf_model.h5" not in wanted
    with pytest.raises(ValueError, match="no \\*.safetensors or pytorch_model"):
        select_files(["config.json", "tf_model.h5"])


def test_duplicate_weights_across_revisions_are_flagged(hub, tmp_path):
    manifests = [
        fetch(ckpt("pythia", "pythia-70m", step), tmp_path / str(step), keep_weights=True) for step in (0, 1000, 143000)
    ]
    assert manifests[1]["commit"] != manifests[2]["commit"]
    manifests = [{**m, **WeightFiles.read(m["path"]).manifest()} for m in manifests]  # as extract.json holds them
    assert manifests[1]["weights_sha256"] == manifests[2]["weights_sha256"] != manifests[0]["weights_sha256"]
    dups = find_duplicates(manifests)
    assert [(d["step"], d["duplicate_of"]) for d in dups] == [(1000, [143000]), (143000, [1000])]
    assert {d["model"] for d in dups} == {"pythia-70m"} and dups[0]["revision"] == "step1000"
    # the same weights in another model are not a duplicate; manifests without a hash are ignored
    other = dict(manifests[1], model="pythia-70m-deduped", step=5000)
    assert len(find_duplicates([manifests[0], manifests[1], other, {"family": "x", "model": "y", "step": 1}])) == 0


# ---------------------------------------------------------------------------------------------- branch lookup


def test_olmo_branch_is_looked_up_by_step(monkeypatch, tmp_path, models):
    """OLMo branches carry a rounded token count: the catalogue's `step1000-tokens*B` finds `step1000-tokens4B`
    (and not `step10000-tokens41B`), the manifest records the real branch; a missing step names the nearest."""
    hf_home = offline_hub(monkeypatch, tmp_path / "hf")
    commits = build_hub_cache(
        hf_home,
        "allenai/OLMo-1B-hf",
        {"step1000-tokens4B": models["pythia"], "step10000-tokens41B": models["pythia_b"], "main": models["pythia_b"]},
    )
    manifest = fetch(ckpt("olmo", "OLMo-1B-hf", 1000), tmp_path / "d", keep_weights=True)
    assert manifest["revision"] == "step1000-tokens4B"
    assert manifest["commit"] == commits["step1000-tokens4B"]
    with pytest.raises(RevisionNotFound, match=r"no branch matching 'step2000-tokens\*B'.*nearest: step1000-tokens4B"):
        fetch(ckpt("olmo", "OLMo-1B-hf", 2000), tmp_path / "e", keep_weights=True)


def test_match_branch_rejects_two_matches():
    with pytest.raises(FetchError, match="several branches match"):
        fetch_mod.match_branch("org/m", "step5-tokens*B", ["step5-tokens1B", "step5-tokens2B"], offline=False)
    names = ["stage1-step0-tokens0B", "stage1-step10-tokens0B", "main"]
    assert fetch_mod.match_branch("org/m", "stage1-step0-tokens*B", names, offline=True) == "stage1-step0-tokens0B"
