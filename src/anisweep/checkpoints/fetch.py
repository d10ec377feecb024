"""Getting a checkpoint's weights onto disk, and the manifest that says where they are.

:func:`fetch` turns a :class:`~anisweep.checkpoints.base.Checkpoint` into a folder that ``from_pretrained`` loads
and writes ``dest/checkpoint.json`` (the manifest) atomically.

Hub checkpoints (``pythia``, ``multiberts``):

1. The revision is resolved to a commit hash (``HfApi.resolve_revision``: online it asks the Hub and records
   ``refs/{revision}`` in the cache; offline, or when the Hub is unreachable, it reads that ref).
2. The repo's file list (the cached tree listing, else the Hub's listing, else -- offline -- the cached
   snapshot folder) decides what to download: ``config.json``, the tokenizer files (an image or audio model's
   ``preprocessor_config.json`` among them) and ONE weight format:
   ``*.safetensors`` (+ index) when the repo has them, else ``pytorch_model*.bin`` (+ index). Never
   ``tf_model.h5``, flax, onnx. The exact file names are passed as ``allow_patterns``. A branch without a weight
   file its shard index names (downloaded first, with the config) is a FetchError before any weight moves.
3. ``huggingface_hub.snapshot_download`` downloads them (resumable, with its own progress bars):
   ``keep_weights=True`` into the normal HF cache (``path`` = the snapshot folder); ``keep_weights=False``
   into ``dest/weights`` (``local_dir``), a folder the pipeline deletes after extraction -- except when
   the HF cache already holds every wanted file (always the case offline): then nothing is downloaded and
   ``dest/weights`` holds symlinks to the cached files, so deleting it never touches the cache.
4. Transient failures (connection errors, timeouts, HTTP 408/429/5xx) are retried ``retries`` times with
   exponential backoff (``backoff * 2**k`` seconds), then raise :class:`FetchError` naming repo, revision
   and the last cause. A revision or repo that does not exist (or, offline, is not in the cache) raises
   :class:`RevisionNotFound` at once.

Local/toy checkpoints are used in place: ``path`` is the checkpoint folder, nothing is copied.

The manifest lists the weight files and their total size; it holds no hash of them: extract hashes the
bytes it loads (anisweep.checkpoints.weight_files), so that fetch never reads a checkpoint's weights at all.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx2
from huggingface_hub import HfApi, ResolvedRevision, snapshot_download, try_to_load_from_cache
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import (
    CachedRepoTreeNotFoundError,
    EntryNotFoundError,
    FileMetadataError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    RevisionResolutionError,
    XetDownloadError,
)
from huggingface_hub.utils import are_progress_bars_disabled
from tqdm.auto import tqdm as _tqdm

from anisweep.atomic import write_json
from anisweep.checkpoints.base import Checkpoint
from anisweep.checkpoints.files import TOKENIZER_FILES, absent_in_folder, index_of, select_files, weight_files_in
from anisweep.checkpoints.weight_files import check_hashes, hub_sha256

try:  # requests is optional in huggingface_hub 1.x/2.x; catch its errors when something uses it
    import requests

    _REQUESTS_TRANSIENT: tuple[type[BaseException], ...] = (
        requests.ConnectionError,
        requests.Timeout,
    )
except ImportError:  # pragma: no cover
    _REQUESTS_TRANSIENT = ()

__all__ = [
    "FetchError",
    "LogProgress",
    "log_to_stderr",
    "RevisionNotFound",
    "fetch",
    "select_files",
    "weight_files_in",
    "MANIFEST",
    "WEIGHTS_DIR",
]

log = logging.getLogger(__name__)

MANIFEST = "checkpoint.json"
WEIGHTS_DIR = "weights"


_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TRANSIENT_EXC: tuple[type[BaseException], ...] = (
    httpx2.TimeoutException,
    httpx2.NetworkError,
    httpx2.RemoteProtocolError,
    XetDownloadError,
    FileMetadataError,
    TimeoutError,
    ConnectionError,  # builtin; OfflineModeIsEnabled subclasses it and is handled first
    *_REQUESTS_TRANSIENT,
)


class FetchError(RuntimeError):
    """A checkpoint could not be fetched. Names the repo (or folder), the revision and the last cause."""

    def __init__(self, message: str, *, repo_id: str | None = None, revision: str | None = None):
        super().__init__(message)
        self.repo_id = repo_id
        self.revision = revision


class RevisionNotFound(FetchError):
    """The repo or revision does not exist on the Hub (or, offline, is not in the local cache): no retry."""


T = TypeVar("T")
BeforeWeights = Callable[[Path, "Path | str | None"], None]


# ---------------------------------------------------------------------------------------------- errors


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(seen) < 16:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _classify(exc: BaseException) -> str:
    """'missing' (repo/revision does not exist, or offline without it), 'transient' (retry), or 'fatal'."""
    chain = list(_chain(exc))
    for e in chain:
        if isinstance(e, (RevisionNotFoundError, RepositoryNotFoundError)):
            return "missing"
        if isinstance(e, OfflineModeIsEnabled):
            return "missing"
    if hf_constants.is_offline_mode() and any(
        isinstance(e, (EntryNotFoundError, RevisionResolutionError)) for e in chain
    ):
        return "missing"  # offline and not in the cache: waiting will not bring it
    for e in chain:
        if isinstance(e, httpx2.ProxyError):
            return "fatal"  # a misconfigured proxy does not heal by waiting
        if isinstance(e, HfHubHTTPError):
            status = getattr(getattr(e, "response", None), "status_code", None)
            return "transient" if status in _TRANSIENT_STATUS or (status or 0) >= 500 else "fatal"
        if isinstance(e, _TRANSIENT_EXC):
            return "transient"
    return "fatal"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".rstrip(": ")


def _with_retries(call: Callable[[], T], *, what: str, repo_id: str, revision: str, retries: int, backoff: float) -> T:
    """Run ``call``; retry transient failures with exponential backoff; wrap every failure in FetchError."""
    attempt = 0
    while True:
        try:
            return call()
        except Exception as exc:
            kind = _classify(exc)
            where = f"{repo_id} at revision {revision!r}"
            if kind == "missing":
                why = (
                    "is not in the local HF cache and HF_HUB_OFFLINE is set"
                    if hf_constants.is_offline_mode()
                    else "does not exist on the Hub (or is not accessible)"
                )
                raise RevisionNotFound(
                    f"{what}: {where} {why}: {_describe(exc)}",
                    repo_id=repo_id,
                    revision=revision,
                ) from exc
            if kind == "fatal":
                raise FetchError(
                    f"{what} failed for {where}: {_describe(exc)}", repo_id=repo_id, revision=revision
                ) from exc
            attempt += 1
            if attempt > retries:
                raise FetchError(
                    f"{what} failed for {where} after {attempt} attempts; last error: {_describe(exc)}",
                    repo_id=repo_id,
                    revision=revision,
                ) from exc
            delay = min(backoff * 2 ** (attempt - 1), 300.0)
            log.warning(
                "%s for %s failed (%s); retry %d/%d in %.1fs", what, where, _describe(exc), attempt, retries, delay
            )
            if delay > 0:
                time.sleep(delay)


# ---------------------------------------------------------------------------------------------- files


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / f).is_file() for f in TOKENIZER_FILES)


# ---------------------------------------------------------------------------------------------- hub


class LogProgress(_tqdm):
    """The download progress bars of ``snapshot_download``, shown where stderr is a log file too.

    huggingface_hub hides its bars when stderr is not a terminal, and the fetch rule sends stderr to its log;
    these stay on there, refreshed at most every ``LOG_INTERVAL`` seconds so that a 24 GB download adds a few
    dozen lines, not thousands. ``HF_HUB_DISABLE_PROGRESS_BARS=1`` still turns them off.
    """

    LOG_INTERVAL = 30.0

    def __init__(self, *args, **kwargs):
        kwargs.pop("name", None)
        if are_progress_bars_disabled():
            kwargs["disable"] = True
        else:
            kwargs["disable"] = False
            stream = kwargs.get("file") or sys.stderr
            if not (hasattr(stream, "isatty") and stream.isatty()):
                kwargs.setdefault("mininterval", self.LOG_INTERVAL)
        super().__init__(*args, **kwargs)


def log_to_stderr(level: int = logging.INFO) -> None:
    """Show this module's messages (what is fetched, how much, retries) on stderr: the fetch rule's log."""
    if not any(getattr(h, "_anisweep", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        handler._anisweep = True  # type: ignore[attr-defined]
        log.addHandler(handler)
    log.setLevel(level)


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def _hub_api() -> HfApi:
    return HfApi()


def _cache_root(cache_dir: Path | str | None) -> Path:
    return Path(cache_dir if cache_dir is not None else hf_constants.HF_HUB_CACHE).expanduser()


def _repo_files(api: Any, repo_id: str, commit: str, cache_dir: Path | None, *, offline: bool) -> list[str]:
    """The repo's files at ``commit``: cached tree listing, else the Hub (online) or the cached snapshot (offline)."""
    try:
        from huggingface_hub import get_cached_repo_tree

        return [f.path for f in get_cached_repo_tree(repo_id, revision=commit, cache_dir=cache_dir)]
    except (ImportError, CachedRepoTreeNotFoundError):
        pass
    if not offline:
        return list(api.list_repo_files(repo_id, revision=commit))
    snap = _cache_root(cache_dir) / ("models--" + repo_id.replace("/", "--")) / "snapshots" / commit
    if not snap.is_dir():
        raise EntryNotFoundError(f"no cached snapshot {snap}")
    return [p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file()]


def _all_cached(repo_id: str, commit: str, files: Iterable[str], cache_dir: Path | None) -> bool:
    return all(isinstance(try_to_load_from_cache(repo_id, f, cache_dir=cache_dir, revision=commit), str) for f in files)


def _link_files(src: Path, dst: Path, files: Iterable[str]) -> None:
    """``dst/f`` -> the cached blob of ``src/f`` (symlink; copy where links are not possible)."""
    if dst.is_symlink() or dst.is_file():
        dst.unlink()
    elif dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for f in files:
        target = Path(os.path.realpath(src / f))
        try:
            (dst / f).symlink_to(target)
        except OSError:
            shutil.copyfile(target, dst / f)


def _fetch_hub(
    ckpt: Checkpoint,
    dest: Path,
    *,
    keep_weights: bool,
    retries: int,
    backoff: float,
    cache_dir: Path | None,
    before_weights: BeforeWeights | None = None,
    audited_sha256: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    repo_id, revision = ckpt.repo_id, ckpt.revision or "main"
    assert repo_id is not None
    offline = hf_constants.is_offline_mode()
    api = _hub_api()
    retry = dict(repo_id=repo_id, revision=revision, retries=retries, backoff=backoff)
    if "*" in revision:
        names = _with_retries(
            lambda: _branches(api, repo_id, cache_dir, offline=offline), what="listing branches", **retry
        )
        revision = match_branch(repo_id, revision, names, offline=offline)
        retry["revision"] = revision

    if ckpt.commit:  # the `hub` family resolved it when the config was read: the commit its params record
        resolved = ResolvedRevision(ckpt.commit, initial=revision, repo_id=repo_id)
    else:
        resolved = _with_retries(
            lambda: api.resolve_revision(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=offline),
            what="resolving the revision",
            **retry,
        )
    commit = resolved.resolved
    files = _with_retries(
        lambda: _repo_files(api, repo_id, commit, cache_dir, offline=offline), what="listing the repo files", **retry
    )
    sub = ckpt.subfolder
    try:
        wanted, weights, tokenizer_dir = _select_in(files, sub)
    except ValueError as exc:
        where = f"{repo_id} at revision {revision!r}" + (f", folder {sub}/" if sub else "")
        raise FetchError(f"{where}: {exc}", repo_id=repo_id, revision=revision) from None

    use_cache = keep_weights or offline or _all_cached(repo_id, commit, wanted, cache_dir)
    local_dir = None if use_cache else dest / WEIGHTS_DIR
    log.info(
        "fetching %s@%s (commit %s): %s -> %s",
        repo_id,
        revision,
        commit[:10],
        ", ".join(wanted),
        local_dir or "the HF cache",
    )

    def download(files: list[str]) -> Path:
        return Path(
            _with_retries(
                lambda: snapshot_download(
                    repo_id,
                    revision=resolved,
                    allow_patterns=files,
                    cache_dir=cache_dir,
                    local_dir=local_dir,
                    tqdm_class=LogProgress,
                ),
                what="downloading",
                **retry,
            )
        )

    weight_paths = [f"{sub}/{f}" if sub else f for f in weights]
    index = f"{sub}/{index_of(weights)}" if sub else index_of(weights)
    if index not in wanted:
        _check_shards(ckpt, revision, weights, None)  # by the shards' names
    if before_weights is not None or ckpt.family == "hub" or index in wanted:
        small = download([f for f in wanted if f not in weight_paths])  # config, tokenizer, index: kilobytes first
        model_dir = small / sub if sub else small
        if index in wanted:
            _check_shards(ckpt, revision, weights, model_dir)
        if ckpt.family == "hub":
            _check_hub_config(model_dir, ckpt)
        if before_weights is not None:
            tokenizer = small / tokenizer_dir if tokenizer_dir is not None else None
            before_weights(model_dir, tokenizer if tokenizer is not None and _has_tokenizer(tokenizer) else None)
    started = time.monotonic()
    folder = download(wanted)
    missing = [f for f in wanted if not (folder / f).is_file()]
    if missing:
        raise FetchError(
            f"{repo_id} at revision {revision!r}: after download {folder} lacks {', '.join(missing)}",
            repo_id=repo_id,
            revision=revision,
        )
    log.info(
        "%s@%s: %s of weights in %s after %.0f s",
        repo_id,
        revision,
        _size(sum((folder / f).stat().st_size for f in weight_paths)),
        folder,
        time.monotonic() - started,
    )
    tokenizer_at = folder / tokenizer_dir if tokenizer_dir is not None else None
    model_at = folder / sub if sub else folder
    if audited_sha256:  # the Hub's name for each file's bytes against the audit's, before extract reads them
        named = {f: hub_sha256(model_at / f, model_at) for f in weights}
        check_hashes(named, audited_sha256, ckpt.key, "the Hub's sha256")
    if use_cache and not keep_weights:
        # dest/weights: the checkpoint's files, and the repo's tokenizer beside them when its folder has none
        _link_files(
            model_at,
            dest / WEIGHTS_DIR,
            [f.removeprefix(f"{sub}/") if sub else f for f in wanted if not sub or f.startswith(f"{sub}/")],
        )
        if sub and tokenizer_dir == "":
            for f in wanted:
                if "/" not in f:
                    _link_one(folder / f, dest / WEIGHTS_DIR / f)
        model_at = tokenizer_at = dest / WEIGHTS_DIR
    return dict(
        commit=commit,
        revision=revision,
        path=model_at,
        weight_files=weights,
        tokenizer_path=tokenizer_at if tokenizer_at is not None and _has_tokenizer(tokenizer_at) else None,
    )


def _select_in(files: Iterable[str], sub: str | None) -> tuple[list[str], list[str], str | None]:
    """What to download of a repo's `files` for the checkpoint in folder `sub` (None: the top level): the repo
    paths wanted, the weight files (names inside the checkpoint's folder) and the folder holding the tokenizer
    ("" the top level, None no tokenizer): the checkpoint's own, else (a Trainer's checkpoint-{N}/ pushed without
    one) the repo's top level."""
    files = list(files)
    if not sub:
        wanted, weights = select_files(files)
        return wanted, weights, "" if any(f in TOKENIZER_FILES for f in wanted) else None
    inside = [f[len(sub) + 1 :] for f in files if f.startswith(f"{sub}/")]
    if not inside:
        raise ValueError("no such folder in the repo")
    names, weights = select_files(inside)
    wanted = [f"{sub}/{f}" for f in names]
    if any(f in TOKENIZER_FILES for f in names):
        return wanted, weights, sub
    top = [f for f in files if "/" not in f and f in TOKENIZER_FILES]
    return sorted(wanted + top), weights, "" if top else None


def _check_shards(ckpt: Checkpoint, revision: str, weights: list[str], model_dir: Path | None) -> None:
    """A FetchError, before any weight moves, where the branch lacks weight files that ``from_pretrained`` loads:
    those its shard index (downloaded into ``model_dir``) names, else those its shards' names announce."""
    gap = absent_in_folder(weights, model_dir)
    if gap:
        raise FetchError(
            f"{ckpt.key}: {ckpt.repo_id} at revision {revision!r}: {gap}: it cannot be loaded (`anisweep audit` "
            "flags it incomplete); sweep another step",
            repo_id=ckpt.repo_id,
            revision=revision,
        )


def _link_one(src: Path, dst: Path) -> None:
    target = Path(os.path.realpath(src))
    try:
        dst.symlink_to(target)
    except OSError:
        shutil.copyfile(target, dst)


def _check_hub_config(model_dir: Path, ckpt: Checkpoint) -> None:
    """The `hub` family's config.json, before any weight: remote code it needs and the entry does not allow, or an
    architecture no adapter knows (anisweep.checkpoints.hub_repo.check_hub_config)."""
    import json

    from anisweep.checkpoints.hub_repo import check_hub_config

    try:
        hf_config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise FetchError(f"{ckpt.key}: cannot read its config.json: {error}", repo_id=ckpt.repo_id) from None
    check_hub_config(hf_config, ckpt.trust_remote_code, ckpt.key)


def _branches(api: Any, repo_id: str, cache_dir: Path | None, *, offline: bool) -> list[str]:
    """The repo's branch names; offline, the revisions the cache holds (its ``refs/``)."""
    if not offline:
        return sorted(b.name for b in api.list_repo_refs(repo_id).branches)
    refs = _cache_root(cache_dir) / ("models--" + repo_id.replace("/", "--")) / "refs"
    return sorted(p.relative_to(refs).as_posix() for p in refs.rglob("*") if p.is_file()) if refs.is_dir() else []


def branch_of(repo_id: str, revision: str) -> str:
    """A catalogued revision as the branch it names: a pattern (``*`` = digits, OLMo's rounded token counts) looked
    up among the repo's branches (offline, the cache's), any other revision as it is."""
    if "*" not in revision:
        return revision
    offline = hf_constants.is_offline_mode()
    return match_branch(repo_id, revision, _branches(_hub_api(), repo_id, None, offline=offline), offline=offline)


def match_branch(repo_id: str, pattern: str, names: Iterable[str], *, offline: bool) -> str:
    """The one branch among ``names`` that matches ``pattern`` (``*`` = digits). Suites whose branch names hold a
    rounded token count (OLMo: ``step1000-tokens4B``) are catalogued by step; the exact name is looked up here."""
    names = list(names)
    regex = re.compile(re.escape(pattern).replace(r"\*", r"\d+"))
    found = [name for name in names if regex.fullmatch(name)]
    if len(found) == 1:
        return found[0]
    where = "in the local cache (HF_HUB_OFFLINE is set)" if offline else "on the Hub"
    if not found:
        near = difflib.get_close_matches(pattern.replace("*", ""), names, n=3, cutoff=0.0)
        raise RevisionNotFound(
            f"{repo_id} has no branch matching {pattern!r} {where}"
            + (f"; nearest: {', '.join(near)}" if near else "; it has no branches there"),
            repo_id=repo_id,
            revision=pattern,
        )
    raise FetchError(
        f"{repo_id}: several branches match {pattern!r}: {', '.join(found)}", repo_id=repo_id, revision=pattern
    )


# ---------------------------------------------------------------------------------------------- entry points


def _fetch_local(ckpt: Checkpoint, before_weights: BeforeWeights | None = None) -> dict[str, Any]:
    folder = Path(ckpt.path or "")
    if not ckpt.path or not folder.is_dir():
        raise FetchError(f"{ckpt.key}: checkpoint folder {folder} does not exist", revision=f"step{ckpt.step}")
    try:
        weights = weight_files_in(folder)
    except ValueError as exc:
        raise FetchError(f"{ckpt.key}: checkpoint folder {folder}: {exc}", revision=f"step{ckpt.step}") from None
    tokenizer = ckpt.tokenizer or next((p for p in (folder, folder.parent) if _has_tokenizer(p)), None)
    if before_weights is not None:
        before_weights(folder, tokenizer)
    return dict(commit=None, path=folder, weight_files=weights, tokenizer_path=tokenizer)


def fetch(
    ckpt: Checkpoint,
    dest: Path,
    *,
    keep_weights: bool = False,
    retries: int = 5,
    backoff: float = 2.0,
    cache_dir: Path | str | None = None,
    before_weights: BeforeWeights | None = None,
    audited_sha256: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Make ``ckpt`` loadable from disk, write ``dest/checkpoint.json`` (atomically) and return it.

    The manifest: family, model, step, tokens_seen, seed, repo_id, revision, commit (Hub commit hash or
    None), path (the folder ``from_pretrained`` loads), tokenizer_path (the folder ``AutoTokenizer`` loads;
    for local runs the checkpoint folder or else the run folder; None if neither has tokenizer files),
    weight_files (names inside ``path``), weights_bytes (their total size). No weight file is read: extract
    hashes the bytes it loads (anisweep.checkpoints.weight_files).
    ``cache_dir`` overrides the HF cache (default: ``$HF_HOME/hub``). ``before_weights(folder, tokenizer)``,
    given the folder holding config.json and the tokenizer's folder (or Hub id, or None), runs before any
    weight file is downloaded or read (the preflight checks): when it raises, no weights have moved.
    ``audited_sha256`` ({weight file: sha256}, from the audit of the grid: anisweep.checkpoints.audit) is checked
    against the sha256 the Hub gave each downloaded file (its blob's name in the cache, its etag in a download
    folder), a HashMismatch naming the file; the manifest records it, and extract checks the bytes against that name.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if ckpt.repo_id is not None:
        got = _fetch_hub(
            ckpt,
            dest,
            keep_weights=keep_weights,
            retries=retries,
            backoff=backoff,
            cache_dir=Path(cache_dir) if cache_dir is not None else None,
            before_weights=before_weights,
            audited_sha256=audited_sha256,
        )
    else:
        got = _fetch_local(ckpt, before_weights)
    folder: Path = got["path"]
    weights: list[str] = got["weight_files"]
    manifest = {
        "family": ckpt.family,
        "model": ckpt.model,
        "step": ckpt.step,
        "tokens_seen": ckpt.tokens_seen,
        "seed": ckpt.seed,
        "repo_id": ckpt.repo_id,
        "revision": got.get("revision", ckpt.revision),
        "commit": got["commit"],
        "path": str(folder),
        "tokenizer_path": None if got["tokenizer_path"] is None else str(got["tokenizer_path"]),
        "weight_files": weights,
        "weights_bytes": sum((folder / f).stat().st_size for f in weights),
    }
    if audited_sha256:
        manifest["audited_sha256"] = dict(audited_sha256)
    if ckpt.family == "hub":  # what was loaded and with which permission, named in extract.json
        manifest |= {"subfolder": ckpt.subfolder, "trust_remote_code": ckpt.trust_remote_code}
    write_json(manifest, dest / MANIFEST)
    return manifest
