"""The `hub` family (any Hugging Face repository), offline through the Hugging Face cache tests/hubcache.py lays out:
its default revision, checkpoints kept as branches or as folders, the resolved commit, and every mistake stopped
before a download with an error that names the fix (anisweep.checkpoints.hub_repo)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from anisweep.checkpoints.base import Checkpoint
from anisweep.checkpoints.catalogue import resolve, resolve_all
from anisweep.checkpoints.fetch import fetch
from anisweep.checkpoints.hub import Pythia
from anisweep.checkpoints.hub_repo import forget_listings
from anisweep.checkpoints.identity import source_identity
from anisweep.checkpoints.preflight import PreflightError
from anisweep.config import checkpoints, complete
from anisweep.errors import ConfigError

from hubcache import build_hub_cache, offline_hub, save_tiny_pythia

REPO = "me/tiny-run"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """Two tiny random GPT-NeoX models (saved once for the module)."""
    root = tmp_path_factory.mktemp("tiny")
    return {"a": save_tiny_pythia(root / "a", seed=0), "b": save_tiny_pythia(root / "b", seed=1)}


@pytest.fixture
def hub(monkeypatch, tmp_path):
    return offline_hub(monkeypatch, tmp_path / "hf")


def config_only(model_type="gpt_neox", **more) -> dict[str, bytes]:
    """A checkpoint's files when only its resolution or its config.json matters (the weights are never read)."""
    return {
        "config.json": json.dumps({"model_type": model_type, "architectures": ["X"], **more}).encode(),
        "model.safetensors": b"weights",
    }


def pushes(hub, tiny, steps=(0, 100, 200)) -> dict[str, str]:
    """A user's run pushed as branches step{N} (and main, the last push)."""
    revisions = {f"step{s}": tiny["a" if i % 2 == 0 else "b"] for i, s in enumerate(steps)}
    return build_hub_cache(hub, REPO, {**revisions, "main": revisions[f"step{steps[-1]}"]})


# ---------------------------------------------------------------------------------------------- resolving


def test_final_is_the_default_revision_at_its_commit(hub):
    commits = build_hub_cache(hub, "google/canine-c", {"main": config_only(), "other": config_only(vocab_size=3)})
    (ck,) = resolve({"family": "hub", "name": "google/canine-c", "steps": "final"})
    assert (ck.key, ck.repo_id, ck.revision, ck.commit) == (
        "hub/google--canine-c/step0",
        "google/canine-c",
        "main",
        commits["main"],
    )
    assert ck.tokens_seen is None and ck.subfolder is None and ck.trust_remote_code is False
    # its step named: filed under it, with tokens seen when tokens_per_step is given
    (ck,) = resolve({"family": "hub", "name": "google/canine-c", "steps": [500], "tokens_per_step": 4})
    assert (ck.step, ck.tokens_seen) == (500, 2000)
    (ck,) = resolve(
        {"family": "hub", "name": "canine", "repo": "google/canine-c", "revision": "other", "steps": "final"}
    )
    assert (ck.key, ck.commit) == ("hub/canine/step0", commits["other"])


def test_branches_by_pattern(hub, tiny):
    commits = pushes(hub, tiny)
    entry = {"family": "hub", "name": REPO, "revision": "step{step}", "steps": "all", "tokens_per_step": 1024}
    found = resolve(entry)
    assert [(c.step, c.revision, c.commit, c.tokens_seen) for c in found] == [
        (s, f"step{s}", commits[f"step{s}"], s * 1024) for s in (0, 100, 200)
    ]
    assert [c.step for c in resolve({**entry, "steps": "final"})] == [200]
    assert [c.step for c in resolve({**entry, "steps": {"start": 100, "stop": 200}})] == [100, 200]
    # LLM360 names its branches ckpt_{N}
    build_hub_cache(hub, "LLM360/Amber", {"ckpt_000": config_only(), "ckpt_358": config_only(), "main": config_only()})
    amber = resolve({"family": "hub", "name": "LLM360/Amber", "revision": "ckpt_{step}", "steps": "all"})
    assert [(c.step, c.revision) for c in amber] == [(0, "ckpt_000"), (358, "ckpt_358")]


def test_subfolders_by_pattern_named_by_their_files(hub, tiny):
    files = {f"checkpoint-{s}/{p.name}": p.read_bytes() for s, m in ((10, "a"), (20, "b")) for p in tiny[m].iterdir()}
    files = {k: v for k, v in files.items() if "tokenizer" not in k}  # the tokenizer once, at the top
    files |= {p.name: p.read_bytes() for p in tiny["a"].iterdir() if "tokenizer" in p.name}
    commits = build_hub_cache(hub, "me/trainer", {"main": files})
    entry = {"family": "hub", "name": "me/trainer", "subfolder": "checkpoint-{step}", "steps": "all"}
    found = resolve(entry)
    assert [(c.step, c.subfolder, c.revision, c.commit) for c in found] == [
        (10, "checkpoint-10", "main", commits["main"]),
        (20, "checkpoint-20", "main", commits["main"]),
    ]
    assert found[0].files_id != found[1].files_id
    # a new commit that adds a folder leaves the others' identity alone
    more = {
        **files,
        **{f"checkpoint-30/{k.split('/', 1)[1]}": v for k, v in files.items() if k.startswith("checkpoint-20/")},
    }
    build_hub_cache(hub, "me/trainer", {"main": more})
    forget_listings()
    again = resolve(entry)
    assert [c.step for c in again] == [10, 20, 30] and again[0].commit != found[0].commit
    assert source_identity(again[0]) == source_identity(found[0])


def test_a_branch_pushed_again_changes_that_checkpoint_only(hub, tiny):
    pushes(hub, tiny)
    entry = {"family": "hub", "name": REPO, "revision": "step{step}", "steps": "all"}
    before = {c.step: source_identity(c) for c in resolve(entry)}
    build_hub_cache(hub, REPO, {"step100": tiny["a"]})  # step100 pushed again, other weights
    forget_listings()
    after = {c.step: source_identity(c) for c in resolve(entry)}
    assert after[0] == before[0] and after[200] == before[200]
    assert after[100] != before[100] and after[100]["commit"] != before[100]["commit"]


def test_other_families_keep_their_identity():
    """The hub-only fields stay out of every other family's checkpoint (extract's recorded params unchanged)."""
    ck = Pythia.checkpoint("pythia-70m", 1000)
    assert set(ck.to_dict()) == {
        "family",
        "model",
        "step",
        "tokens_seen",
        "seed",
        "repo_id",
        "revision",
        "path",
        "tokenizer",
    }
    assert Checkpoint.from_dict(ck.to_dict()) == ck


def test_the_config_takes_hub_entries(hub, tiny):
    pushes(hub, tiny)
    config = complete(
        {
            "models": [
                {"family": "hub", "name": REPO, "revision": "step{step}", "steps": [0, 200], "trust_remote_code": True}
            ]
        }
    )
    found = checkpoints(config)
    assert [c.key for c in found] == ["hub/me--tiny-run/step0", "hub/me--tiny-run/step200"]
    assert all(c.trust_remote_code for c in found) and found[0].to_dict()["trust_remote_code"] is True
    with pytest.raises(ConfigError, match="trust_remote_code"):
        complete({"models": [{"family": "hub", "name": REPO, "steps": "final", "trust_remote_code": "yes"}]})
    with pytest.raises(ConfigError, match="revision.*not used for family pythia"):
        resolve({"family": "pythia", "name": "pythia-70m", "steps": "final", "revision": "main"})


# ---------------------------------------------------------------------------------------------- mistakes


def test_a_repo_not_in_the_cache_offline(hub):
    with pytest.raises(
        ConfigError, match=r"me/nothing: not in the local Hugging Face cache .* HF_HUB_OFFLINE is set; download"
    ):
        resolve({"family": "hub", "name": "me/nothing", "steps": "final"})


def test_a_pattern_that_matches_nothing_names_what_exists(hub, tiny):
    pushes(hub, tiny)
    with pytest.raises(
        ConfigError, match=r"no branch or tag matches revision 'ckpt_\{step\}' .*it has: main, step0, step100, step200"
    ):
        resolve({"family": "hub", "name": REPO, "revision": "ckpt_{step}", "steps": "all"})
    with pytest.raises(ConfigError, match=r"step 150 is not in the steps of me/tiny-run .*nearest: 100, 200"):
        resolve({"family": "hub", "name": REPO, "revision": "step{step}", "steps": [150]})
    with pytest.raises(
        ConfigError,
        match=r"no folder with a config.json matches subfolder 'checkpoint-\{step\}'.*it has: config.json, gen",
    ):
        resolve({"family": "hub", "name": REPO, "subfolder": "checkpoint-{step}", "steps": "all"})
    with pytest.raises(ConfigError, match=r"no branch or tag 'dev' .*nearest"):
        resolve({"family": "hub", "name": REPO, "revision": "dev", "steps": "final"})


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"name": "canine-c"}, "must be a repo id, org/name"),
        ({"name": "c", "repo": "no-slash"}, "is not a repo id"),
        ({"name": REPO, "revision": "step{step}", "subfolder": "ck-{step}"}, "not in both"),
        ({"name": REPO, "revision": "step{n}"}, r"placeholder other than \{step\}"),
        ({"name": REPO, "steps": [1, 2]}, "one checkpoint, the revision 'main'"),
    ],
)
def test_entries_that_cannot_be(hub, tiny, entry, message):
    pushes(hub, tiny)
    with pytest.raises(ConfigError, match=message):
        resolve({"family": "hub", "steps": "all", **entry})


# ---------------------------------------------------------------------------------------------- fetch


def test_fetch_pins_the_resolved_commit_and_records_it(hub, tiny, tmp_path):
    commits = pushes(hub, tiny)
    (ck,) = resolve({"family": "hub", "name": REPO, "revision": "step{step}", "steps": [100]})
    build_hub_cache(hub, REPO, {"step100": tiny["a"]})  # pushed again after the config was read
    manifest = fetch(ck, tmp_path / "w")
    assert (manifest["revision"], manifest["commit"]) == ("step100", commits["step100"])
    assert manifest["trust_remote_code"] is False and manifest["subfolder"] is None
    assert (Path(manifest["path"]) / "model.safetensors").resolve().read_bytes() == (
        tiny["b"] / "model.safetensors"
    ).read_bytes()


def test_fetch_a_subfolder_with_the_tokenizer_at_the_top(hub, tiny, tmp_path):
    files = {f"checkpoint-10/{p.name}": p.read_bytes() for p in tiny["b"].iterdir() if "tokenizer" not in p.name}
    files |= {p.name: p.read_bytes() for p in tiny["a"].iterdir() if "tokenizer" in p.name}
    files["checkpoint-10/optimizer.pt"] = b"never fetched"
    build_hub_cache(hub, "me/trainer", {"main": files})
    (ck,) = resolve({"family": "hub", "name": "me/trainer", "subfolder": "checkpoint-{step}", "steps": "all"})
    seen = []
    manifest = fetch(ck, tmp_path / "w", before_weights=lambda folder, tok: seen.append((folder, tok)))
    folder = Path(manifest["path"])
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert manifest["tokenizer_path"] == str(folder) and manifest["subfolder"] == "checkpoint-10"
    ((small, tokenizer),) = seen
    assert small.name == "checkpoint-10" and (small / "config.json").is_file() and tokenizer is not None


def _no_weights(hub, repo, config):
    """A repo whose weights are listed but not in the cache: a fetch that reached them would fail otherwise."""
    build_hub_cache(
        hub, repo, {"main": {"config.json": json.dumps(config).encode()}}, remote_only={"model.safetensors": b"w"}
    )


def test_remote_code_needed_but_not_allowed_stops_before_the_weights(hub, tmp_path):
    config = {
        "model_type": "character_bert",
        "architectures": ["CharacterBertModel"],
        "auto_map": {"AutoModel": "modeling_character_bert.CharacterBertModel"},
    }
    _no_weights(hub, "helboukkouri/character-bert", config)
    (ck,) = resolve({"family": "hub", "name": "helboukkouri/character-bert", "steps": "final"})
    with pytest.raises(
        PreflightError, match=r"needs the repository's own code .*modeling_character_bert.*set trust_remote_code: true"
    ):
        fetch(ck, tmp_path / "w")
    assert not (tmp_path / "w" / "weights").exists()
    # allowed: the next check, an adapter for it, names the supported architectures
    (ck,) = resolve(
        {"family": "hub", "name": "helboukkouri/character-bert", "steps": "final", "trust_remote_code": True}
    )
    with pytest.raises(
        PreflightError, match=r"no adapter knows the architecture 'CharacterBertModel'.*supported: .*GPTNeoXForCausalLM"
    ):
        fetch(ck, tmp_path / "w")


def test_an_architecture_without_an_adapter_stops_before_the_weights(hub, tmp_path):
    _no_weights(hub, "state-spaces/mamba-130m-hf", {"model_type": "mamba", "architectures": ["MambaForCausalLM"]})
    (ck,) = resolve({"family": "hub", "name": "state-spaces/mamba-130m-hf", "steps": "final"})
    with pytest.raises(PreflightError, match=r"MambaForCausalLM.*supported: .*BertForMaskedLM"):
        fetch(ck, tmp_path / "w")


def test_two_entries_of_one_model_with_other_revisions_are_named(hub, tiny):
    pushes(hub, tiny)
    with pytest.raises(
        ConfigError, match=r"listed twice with different sources: me/tiny-run@step0 and me/tiny-run@main"
    ):
        resolve_all(
            [
                {"family": "hub", "name": REPO, "revision": "step{step}", "steps": [0]},
                {"family": "hub", "name": REPO, "steps": "final"},
            ]
        )


def test_cache_layout_offline_without_tree_listings(hub, tiny):
    """A cache whose tree listings are gone (an older huggingface_hub) is read from its snapshot folders."""
    files = {f"checkpoint-5/{p.name}": p.read_bytes() for p in tiny["a"].iterdir()}
    build_hub_cache(hub, "me/old", {"main": files}, write_tree=False)
    shutil.rmtree(hub / "hub" / "models--me--old" / "trees", ignore_errors=True)
    (ck,) = resolve({"family": "hub", "name": "me/old", "subfolder": "checkpoint-{step}", "steps": "all"})
    assert ck.step == 5 and ck.files_id


# ---------------------------------------------------------------------------------------------- online


@pytest.fixture
def online(monkeypatch, tmp_path):
    """The Hub's answers, without a network: HfApi's listings replaced by fixed ones."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.hf_api import GitRefInfo, GitRefs, RepoFile

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)  # a Snakemake working directory: the listings read online are recorded in it
    (tmp_path / ".snakemake").mkdir()
    calls = []

    def list_repo_refs(self, repo_id, **_):
        calls.append(("refs", repo_id))
        if repo_id == "me/none":
            from types import SimpleNamespace

            from huggingface_hub.errors import RepositoryNotFoundError

            raise RepositoryNotFoundError("404 Client Error", response=SimpleNamespace(headers={}, request=None))
        if repo_id != "LLM360/Amber":
            raise ConnectionError("no route to host")
        branch = lambda name, commit: GitRefInfo(name=name, ref=f"refs/heads/{name}", target_commit=commit)  # noqa: E731
        return GitRefs(
            branches=[branch("main", "c" * 40), branch("ckpt_000", "a" * 40), branch("ckpt_100", "b" * 40)],
            converts=[],
            tags=[],
        )

    def list_repo_tree(self, repo_id, revision=None, recursive=False, **_):
        calls.append(("tree", repo_id, revision))
        lfs = {"size": 1, "oid": "f" * 64, "pointerSize": 100}
        yield RepoFile(path="checkpoint-7/config.json", size=2, oid="1" * 40)
        yield RepoFile(path="checkpoint-7/model.safetensors", size=1, oid="2" * 40, lfs=lfs)

    monkeypatch.setattr(HfApi, "list_repo_refs", list_repo_refs)
    monkeypatch.setattr(HfApi, "list_repo_tree", list_repo_tree)
    forget_listings()
    yield calls
    forget_listings()


def test_online_the_hubs_branches_and_tree_are_read(online):
    found = resolve(
        {"family": "hub", "name": "amber", "repo": "LLM360/Amber", "revision": "ckpt_{step}", "steps": "all"}
    )
    assert [(c.step, c.revision, c.commit) for c in found] == [(0, "ckpt_000", "a" * 40), (100, "ckpt_100", "b" * 40)]
    (ck,) = resolve({"family": "hub", "name": "LLM360/Amber", "subfolder": "checkpoint-{step}", "steps": "all"})
    assert (ck.step, ck.subfolder, ck.commit) == (7, "checkpoint-7", "c" * 40)
    assert online == [("refs", "LLM360/Amber"), ("tree", "LLM360/Amber", "c" * 40)]  # one listing per repo


def test_online_an_unreachable_hub_or_a_missing_repo_names_the_fix(online):
    with pytest.raises(ConfigError, match=r"me/run: cannot list it on the Hub \(ConnectionError.*set HF_HUB_OFFLINE=1"):
        resolve({"family": "hub", "name": "me/run", "steps": "final"})
    with pytest.raises(ConfigError, match=r"me/none: no such repository on the Hub \(or it is private: log in"):
        resolve({"family": "hub", "name": "me/none", "steps": "final"})


def test_a_node_without_network_reads_the_listing_recorded_online(online, monkeypatch):
    """A cluster job re-reads the config on a node that may have no network: the listing the submit host read is
    in the working directory's .snakemake/."""
    from huggingface_hub import HfApi

    entry = {"family": "hub", "name": "LLM360/Amber", "revision": "ckpt_{step}", "steps": "all"}
    before = resolve(entry)
    forget_listings()

    def unreachable(self, *args, **kwargs):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(HfApi, "list_repo_refs", unreachable)
    with pytest.warns(UserWarning, match="cannot be reached .*recorded when the config was last read online"):
        assert resolve(entry) == before


def test_a_star_stands_for_the_rest_of_a_branch_name(hub):
    revisions = {name: config_only() for name in ("step1000-tokens4B", "step20000-tokens84B", "main")}
    commits = build_hub_cache(hub, "allenai/OLMo-1B-hf", revisions)
    found = resolve({"family": "hub", "name": "allenai/OLMo-1B-hf", "revision": "step{step}-tokens*B", "steps": "all"})
    assert [(c.step, c.revision, c.commit) for c in found] == [
        (1000, "step1000-tokens4B", commits["step1000-tokens4B"]),
        (20000, "step20000-tokens84B", commits["step20000-tokens84B"]),
    ]


def test_a_commit_hash_as_the_revision(hub):
    commits = build_hub_cache(hub, "google/canine-c", {"main": config_only()})
    (ck,) = resolve({"family": "hub", "name": "google/canine-c", "revision": commits["main"], "steps": "final"})
    assert (ck.revision, ck.commit) == (commits["main"], commits["main"])
    with pytest.raises(ConfigError, match=r"commit 0{40} is not in the local cache"):
        resolve({"family": "hub", "name": "google/canine-c", "revision": "0" * 40, "steps": "final"})


def test_trust_remote_code_reaches_the_model_load_and_extract_json(hub, tiny, tmp_path, monkeypatch):
    """The entry's trust_remote_code travels with the fetch manifest to extract's load (AutoConfig and
    from_pretrained) and into extract.json; without it, it is never passed as true."""
    import transformers

    from anisweep.extract.model import ExtractSettings
    from anisweep.extract.run import extract_checkpoint

    pushes(hub, tiny)
    seen = []
    original = transformers.AutoConfig.from_pretrained

    def recording(*args, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        return original(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", recording)
    texts = ["the cat sat on the mat and the dog sat on the log"] * 40
    settings = ExtractSettings(n_sequences=2, seq_len=16, batch_size=2, sample_tokens=32, device="cpu")
    for trust in (False, True):
        entry = {"family": "hub", "name": REPO, "revision": "step{step}", "steps": [0], "trust_remote_code": trust}
        (ck,) = resolve(entry)
        manifest = fetch(ck, tmp_path / f"w{trust}")
        info = extract_checkpoint(manifest, texts, settings, tmp_path / f"out{trust}", progress=False)
        assert seen[-1] is trust and info["checkpoint"]["trust_remote_code"] is trust
        assert json.loads((tmp_path / f"out{trust}" / "extract.json").read_text())["checkpoint"]["commit"] == ck.commit
