"""A Hub checkpoint's tensors read by HTTP range requests, so that a weights-only sweep moves only the tensors its
measures name.

A safetensors file is an 8-byte little-endian header length, a JSON header ({tensor: {dtype, shape, data_offsets}})
and the tensors' bytes: the source reads the length and the header (two range requests per file), then each tensor
asked for by its own range (the rows of a matrix a measure reads in part, such as each head's W_Q and W_K rows of a
fused QKV matrix, by a range per block of rows), from the resolve URL of the pinned commit (huggingface_hub's
endpoint, headers and token). config.json, the tokenizer files and the shard index are downloaded (small) into the
Hugging Face cache; a branch without a weight file its index names is a WeightsError naming it, before any tensor
moves. Each range moves once per source: one asked for again (the same rows read by two measures of a job) is read
back from local disk (anisweep.weights.held). Pickled ``pytorch_model*.bin`` files cannot be read in part: each is
downloaded whole (and cached), said once on stderr. Weight files the cache already holds for the commit are read
there, moving nothing. `bytes_read` counts the bytes moved (headers included).
"""

from __future__ import annotations

import json
import math
import struct
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from anisweep.checkpoints.base import Checkpoint
from anisweep.checkpoints.files import CONFIG_FILES, TOKENIZER_FILES, absent_in_folder, index_of
from anisweep.weights.held import HeldRanges
from anisweep.weights.source import LocalSource, WeightsError, weight_files

SMALL_FILES = (*CONFIG_FILES, *TOKENIZER_FILES)  # fetch's: config.json, then the tokenizer's or processor's
RANGE_REQUESTS_AT_ONCE = 8  # the heads of a fused QKV matrix: one request each, a few in flight
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class HubSource:
    """The tensors of `repo_id` at `commit` (in `subfolder`), by range reads of its safetensors."""

    def __init__(self, repo_id: str, commit: str, names: list[str], folder: Path, subfolder: str | None = None):
        self.repo_id, self.commit, self.subfolder = repo_id, commit, subfolder
        self.folder = folder  # the cache's snapshot folder holding config.json (and the tokenizer)
        self.config = json.loads((folder / "config.json").read_text())
        self.files = weight_files(names)
        if not self.files:
            raise WeightsError(f"{repo_id}@{commit}: no *.safetensors or pytorch_model*.bin weights")
        self.bytes_read = 0
        self._held = HeldRanges()
        self._headers: dict[str, tuple[int, dict]] = {}
        self._where: dict[str, str] | None = None
        self._local: LocalSource | None = None

    @property
    def pickled(self) -> bool:
        return not self.files[0].endswith(".safetensors")

    def _path(self, name: str) -> str:
        return f"{self.subfolder}/{name}" if self.subfolder else name

    def _range(self, name: str, start: int, stop: int) -> bytes:
        """Bytes [start, stop) of the file, by one range request unless this source has moved them already."""
        return self._ranges(name, [(start, stop)])[0]

    def _ranges(self, name: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """Bytes [start, stop) of the file for each range: those this source has not moved yet by a range request
        each (a few at once), the others read back from where it holds them."""
        new = list(dict.fromkeys(r for r in ranges if (name, *r) not in self._held))
        with ThreadPoolExecutor(max_workers=min(RANGE_REQUESTS_AT_ONCE, len(new) or 1)) as pool:
            reads = dict(zip(new, pool.map(lambda r: self._fetch(name, *r), new), strict=True))
        for (start, stop), (data, moved) in reads.items():
            self._held.keep(name, start, stop, data)
            self.bytes_read += moved
        return [reads[r][0] if r in reads else self._held.read(name, *r) for r in ranges]

    def _fetch(self, name: str, start: int, stop: int) -> tuple[bytes, int]:
        """(bytes [start, stop) of the file, the bytes the request moved), by one range request."""
        from huggingface_hub import get_session, hf_hub_url
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

        url = hf_hub_url(self.repo_id, self._path(name), revision=self.commit)
        headers = build_hf_headers() | {"Range": f"bytes={start}-{stop - 1}"}
        response = get_session().get(url, headers=headers, follow_redirects=True)
        hf_raise_for_status(response)
        data = response.content
        if response.status_code != 206 and len(data) != stop - start:
            data = data[start:stop]  # a server that ignores ranges sent the whole file: counted as moved
        if len(data) != stop - start:
            raise WeightsError(f"{self.repo_id}@{self.commit}/{self._path(name)}: short read at bytes {start}-{stop}")
        return data, len(response.content)

    def header(self, name: str) -> tuple[int, dict]:
        """(offset of the tensors' bytes, the JSON header) of one safetensors file."""
        if name not in self._headers:
            (length,) = struct.unpack("<Q", self._range(name, 0, 8))
            self._headers[name] = (8 + length, json.loads(self._range(name, 8, 8 + length)))
        return self._headers[name]

    def _whole(self) -> LocalSource:
        """The pickled files downloaded whole into the cache, read as a local folder."""
        if self._local is None:
            from huggingface_hub import hf_hub_download

            print(
                f"weights: {self.repo_id}@{self.commit} holds pickled .bin files, which cannot be read in part: "
                "each is downloaded whole",
                file=sys.stderr,
            )
            for name in self.files:
                path = Path(hf_hub_download(self.repo_id, self._path(name), revision=self.commit))
                self.bytes_read += path.stat().st_size
            local = LocalSource(path.parent)
            local._said = True  # said here, once
            self._local = local
        return self._local

    def names(self) -> list[str]:
        if self.pickled:
            return self._whole().names()
        if self._where is None:
            self._where = {t: f for f in self.files for t in self.header(f)[1] if t != "__metadata__"}
        return sorted(self._where)

    def _tensor(self, name: str) -> tuple[str, int, dict]:
        """(its file, the offset of the file's tensor bytes, its header entry) of a tensor."""
        self.names()
        if name not in self._where:
            raise WeightsError(f"{self.repo_id}@{self.commit}: no tensor {name!r} in {', '.join(self.files)}")
        file = self._where[name]
        offset, header = self.header(file)
        info = header[name]
        if info["dtype"] not in DTYPES:
            raise WeightsError(f"{name}: safetensors dtype {info['dtype']} is not one of {sorted(DTYPES)}")
        return file, offset, info

    def get(self, name: str) -> torch.Tensor:
        if self.pickled:
            return self._whole().get(name)
        file, offset, info = self._tensor(name)
        start, stop = info["data_offsets"]
        return as_tensor(bytearray(self._range(file, offset + start, offset + stop)), info["dtype"], info["shape"])

    def row_ranges(self, name: str, spans) -> tuple[str, list[tuple[int, int]]]:
        """(its file, the byte ranges [start, stop) in the file) of rows [a, b) of each span of a matrix, spans that
        meet merged into one range."""
        file, offset, info = self._tensor(name)
        row = math.prod(info["shape"][1:]) * DTYPES[info["dtype"]].itemsize
        base = offset + info["data_offsets"][0]
        ranges: list[tuple[int, int]] = []
        for a, b in spans:
            start, stop = base + a * row, base + b * row
            if ranges and ranges[-1][1] == start:
                ranges[-1] = (ranges[-1][0], stop)
            elif stop > start:
                ranges.append((start, stop))
        return file, ranges

    def get_rows(self, name: str, spans) -> torch.Tensor:
        """Rows [a, b) of each span of a matrix, stacked: each span by its own range request (a few at once), never
        the whole matrix."""
        if self.pickled:
            tensor = self._whole().get(name)
            return torch.cat([tensor[a:b] for a, b in spans])
        file, ranges = self.row_ranges(name, spans)
        info = self._tensor(name)[2]
        rows = sum(b - a for a, b in spans)
        return as_tensor(bytearray(b"".join(self._ranges(file, ranges))), info["dtype"], [rows, *info["shape"][1:]])


def as_tensor(data: bytearray, dtype: str, shape) -> torch.Tensor:
    """A tensor over safetensors bytes of `dtype` (its name there)."""
    if not data:
        return torch.empty(shape, dtype=DTYPES[dtype])
    return torch.frombuffer(data, dtype=DTYPES[dtype]).reshape(shape)


def cached_snapshot(repo_id: str, revision: str, cache: str | Path) -> Path:
    """The cache's snapshot folder of `revision` (a commit, or a branch its refs/ name), as it is: a snapshot holding
    only the files fetch took (no other weight format, no README) is complete for the weights."""
    repo = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    root = repo / "snapshots" / commit
    if not root.is_dir():
        raise WeightsError(
            f"{repo_id}@{revision} is not in the local Hugging Face cache ({repo}) and HF_HUB_OFFLINE is set: fetch it "
            "once with the network, or unset HF_HUB_OFFLINE"
        )
    return root


def hub_source(ckpt: Checkpoint):
    """(source, tokenizer folder) of a Hub checkpoint: its weight files read in the cache where it holds them all for
    the commit, else by range reads; config.json and the tokenizer downloaded (small)."""
    from huggingface_hub import HfApi, constants, snapshot_download, try_to_load_from_cache

    from anisweep.checkpoints.fetch import branch_of

    revision = ckpt.commit or branch_of(ckpt.repo_id, ckpt.revision or "main")  # OLMo's step*-tokens*B patterns
    if getattr(
        constants, "is_offline_mode", lambda: constants.HF_HUB_OFFLINE
    )():  # the cache alone: the checkpoint's snapshot read in place
        root = cached_snapshot(ckpt.repo_id, revision, constants.HF_HUB_CACHE)
        folder = root / ckpt.subfolder if ckpt.subfolder else root
        tokenizer = next((p for p in (folder, root) if any((p / f).is_file() for f in TOKENIZER_FILES)), None)
        return LocalSource(folder), tokenizer
    info = HfApi().model_info(ckpt.repo_id, revision=revision)
    commit = info.sha
    sub = ckpt.subfolder
    names = [s.rfilename for s in info.siblings or []]
    inside = [n[len(sub) + 1 :] for n in names if n.startswith(f"{sub}/")] if sub else names
    files = weight_files(inside)
    small = (*SMALL_FILES, index_of(files)) if files else SMALL_FILES  # the shard index: the files to read
    wanted = [p for f in small for p in ((f"{sub}/{f}", f) if sub else (f,)) if p in names]
    root = Path(snapshot_download(ckpt.repo_id, revision=commit, allow_patterns=wanted))
    folder = root / sub if sub else root
    if not (folder / "config.json").is_file():
        raise WeightsError(f"{ckpt.key}: {ckpt.repo_id}@{commit} has no config.json{f' in {sub}/' if sub else ''}")
    if files and (gap := absent_in_folder(files, folder)):
        raise WeightsError(
            f"{ckpt.key}: {ckpt.repo_id}@{commit}: {gap}: it cannot be loaded (`anisweep audit` flags it incomplete)"
        )
    tokenizer = next((p for p in (folder, root) if any((p / f).is_file() for f in TOKENIZER_FILES)), None)
    cached = [try_to_load_from_cache(ckpt.repo_id, f"{sub}/{f}" if sub else f, revision=commit) for f in files]
    if files and all(isinstance(c, str) for c in cached):
        return LocalSource(Path(cached[0]).parent), tokenizer
    return HubSource(ckpt.repo_id, commit, inside, folder, sub), tokenizer
