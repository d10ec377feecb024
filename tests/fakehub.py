"""A local Hugging Face Hub: the API endpoints huggingface_hub calls, served over HTTP from a thread.

Repositories are in memory, ``{repo_id: {branch: {filename: bytes}}}``, served under their real ids:

- ``GET  /api/models/{repo}/refs``                      -> branches and their commits (``list_repo_refs``)
- ``GET  /api/models/{repo}/tree/{revision}[/{path}]``  -> files with size, blob id and, for LFS files, the sha256
  (``list_repo_tree``; ``expand`` accepted)
- ``POST /api/models/{repo}/paths-info/{revision}``     -> the same for named paths (``get_paths_info``)
- ``GET  /api/models/{repo}[/revision/{revision}]``     -> the commit and the file list (``repo_info``,
  ``resolve_revision``, ``snapshot_download``)
- ``HEAD|GET /{repo}/resolve/{revision}/{path}``        -> a file, with the Hub's headers (commit, etag = sha256 for
  LFS files, size) (``hf_hub_download``); a GET with ``Range: bytes=a-b`` gets those bytes alone (206)

Every request is recorded (``hub.requests``: method and path), so a test can say what was downloaded and in
which order; ``hub.served`` records the bytes each GET of a file sent (path, bytes), ``hub.ranges`` each range a GET
asked for (path, first byte, last byte). Use :func:`online_hub` to
point huggingface_hub at it for one test::

    hub = FakeHub({"EleutherAI/pythia-70m": {"step0": files_a, "main": files_b}})
    with hub.serving():
        online_hub(monkeypatch, tmp_path / "hf", hub.url)
        ...
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from hubcache import LFS_SUFFIXES

__all__ = ["FakeHub", "online_hub", "read_folder"]


def read_folder(folder: Path) -> dict[str, bytes]:
    """A saved model folder as ``{filename: bytes}``."""
    root = Path(folder)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _git_blob_sha1(data: bytes) -> str:
    """The git blob id the Hub reports for a file (``oid``)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _commit(repo_id: str, branch: str, files: Mapping[str, bytes]) -> str:
    digest = hashlib.sha1(
        json.dumps([repo_id, branch, sorted((n, _git_blob_sha1(d)) for n, d in files.items())]).encode()
    )
    return digest.hexdigest()


def _entry(name: str, data: bytes) -> dict:
    entry = {"type": "file", "path": name, "size": len(data), "oid": _git_blob_sha1(data)}
    if name.endswith(LFS_SUFFIXES):
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
    return entry


class FakeHub:
    """The repositories, their commits, and the HTTP server that serves them."""

    def __init__(self, repos: Mapping[str, Mapping[str, Mapping[str, bytes]]]):
        self.repos: dict[str, dict[str, dict[str, bytes]]] = {}
        self.commits: dict[str, dict[str, str]] = {}
        self.requests: list[tuple[str, str]] = []
        self.served: list[tuple[str, int]] = []  # (path, bytes sent) of each GET on the resolve endpoint
        self.ranges: list[tuple[str, int, int]] = []  # (path, first, last byte asked) of each range GET of a file
        self._lock = threading.Lock()
        for repo_id, branches in repos.items():
            for branch, files in branches.items():
                self.push(repo_id, branch, files)
        self._server: ThreadingHTTPServer | None = None

    def push(self, repo_id: str, branch: str, files: Mapping[str, bytes]) -> str:
        """Upload ``files`` as the whole content of ``branch`` (a new commit); return the commit."""
        files = dict(files)
        commit = _commit(repo_id, branch, files)
        self.repos.setdefault(repo_id, {})[branch] = files
        self.commits.setdefault(repo_id, {})[branch] = commit
        return commit

    def _resolve(self, repo_id: str, revision: str) -> tuple[str, dict[str, bytes]] | None:
        branches = self.repos.get(repo_id, {})
        if revision in branches:
            return self.commits[repo_id][revision], branches[revision]
        for branch, commit in self.commits.get(repo_id, {}).items():
            if commit == revision:
                return commit, branches[branch]
        return None

    def downloads(self) -> list[str]:
        """The files fetched with GET on the resolve endpoint, as ``repo@revision/path``, in order."""
        out = []
        for method, path in self.requests:
            if method == "GET" and "/resolve/" in path:
                repo, rest = path.lstrip("/").split("/resolve/", 1)
                revision, name = rest.split("/", 1)
                out.append(f"{repo}@{revision}/{name}")
        return out

    @property
    def url(self) -> str:
        assert self._server is not None, "not serving"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @contextlib.contextmanager
    def serving(self) -> Iterator[FakeHub]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub._handle(self, "HEAD")

            def do_GET(self):
                hub._handle(self, "GET")

            def do_POST(self):
                hub._handle(self, "POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # shutdown() waits for the loop's next poll: the default interval (0.5 s) was most of a hub test's teardown
        thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(5)

    # ------------------------------------------------------------------------------------------ requests

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(handler.path)
        path = unquote(url.path)
        with self._lock:
            self.requests.append((method, path))
        body = b""
        if method == "POST":
            body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        try:
            status, headers, payload = self._route(method, path, parse_qs(url.query), body, handler.headers)
        except KeyError as missing:
            status, headers, payload = 404, {"X-Error-Code": str(missing.args[0])}, b'{"error": "not found"}'
        if method == "GET" and "/resolve/" in path:
            # recorded before the first byte goes out: once the client has the bytes, `served` counts them (recorded
            # after the write, a test that reads `served` as soon as its download returns could miss the last one)
            with self._lock:
                self.served.append((path, len(payload)))
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        if method != "HEAD":
            handler.wfile.write(payload)

    def _repo_and_rest(self, path: str) -> tuple[str, str]:
        for repo_id in self.repos:
            if path == repo_id or path.startswith(repo_id + "/"):
                return repo_id, path[len(repo_id) + 1 :]
        raise KeyError("RepoNotFound")

    def _files_at(self, repo_id: str, revision: str) -> tuple[str, dict[str, bytes]]:
        found = self._resolve(repo_id, revision)
        if found is None:
            raise KeyError("RevisionNotFound")
        return found

    def _route(self, method, path, query, body, headers):
        as_json = {"Content-Type": "application/json"}
        if path.startswith("/api/models/"):
            repo_id, rest = self._repo_and_rest(path[len("/api/models/") :])
            if rest == "refs":
                branches = [
                    {"name": b, "ref": f"refs/heads/{b}", "targetCommit": c} for b, c in self.commits[repo_id].items()
                ]
                data = {"branches": branches, "converts": [], "tags": []}
                return 200, as_json, json.dumps(data).encode()
            if rest.startswith("tree/"):
                revision, _, sub = rest[len("tree/") :].partition("/")
                _, files = self._files_at(repo_id, revision)
                prefix = f"{sub}/" if sub else ""
                recursive = query.get("recursive", ["False"])[0].lower() == "true"
                names = [n for n in files if n.startswith(prefix)]
                entries, folders = [], set()
                for name in sorted(names):
                    inside = name[len(prefix) :]
                    if "/" in inside and not recursive:
                        folders.add(prefix + inside.split("/", 1)[0])
                        continue
                    entries.append(_entry(name, files[name]))
                entries += [{"type": "directory", "path": f, "oid": "0" * 40, "size": 0} for f in sorted(folders)]
                return 200, as_json, json.dumps(entries).encode()
            if rest.startswith("paths-info/"):
                _, files = self._files_at(repo_id, rest[len("paths-info/") :])
                asked = _paths_of(body, headers)
                entries = [_entry(n, files[n]) for n in asked if n in files]
                return 200, as_json, json.dumps(entries).encode()
            revision = rest[len("revision/") :] if rest.startswith("revision/") else "main"
            commit, files = self._files_at(repo_id, revision)
            data = {"id": repo_id, "sha": commit, "siblings": [{"rfilename": n} for n in sorted(files)]}
            return 200, as_json, json.dumps(data).encode()
        repo_id, rest = self._repo_and_rest(path.lstrip("/"))
        if not rest.startswith("resolve/"):
            raise KeyError("EntryNotFound")
        revision, _, name = rest[len("resolve/") :].partition("/")
        commit, files = self._files_at(repo_id, revision)
        if name not in files:
            raise KeyError("EntryNotFound")
        data = files[name]
        entry = _entry(name, data)
        etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
        out = {"X-Repo-Commit": commit, "ETag": f'"{etag}"', "Content-Type": "application/octet-stream"}
        if "lfs" in entry:
            out |= {"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))}
        asked = re.fullmatch(r"bytes=(\d+)-(\d*)", (headers.get("Range") or "").strip())
        if method == "GET" and asked:
            with self._lock:
                self.ranges.append((path, int(asked[1]), int(asked[2]) if asked[2] else len(data) - 1))
            start = int(asked[1])
            stop = min(int(asked[2]) + 1 if asked[2] else len(data), len(data))
            return 206, out | {"Content-Range": f"bytes {start}-{stop - 1}/{len(data)}"}, data[start:stop]
        return 200, out, data


def _paths_of(body: bytes, headers) -> list[str]:
    text = body.decode() if body else ""
    if "json" in (headers.get("Content-Type") or ""):
        return list(json.loads(text or "{}").get("paths", []))
    return [p for key, values in parse_qs(text).items() if key == "paths" for p in values]


def online_hub(monkeypatch, hf_home: Path, endpoint: str) -> Path:
    """Point huggingface_hub at ``endpoint`` with an empty cache in ``hf_home``, online, for this test only (the
    environment for subprocesses, the constants for this process: huggingface_hub reads them at import)."""
    from huggingface_hub import constants

    hf_home = Path(hf_home)
    (hf_home / "hub").mkdir(parents=True, exist_ok=True)
    for var, value in {
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": str(hf_home / "hub"),
        "HF_ENDPOINT": endpoint,
        "HF_HUB_OFFLINE": "0",
        "TRANSFORMERS_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_ETAG_TIMEOUT": "5",
    }.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(constants, "HF_HOME", str(hf_home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    return hf_home
