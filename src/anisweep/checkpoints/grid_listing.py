"""What a repository publishes, from file metadata only: its branches and, on each, the weight files' sha256 and size.

Online, ``HfApi.list_repo_refs`` gives every branch and its commit, and ``HfApi.list_repo_tree`` a branch's files:
the Hub reports each LFS file's sha256 (its ``lfs.oid``) and size in the listing itself, so nothing is downloaded
(the tree is listed without ``expand``: that adds each file's last commit and security scan, costs the Hub a
history walk, and pages 50 files at a time). The shard index of a sharded branch (a few kB) is the one file read:
it names the weight files ``from_pretrained`` loads (:func:`read_indexes`). A branch whose commit is the one a
previous audit listed is not listed again: a commit fixes its files.

Offline (``HF_HUB_OFFLINE``), or when the Hub cannot be reached, the Hugging Face cache answers: ``refs/`` names
the branches that were fetched, a cached tree listing (``trees/{commit}.json``) the files of a commit, and else the
snapshot's links, whose blob names are the sha256 of LFS files. Only what was cached can be checked there:
each listing says where it came from (``source``: ``hub``, ``cache``) and whether it holds every file of the
branch (``complete``).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, hf_hub_download, try_to_load_from_cache
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import RepositoryNotFoundError

log = logging.getLogger(__name__)

_SHA256 = re.compile(r"[0-9a-f]{64}")
WORKERS = 8  # branches listed at once


class HubUnreachable(RuntimeError):
    """The Hub did not answer (offline mode, no network, a 5xx): the audit falls back to what is cached."""


@dataclass
class Listing:
    """One branch's files at one commit (in ``subfolder`` when the checkpoint is a folder of the repo)."""

    repo_id: str
    branch: str
    commit: str | None
    subfolder: str | None = None
    files: dict[str, tuple[str | None, int | None]] = field(default_factory=dict)  # name -> (LFS sha256, size)
    source: str = "hub"  # "hub", "cache", or "none" (nothing known)
    complete: bool = True  # every file of the branch, or (from a cache without its tree) only those downloaded
    indexed: list[str] | None = None  # the weight files its shard index names (None: no index, or not read)


def cache_repo(repo_id: str, cache_dir: Path | str | None = None) -> Path:
    root = Path(cache_dir if cache_dir is not None else hf_constants.HF_HUB_CACHE).expanduser()
    return root / ("models--" + repo_id.replace("/", "--"))


def is_offline() -> bool:
    return bool(hf_constants.is_offline_mode())


def _unreachable(error: BaseException) -> bool:
    """A failure of the connection or of the Hub itself (5xx), not an answer about the repository."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(error, (OfflineModeIsEnabled, httpx2.TransportError, ConnectionError, TimeoutError)):
        return True
    if isinstance(error, HfHubHTTPError):
        status = getattr(getattr(error, "response", None), "status_code", None) or 0
        return status >= 500 or status == 429
    return False


# ---------------------------------------------------------------------------------------------- branches


def hub_refs(api: HfApi, repo_id: str) -> dict[str, str]:
    """{branch: commit} from the Hub; HubUnreachable when it does not answer; RepositoryNotFoundError as it is."""
    try:
        return {b.name: b.target_commit for b in api.list_repo_refs(repo_id).branches}
    except RepositoryNotFoundError:
        raise
    except Exception as error:
        if _unreachable(error):
            raise HubUnreachable(f"{repo_id}: {type(error).__name__}: {error}") from error
        raise


def cached_refs(repo_id: str, cache_dir: Path | str | None = None) -> dict[str, str]:
    """{branch: commit} of the revisions the cache recorded (its ``refs/``); {} when it holds none."""
    refs = cache_repo(repo_id, cache_dir) / "refs"
    if not refs.is_dir():
        return {}
    return {p.relative_to(refs).as_posix(): p.read_text().strip() for p in sorted(refs.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------- files


def _inside(path: str, subfolder: str | None) -> str | None:
    """The name of a repo path inside the checkpoint's folder (top-level files only); None when outside it."""
    if subfolder:
        if not path.startswith(subfolder + "/"):
            return None
        path = path[len(subfolder) + 1 :]
    return None if "/" in path else path


def hub_listing(api: HfApi, repo_id: str, branch: str, commit: str, subfolder: str | None = None) -> Listing:
    files = {}
    for entry in api.list_repo_tree(repo_id, path_in_repo=subfolder or None, revision=commit, expand=False):
        name = _inside(entry.path, subfolder)
        if name is None or not hasattr(entry, "blob_id"):
            continue  # a folder
        lfs = getattr(entry, "lfs", None)
        files[name] = (lfs.sha256, lfs.size) if lfs is not None else (None, entry.size)
    return Listing(repo_id, branch, commit, subfolder, files, "hub", True)


def cached_listing(
    repo_id: str, branch: str, commit: str, subfolder: str | None = None, cache_dir: Path | str | None = None
) -> Listing:
    """The files of ``commit`` as the cache knows them: its tree listing, else its snapshot's blobs."""
    repo = cache_repo(repo_id, cache_dir)
    tree = repo / "trees" / f"{commit}.json"
    files: dict[str, tuple[str | None, int | None]] = {}
    if tree.is_file():
        try:
            entries = json.loads(tree.read_text()).get("files", {})
        except ValueError:
            entries = {}
        for path, entry in entries.items():
            name = _inside(path, subfolder)
            if name is not None:
                files[name] = (entry.get("lfs_sha256"), entry.get("lfs_size", entry.get("size")))
        if files:
            return Listing(repo_id, branch, commit, subfolder, files, "cache", True)
    snapshot = repo / "snapshots" / commit
    folder = snapshot / subfolder if subfolder else snapshot
    if not folder.is_dir():
        return Listing(repo_id, branch, commit, subfolder, {}, "none", False)
    for path in sorted(folder.iterdir()):
        if not (path.is_file() or path.is_symlink()) or not path.exists():
            continue
        blob = Path(os.path.realpath(path))
        sha = blob.name if _SHA256.fullmatch(blob.name) else None
        files[path.name] = (sha, blob.stat().st_size)
    return Listing(repo_id, branch, commit, subfolder, files, "cache", False)


def read_index(listing: Listing, index_name: str, cache_dir: Path | str | None = None) -> dict[str, str]:
    """The shard index's ``weight_map`` (tensor -> shard file) of a branch: a small file, downloaded online (into the
    cache), read from the cache offline; {} when it cannot be had."""
    path = f"{listing.subfolder}/{index_name}" if listing.subfolder else index_name
    found: Any = try_to_load_from_cache(listing.repo_id, path, cache_dir=cache_dir, revision=listing.commit)
    if not isinstance(found, str) and not is_offline() and listing.source == "hub":
        try:
            found = hf_hub_download(listing.repo_id, path, revision=listing.commit, cache_dir=cache_dir)
        except Exception as error:
            log.warning("%s@%s: could not read %s (%s)", listing.repo_id, listing.branch, path, error)
            return {}
    if not isinstance(found, str):
        return {}
    try:
        return dict(json.loads(Path(found).read_text()).get("weight_map", {}))
    except (OSError, ValueError):
        return {}


def read_indexes(listings: Iterable[Listing], cache_dir: Path | str | None = None) -> None:
    """Fill in ``indexed`` of each listing that holds the shard index of its weights (several read at once): the
    files that ``from_pretrained`` loads, which the branch may lack (anisweep.checkpoints.files.absent_shards)."""
    from anisweep.checkpoints.files import index_of, select_files

    jobs = []
    for listing in listings:
        if listing.indexed is not None or listing.source == "none":
            continue
        try:
            index = index_of(select_files([*listing.files, "config.json"])[1])
        except ValueError:  # no weights
            continue
        if index in listing.files:
            jobs.append((listing, index))
    with ThreadPoolExecutor(WORKERS) as pool:
        maps = list(pool.map(lambda job: read_index(*job, cache_dir), jobs))
    for (listing, _), weight_map in zip(jobs, maps, strict=True):
        listing.indexed = sorted(set(weight_map.values())) or None


def list_branches(
    wanted: Iterable[tuple[str, str, str | None]],
    refs: Mapping[str, Mapping[str, str]],
    *,
    online: bool,
    previous: Mapping[tuple[str, str, str | None, str], Listing] | None = None,
    cache_dir: Path | str | None = None,
    api: HfApi | None = None,
) -> list[Listing]:
    """The listing of each (repo, branch, subfolder) in ``wanted`` at the commit ``refs`` names: a previous audit's
    for an unchanged commit, else the Hub's (``online``, several at once), else the cache's."""
    api = api or HfApi()
    previous = previous or {}
    jobs, out = [], []
    for repo_id, branch, sub in wanted:
        commit = refs.get(repo_id, {}).get(branch)
        if commit is None:
            continue
        old = previous.get((repo_id, branch, sub, commit))
        if old is not None and old.source == "hub":
            out.append(old)
        elif online:
            jobs.append((repo_id, branch, commit, sub))
        else:
            out.append(cached_listing(repo_id, branch, commit, sub, cache_dir))
    if jobs:
        with ThreadPoolExecutor(WORKERS) as pool:
            out += list(pool.map(lambda job: hub_listing(api, *job), jobs))
    return out
