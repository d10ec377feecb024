"""The `hub` family: any Hugging Face model repository, swept at its default revision or at the checkpoints it keeps.

::

    {family: hub, name: google/canine-c, steps: final}                        # the default revision (main)
    {family: hub, name: me/my-run, revision: "step{step}", steps: all}        # branches step1000, step2000, ...
    {family: hub, name: LLM360/Amber, revision: "ckpt_{step}", steps: [0, 100]}
    {family: hub, name: me/trainer-run, subfolder: "checkpoint-{step}", steps: all}   # folders in one revision

``{step}`` (an integer optimizer step) stands in ``revision`` (a branch or tag per checkpoint) or in ``subfolder``
(a folder per checkpoint inside one revision), never in both; ``*`` there stands for any other characters of the
name (OLMo's ``step{step}-tokens*B``). Without it the entry is one checkpoint: the revision
(default: the repo's default branch, ``main``), filed as step 0 with ``tokens_seen`` null unless ``steps`` names
its step (``steps: [143000]``). With it, ``steps: all`` is every step that exists and ``final`` the largest.

Which steps exist, and the commit each revision points to, is read when the config is read: online one request per
entry (``HfApi.list_repo_refs``; a subfolder sweep also ``list_repo_tree``), offline (``HF_HUB_OFFLINE=1``) what the
local cache holds (its ``refs/`` and cached tree listings, or its snapshot folders): offline, ``all`` means every
step in the cache. Where the Hub cannot be reached, the listing last read online in the Snakemake working directory
(.snakemake/anisweep/hub/) is used, with a warning: a cluster job reads the config again on a node that may have no
network. The commit is part of the checkpoint (fetch is pinned to it, extract.json records it, extract's
recorded params hold it): a branch pushed again with a new commit reruns that checkpoint, an unchanged one nothing.
A subfolder checkpoint is named by its files' blob ids instead, so that a commit adding another checkpoint folder
reruns none of the others.

Every mistake is a ConfigError before any download, naming the fix: a repo not in the cache offline, a repo the Hub
does not have, a pattern that matches no branch or folder (naming those that exist), a step that is not there.
The architecture (an adapter for it) and remote code (``trust_remote_code``) are checked at fetch on config.json,
before any weight moves (:func:`check_hub_config`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from anisweep.checkpoints.base import Checkpoint, as_int, check_name, listing, nearest_names, select_steps
from anisweep.checkpoints.preflight import ModelShape, PreflightError, shape_of
from anisweep.errors import ConfigError

STEP = "{step}"
DEFAULT_REVISION = "main"
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_FIX_OFFLINE = (
    "download it while online first (unset HF_HUB_OFFLINE; the workflow's fetch does it, or "
    "`hf download {repo} --revision REVISION`), or point HF_HOME at the cache that holds it"
)


def _offline() -> bool:
    from huggingface_hub import constants

    return constants.is_offline_mode()


def cache_root() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


def repo_folder(repo: str) -> Path:
    return cache_root() / ("models--" + repo.replace("/", "--"))


def where_listed(offline: bool) -> str:
    return "in the local cache (HF_HUB_OFFLINE is set)" if offline else "on the Hub"


# ---------------------------------------------------------------------------------------------- listing


_LISTED: dict[tuple, Any] = {}  # one listing per repo (and revision) per process: the config is read several times


def forget_listings() -> None:
    """Read the Hub (or the cache) again at the next resolution: what was pushed since is seen."""
    _LISTED.clear()


def repo_refs(repo: str) -> dict[str, str]:
    """{branch or tag name: commit} of `repo`: online the Hub's (list_repo_refs), offline the cache's `refs/`.
    A ConfigError names the fix when the repo is not there."""
    offline = _offline()
    key = ("refs", repo, offline, str(cache_root()))
    if key not in _LISTED:
        _LISTED[key] = _cached_refs(repo) if offline else _hub_refs(repo)
    return _LISTED[key]


def _cached_refs(repo: str) -> dict[str, str]:
    refs = repo_folder(repo) / "refs"
    found = (
        {p.relative_to(refs).as_posix(): p.read_text().strip() for p in sorted(refs.rglob("*")) if p.is_file()}
        if refs.is_dir()
        else {}
    )
    if not found:
        raise ConfigError(
            f"hub model {repo}: not in the local Hugging Face cache {cache_root()} and HF_HUB_OFFLINE is set; "
            + _FIX_OFFLINE.format(repo=repo)
        )
    return found


def _hub_error(repo: str, error: Exception) -> ConfigError:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if isinstance(error, GatedRepoError):
        return ConfigError(
            f"hub model {repo}: the repository is gated; accept its terms on huggingface.co and log in "
            "(`hf auth login`), or set HF_TOKEN"
        )
    if isinstance(error, RepositoryNotFoundError):
        return ConfigError(
            f"hub model {repo}: no such repository on the Hub (or it is private: log in with `hf auth login`); "
            "check the repo id (org/name, as in its huggingface.co address)"
        )
    return ConfigError(
        f"hub model {repo}: cannot list it on the Hub ({type(error).__name__}: {str(error).strip()[:200]}); "
        "check the network, or set HF_HUB_OFFLINE=1 to use what the local cache holds"
    )


def _unreachable(error: Exception) -> bool:
    """The Hub did not answer (no network, a timeout, a server error), as opposed to answering no."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(error, HfHubHTTPError):
        status = getattr(getattr(error, "response", None), "status_code", None)
        return status is None or status >= 500
    return isinstance(error, (OSError, TimeoutError)) or type(error).__module__.startswith(("httpx", "requests"))


#: Where the workflow keeps the last listing it read online, in its working directory: a cluster job re-reads the
#: config on a node that may have no network, and then reads the listing the submit host recorded here.
RECORDED = Path(".snakemake") / "anisweep" / "hub"


def _recorded(kind: str, repo: str, listing: dict[str, str] | None = None, commit: str = "") -> dict[str, str] | None:
    """Record `listing` (when Snakemake reads the config, or in its working directory: in .snakemake/), or read the
    recorded one."""
    path = RECORDED / f"{kind}-{repo.replace('/', '--')}{'-' + commit if commit else ''}.json"
    if listing is not None:
        if RECORDED.parent.parent.is_dir() or "snakemake" in sys.modules:
            try:
                RECORDED.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(listing, sort_keys=True))
                tmp.replace(path)
            except OSError:
                pass  # best effort: the listing is only a fallback
        return listing
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _listed_online(kind: str, repo: str, call, commit: str = "") -> dict[str, str]:
    """`call()`'s listing, recorded; where the Hub cannot be reached, the one recorded last (with a warning)."""
    try:
        return _recorded(kind, repo, call(), commit)
    except Exception as error:  # every failure becomes a ConfigError naming the repo and the fix
        recorded = _recorded(kind, repo, commit=commit) if _unreachable(error) else None
        if recorded is None:
            raise _hub_error(repo, error) from None
        import warnings

        warnings.warn(
            f"hub model {repo}: the Hub cannot be reached ({type(error).__name__}); using the listing recorded when "
            f"the config was last read online ({RECORDED})",
            stacklevel=2,
        )
        return recorded


def _hub_refs(repo: str) -> dict[str, str]:
    from huggingface_hub import HfApi

    def call() -> dict[str, str]:
        refs = HfApi().list_repo_refs(repo)
        return {ref.name: ref.target_commit for ref in [*refs.branches, *refs.tags]}

    return _listed_online("refs", repo, call)


def repo_tree(repo: str, commit: str) -> dict[str, str]:
    """{file path: blob id (the sha256 of an LFS file, else its git blob id)} of `repo` at `commit`: online the
    Hub's listing; offline the cached tree listing, else the files of the cached snapshot."""
    offline = _offline()
    key = ("tree", repo, commit, offline, str(cache_root()))
    if key not in _LISTED:
        _LISTED[key] = _cached_tree(repo, commit) if offline else _hub_tree(repo, commit)
    return _LISTED[key]


def _blob(entry: Any) -> str:
    lfs = getattr(entry, "lfs", None)
    sha = lfs.get("sha256") if isinstance(lfs, Mapping) else getattr(lfs, "sha256", None)
    return sha or getattr(entry, "blob_id", None) or ""


def _cached_tree(repo: str, commit: str) -> dict[str, str]:
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    try:
        return {f.path: _blob(f) for f in get_cached_repo_tree(repo, revision=commit, cache_dir=cache_root())}
    except CachedRepoTreeNotFoundError:
        pass
    snapshot = repo_folder(repo) / "snapshots" / commit
    if not snapshot.is_dir():
        raise ConfigError(
            f"hub model {repo}: commit {commit} is not in the local cache (HF_HUB_OFFLINE is set); "
            + _FIX_OFFLINE.format(repo=repo)
        )
    # a cached file links to blobs/{etag}: the sha256 of an LFS file, the git blob id of the others
    return {
        p.relative_to(snapshot).as_posix(): Path(os.path.realpath(p)).name
        for p in sorted(snapshot.rglob("*"))
        if p.is_file()
    }


def _hub_tree(repo: str, commit: str) -> dict[str, str]:
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    def call() -> dict[str, str]:
        entries = HfApi().list_repo_tree(repo, revision=commit, recursive=True)
        return {e.path: _blob(e) for e in entries if isinstance(e, RepoFile)}

    return _listed_online("tree", repo, call, commit)


# ---------------------------------------------------------------------------------------------- the family


def pattern_regex(pattern: str) -> re.Pattern:
    """`{step}` the integer step, `*` any other characters of one name (no `/`): OLMo's `step{step}-tokens*B`."""
    return re.compile(re.escape(pattern).replace(re.escape(STEP), r"(\d+)").replace(r"\*", r"[^/]*?"))


class HubRepo:
    """Any Hugging Face model repository (module docstring): ``name`` is its repo id (the results folder is the id
    with ``/`` as ``--``), or a plain name with the id in ``repo``."""

    family = "hub"
    tokens_per_step = None  # the entry's, else unknown (tokens_seen null)
    entry_keys = (
        "family",
        "name",
        "steps",
        "repo",
        "revision",
        "subfolder",
        "tokens_per_step",
        "seed",
        "trust_remote_code",
    )
    checks_before_fetch = True  # config.json and the tokenizer against the extract settings (preflight)

    @classmethod
    def repo_and_model(cls, entry: Mapping[str, Any]) -> tuple[str, str]:
        name = str(entry["name"])
        repo = entry.get("repo")
        if repo is None:
            if not _REPO_ID.fullmatch(name):
                raise ConfigError(
                    f"hub model {name!r}: name must be a repo id, org/name (e.g. google/canine-c), or give the id "
                    "in `repo:` and a plain name in `name:`"
                )
            return name, name.replace("/", "--")
        if not isinstance(repo, str) or not _REPO_ID.fullmatch(repo):
            raise ConfigError(f"hub model {name!r}: repo {repo!r} is not a repo id, org/name (e.g. google/canine-c)")
        return repo, check_name(name, cls.family)

    @classmethod
    def resolve_entry(cls, entry: Mapping[str, Any], **_: Any) -> list[Checkpoint]:
        repo, model = cls.repo_and_model(entry)
        revision, subfolder = entry.get("revision"), entry.get("subfolder")
        for key, value in (("revision", revision), ("subfolder", subfolder)):
            if value is not None and (not isinstance(value, str) or not value.strip("/")):
                raise ConfigError(f"hub model {repo}: {key} must be a non-empty string, got {value!r}")
            if isinstance(value, str) and any(brace in value.replace(STEP, "") for brace in "{}"):
                raise ConfigError(
                    f"hub model {repo}: {key} {value!r} has a placeholder other than {STEP}; {STEP} (the integer "
                    f'optimizer step) is the only one, e.g. revision: "step{STEP}" or subfolder: "checkpoint-{STEP}"'
                )
        subfolder = subfolder.strip("/") if subfolder else None
        patterned = [k for k, v in (("revision", revision), ("subfolder", subfolder)) if v and STEP in v]
        if len(patterned) > 1 or any(v.count(STEP) > 1 for v in (revision, subfolder) if v):
            raise ConfigError(
                f"hub model {repo}: {STEP} may stand once, in revision (a branch per checkpoint) or in subfolder (a "
                "folder per checkpoint), not in both"
            )
        tokens_per_step = entry.get("tokens_per_step")
        tokens_per_step = None if tokens_per_step is None else as_int(tokens_per_step, "tokens_per_step")
        seed = entry.get("seed")
        seed = None if seed is None else as_int(seed, "seed")
        trust = entry.get("trust_remote_code", False)
        if not isinstance(trust, bool):
            raise ConfigError(f"hub model {repo}: trust_remote_code must be true or false, got {trust!r}")
        common = dict(family=cls.family, model=model, seed=seed, repo_id=repo, trust_remote_code=trust)

        def tokens(step: int) -> int | None:
            return None if tokens_per_step is None else step * tokens_per_step

        steps = entry.get("steps")
        if patterned == ["revision"]:
            found = cls.revision_steps(repo, revision)
            chosen = select_steps(steps, list(found), f"the steps of {repo} ({revision!r} {where_listed(_offline())})")
            return [
                Checkpoint(
                    **common,
                    step=s,
                    tokens_seen=tokens(s),
                    revision=found[s][0],
                    commit=found[s][1],
                    subfolder=subfolder,
                )
                for s in chosen
            ]
        revision = revision or DEFAULT_REVISION
        commit = cls.commit_of(repo, revision)
        if patterned == ["subfolder"]:
            found_folders = cls.subfolder_steps(repo, revision, commit, subfolder)
            chosen = select_steps(
                steps,
                list(found_folders),
                f"the steps of {repo} ({subfolder!r} at {revision} {where_listed(_offline())})",
            )
            return [
                Checkpoint(
                    **common,
                    step=s,
                    tokens_seen=tokens(s),
                    revision=revision,
                    commit=commit,
                    subfolder=found_folders[s][0],
                    files_id=found_folders[s][1],
                )
                for s in chosen
            ]
        step, known = cls.single_step(repo, revision, steps)
        return [
            Checkpoint(
                **common,
                step=step,
                tokens_seen=tokens(step) if known else None,
                revision=revision,
                commit=commit,
                subfolder=subfolder,
            )
        ]

    @classmethod
    def single_step(cls, repo: str, revision: str, steps: Any) -> tuple[int, bool]:
        """The step a pattern-free entry's one checkpoint is filed under, and whether the entry said it."""
        if isinstance(steps, str) and steps.strip().lower() in ("final", "last", "all"):
            return 0, False
        if isinstance(steps, list) and len(steps) == 1:
            steps = steps[0]
        if isinstance(steps, (int, str)) and not isinstance(steps, bool):
            return as_int(steps, "steps"), True
        raise ConfigError(
            f"hub model {repo}: without {STEP} in revision or subfolder the entry is one checkpoint, the revision "
            f"{revision!r}: steps is `final` (filed as step 0, tokens_seen unknown) or its one optimizer step (e.g. "
            f'steps: [143000]), not {steps!r}; to sweep checkpoints, give revision: "step{STEP}" (a branch each) or '
            f'subfolder: "checkpoint-{STEP}" (a folder each)'
        )

    @classmethod
    def commit_of(cls, repo: str, revision: str) -> str:
        if _COMMIT.fullmatch(revision):
            if _offline() and not (repo_folder(repo) / "snapshots" / revision).is_dir():
                raise ConfigError(
                    f"hub model {repo}: commit {revision} is not in the local cache (HF_HUB_OFFLINE is set); "
                    + _FIX_OFFLINE.format(repo=repo)
                )
            return revision
        refs = repo_refs(repo)
        if revision not in refs:
            near = nearest_names(revision, refs, 3)
            offline = _offline()
            raise ConfigError(
                f"hub model {repo}: no branch or tag {revision!r} {where_listed(offline)}; nearest: {listing(near)}"
                + ("; " + _FIX_OFFLINE.format(repo=repo) if offline else "")
            )
        return refs[revision]

    @classmethod
    def revision_steps(cls, repo: str, pattern: str) -> dict[int, tuple[str, str]]:
        """{step: (branch, commit)} of the branches and tags matching `pattern`."""
        regex = pattern_regex(pattern)
        refs = repo_refs(repo)
        found: dict[int, tuple[str, str]] = {}
        for name, commit in sorted(refs.items()):
            m = regex.fullmatch(name)
            if m is None:
                continue
            step = int(m[1])
            if step in found:
                raise ConfigError(
                    f"hub model {repo}: branches {found[step][0]!r} and {name!r} both match {pattern!r} as step {step}"
                )
            found[step] = (name, commit)
        if not found:
            offline = _offline()
            raise ConfigError(
                f"hub model {repo}: no branch or tag matches revision {pattern!r} {where_listed(offline)}; "
                f"it has: {listing(_shown(refs))}. Write the pattern of its checkpoint branches with {STEP} for the "
                'step (e.g. "step{step}", LLM360\'s "ckpt_{step}")'
                + ("; offline, only the branches the cache holds are seen" if offline else "")
            )
        return dict(sorted(found.items()))

    @classmethod
    def subfolder_steps(cls, repo: str, revision: str, commit: str, pattern: str) -> dict[int, tuple[str, str]]:
        """{step: (folder, digest of its files' blob ids)} of the folders matching `pattern` that hold a
        config.json, in `repo` at `commit`."""
        tree = repo_tree(repo, commit)
        regex = pattern_regex(pattern)
        folders: dict[str, dict[str, str]] = {}
        for path, blob in tree.items():
            head, _, name = path.rpartition("/")
            if head and regex.fullmatch(head):
                folders.setdefault(head, {})[name] = blob
        found: dict[int, tuple[str, str]] = {}
        for folder, files in sorted(folders.items()):
            if "config.json" not in files:
                continue
            step = int(regex.fullmatch(folder)[1])
            if step in found:
                raise ConfigError(
                    f"hub model {repo}: folders {found[step][0]!r} and {folder!r} both match {pattern!r} as step {step}"
                )
            digest = hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()
            found[step] = (folder, digest)
        if not found:
            tops = sorted({p.split("/", 1)[0] + ("/" if "/" in p else "") for p in tree})
            offline = _offline()
            raise ConfigError(
                f"hub model {repo}: no folder with a config.json matches subfolder {pattern!r} at {revision} "
                f"{where_listed(offline)}; it has: {listing(_shown(tops))}. Write the pattern of its checkpoint "
                f'folders with {STEP} for the step (e.g. "checkpoint-{STEP}")'
                + ("; offline, only the files the cache holds are seen" if offline else "")
            )
        return dict(sorted(found.items()))

    @classmethod
    def trusted_step(cls, steps: Sequence[int]) -> int:
        return max(steps)

    @classmethod
    def cached_config(cls, ckpt: Checkpoint) -> dict | None:
        """The checkpoint's config.json when the cache holds it (no download when the config is read)."""
        from huggingface_hub import try_to_load_from_cache

        name = f"{ckpt.subfolder}/config.json" if ckpt.subfolder else "config.json"
        try:
            path = try_to_load_from_cache(ckpt.repo_id, name, revision=ckpt.commit or ckpt.revision)
            hf = json.loads(Path(path).read_text()) if isinstance(path, str) else None
        except (OSError, ValueError):
            return None
        return hf if isinstance(hf, dict) else None

    @classmethod
    def params_millions(cls, ckpt: Checkpoint) -> float:
        """From the cached config.json (embeddings + 12 d^2 per layer); 1B when it is not cached yet."""
        hf = cls.cached_config(ckpt) or {}
        shape = shape_of(hf)
        vocab = hf.get("vocab_size") if isinstance(hf.get("vocab_size"), int) else 0
        if shape is None or shape.n_layers is None:
            return 1000.0
        return (12 * shape.n_layers * shape.d_model**2 + 2 * vocab * shape.d_model) / 1e6

    @classmethod
    def shape_of_checkpoint(cls, ckpt: Checkpoint) -> ModelShape | None:
        hf = cls.cached_config(ckpt)
        return shape_of(hf) if hf else None


def _shown(names: Sequence[str] | Mapping[str, Any], n: int = 12) -> list[str]:
    names = sorted(names)
    return names if len(names) <= n else [*names[:n], f"... ({len(names)} in all)"]


# ---------------------------------------------------------------------------------------------- config.json


def check_hub_config(hf_config: Mapping[str, Any], trust_remote_code: bool, where: str) -> None:
    """What config.json (kilobytes, fetched before any weight) says about loading the model: remote code the
    entry does not allow, or an architecture no adapter knows, is a PreflightError naming the fix."""
    from anisweep.adapters import UnsupportedArchitecture, adapter_for

    model_type = hf_config.get("model_type")
    auto_map = hf_config.get("auto_map")
    if auto_map and not trust_remote_code and not _native(model_type):
        classes = ", ".join(f"{k} -> {v}" for k, v in sorted(auto_map.items())) if isinstance(auto_map, dict) else ""
        raise PreflightError(
            f"{where}: its config.json needs the repository's own code (auto_map: {classes}; model_type "
            f"{model_type!r}, which transformers does not know): read that code, then set trust_remote_code: true in "
            "its models entry"
        )
    from types import SimpleNamespace

    try:
        adapter_for(SimpleNamespace(model_type=model_type, architectures=hf_config.get("architectures")))
    except UnsupportedArchitecture as error:
        raise PreflightError(f"{where}: {error}") from None


def _native(model_type: Any) -> bool:
    from transformers import CONFIG_MAPPING

    return isinstance(model_type, str) and model_type in CONFIG_MAPPING
