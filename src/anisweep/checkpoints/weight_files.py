"""The bytes a checkpoint's analysis read: the weight files' sha256, taken by extract right before it loads them,
and proof that the files did not change until the model was loaded.

``weights_sha256`` is a sha256 over the weight files' bytes (sorted by name, streamed in 1 MiB chunks), and
``weight_files_sha256`` the sha256 of each file (the Hub's LFS oid), from the same single read. extract writes
them into extract.json's ``checkpoint`` section, where :func:`anisweep.measures.sweep.find_duplicates` reads them
to flag steps serving the same weights as another step. They are extract's, not fetch's: a checkpoint folder
re-saved after its fetch (a local run written again, then ``--rerun-incomplete``) is hashed as it is analysed.
The known Pythia defects come in two shapes: a whole checkpoint that is another step's (pythia-2.8b: the early
branches serve final-era files, EleutherAI/pythia#205, #195) and ONE shard of a sharded checkpoint that is
another step's (pythia-12b step50000/step58000 serve the final model's first shard, #206): the combined hash
alone misses the second, the per-file hashes catch it.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHUNK = 1 << 20  # 1 MiB
_SHA256 = re.compile(r"[0-9a-f]{64}")


class WeightFilesChanged(RuntimeError):
    """A weight file changed between its hash and the model's load: the analysis would not be of the hashed bytes."""


def hash_weight_files(folder: Path, names: Iterable[str]) -> tuple[str, dict[str, str]]:
    """``(combined, {name: sha256})``: sha256 over the bytes of ``folder/name`` for the names in sorted order,
    and each file's own sha256, from one streamed read (1 MiB chunks) of every file."""
    combined = hashlib.sha256()
    per_file: dict[str, str] = {}
    for name in sorted(names):
        own = hashlib.sha256()
        with open(Path(folder) / name, "rb") as f:
            while chunk := f.read(CHUNK):
                combined.update(chunk)
                own.update(chunk)
        per_file[name] = own.hexdigest()
    return combined.hexdigest(), per_file


def hub_sha256(path: Path, folder: Path | None = None) -> str | None:
    """The sha256 the Hub gave a downloaded LFS file, without reading it: the name of the cache blob it links to,
    else the etag huggingface_hub recorded beside a download folder (``folder/.cache/huggingface/download/``);
    None for a file of neither (a local run's)."""
    blob = Path(os.path.realpath(path))
    if _SHA256.fullmatch(blob.name):
        return blob.name
    if folder is not None:
        record = Path(folder) / ".cache" / "huggingface" / "download" / f"{Path(path).name}.metadata"
        try:
            lines = record.read_text().splitlines()
        except OSError:
            return None
        etag = lines[1].strip().strip('"') if len(lines) > 1 else ""
        return etag if _SHA256.fullmatch(etag) else None
    return None


def hash_files(folder: Path, names: Iterable[str]) -> str:
    """sha256 over the bytes of ``folder/name`` for the names in sorted order, streamed in 1 MiB chunks."""
    return hash_weight_files(folder, names)[0]


def _stats(folder: Path, names: Iterable[str]) -> dict[str, tuple[int, int, int]]:
    """Each file's size, modification time and inode (through links: a Hub snapshot's files link to blobs)."""
    out = {}
    for name in names:
        st = os.stat(folder / name)
        out[name] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


@dataclass(frozen=True)
class WeightFiles:
    """The weight files `from_pretrained` loads from `folder`, as they were when hashed."""

    folder: Path
    stats: dict[str, tuple[int, int, int]]
    sha256: str
    files_sha256: dict[str, str]

    @classmethod
    def read(cls, folder: str | Path) -> WeightFiles:
        """Hash the folder's weight files (the format `from_pretrained` picks: anisweep.checkpoints.fetch), their
        sizes and times taken first, so that a change during the read is caught too. A file the Hub named by its
        sha256 (a cache blob, a download's etag) whose bytes hash otherwise is a HashMismatch naming it."""
        from anisweep.checkpoints.files import weight_files_in

        folder = Path(folder)
        try:
            names = weight_files_in(folder)
        except ValueError as error:
            raise ValueError(f"checkpoint folder {folder}: {error}") from None
        stats = _stats(folder, names)
        combined, per_file = hash_weight_files(folder, names)
        named = {name: hub_sha256(folder / name, folder) for name in names}
        expected = {name: sha for name, sha in named.items() if sha is not None}
        if expected:  # the bytes read are those the Hub named (which fetch checked against the audit of the grid)
            check_hashes(per_file, expected, str(folder), "read")
        return cls(folder, stats, combined, per_file)

    def check_unchanged(self, where: str) -> None:
        """A WeightFilesChanged naming the files whose size, time or inode changed since :meth:`read`."""
        now = {}
        for name in self.stats:
            try:
                now[name] = _stats(self.folder, [name])[name]
            except FileNotFoundError:
                now[name] = None
        changed = sorted(name for name, stat in self.stats.items() if now[name] != stat)
        if changed:
            raise WeightFilesChanged(
                f"{where}: {', '.join(changed)} in {self.folder} changed while extract read the weights (another "
                "process is writing the checkpoint): the tables would not be of the hashed bytes; run extract "
                "again once the checkpoint is saved"
            )

    def manifest(self) -> dict[str, Any]:
        """extract.json's record of the bytes read: the files, their hashes and their total size."""
        return {
            "weight_files": sorted(self.stats),
            "weights_sha256": self.sha256,
            "weight_files_sha256": self.files_sha256,
            "weights_bytes": sum(size for size, _, _ in self.stats.values()),
        }


class HashMismatch(RuntimeError):
    """A weight file's bytes (or the Hub's name for them) are not those the audit listed."""


def check_hashes(found: Mapping[str, str | None], expected: Mapping[str, str], where: str, what: str) -> None:
    """A HashMismatch naming every file whose sha256 in ``found`` differs from the audit's."""
    wrong = [
        f"{name} ({what} {found[name][:12]}, audit {sha[:12]})"
        for name, sha in sorted(expected.items())
        if found.get(name) not in (None, sha)
    ]
    if wrong:
        raise HashMismatch(
            f"{where}: {', '.join(wrong)}: not the bytes the audit of the grid listed (the branch was pushed again "
            "since, or the download is corrupt): run `anisweep audit` for the model again, then the sweep"
        )
