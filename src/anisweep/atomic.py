"""Atomic writes: a reader, or a run killed mid-write, never sees half a file under its real name.

Everything is written under a temporary name beside its destination (same folder, so same filesystem),
then renamed over it with ``os.replace`` (atomic on POSIX). The temporary name is hidden and ends in
``.tmp`` (``.qk.parquet.1a2b3c4d.tmp``), so that :func:`remove_orphans` finds what a killed run left; with
``keep_suffix=True`` it keeps the destination's extension after that (``.isotropy.png.1a2b3c4d.tmp.png``),
for writers that infer the format from the name (matplotlib).

Permissions follow the user's umask, as ``open()`` would give them: files ``0o666 & ~umask``, folders
``0o777 & ~umask`` (``tempfile.mkstemp``/``mkdtemp`` would leave ``0o600``/``0o700``, unreadable to
collaborators on a shared cluster). On any failure the temporary file or folder is removed and nothing is
left under the real name; an ``OSError`` (disk full, quota, permission) is re-raised naming the real path.

Imports nothing beyond the standard library, so the Snakefile and torch-free modules can use it.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["ORPHANS", "remove_orphans", "replacing", "write_bytes", "write_json", "write_text", "write_with"]

ORPHANS = (".*.tmp", ".*.tmp.*")  # the temporary names, as glob patterns


def _temporary_name(path: Path, keep_suffix: bool = False) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp{path.suffix if keep_suffix else ''}")


def _create(path: Path, directory: bool, keep_suffix: bool = False) -> Path:
    """A new, empty temporary file or folder beside `path`, with the umask's permissions."""
    while True:
        tmp = _temporary_name(path, keep_suffix)
        try:
            if directory:
                os.mkdir(tmp, 0o777)  # the kernel applies the umask
            else:
                os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return tmp
        except FileExistsError:  # pragma: no cover - 32 random bits collided
            continue


def remove_orphans(folder: str | os.PathLike, names: Iterable[str] | None = None) -> list[Path]:
    """Delete the temporary files and folders that writes killed midway left in `folder`; returns them. With
    `names`, only those of these files: other jobs may be writing theirs into the same folder right now."""
    patterns = ORPHANS if names is None else [f".{name}{p.removeprefix('.')}" for name in names for p in ORPHANS]
    found = sorted({p for pattern in patterns for p in Path(folder).glob(pattern)})
    for orphan in found:
        _remove(orphan)
    return found


def _remove(tmp: Path) -> None:
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def replacing(
    path: str | os.PathLike, *, directory: bool = False, keep_suffix: bool = False, fsync: bool = True
) -> Iterator[Path]:
    """Yield a temporary path to write `path`'s new content to; on success it replaces `path`.

    ``directory=True`` yields an empty folder instead (a Hugging Face checkpoint saved with
    ``save_pretrained``); an existing folder at `path` is swapped out and then deleted. ``fsync`` flushes a
    file's bytes to disk before the rename, so that even a power cut leaves the old or the new content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create(path, directory, keep_suffix)
    try:
        yield tmp
        if directory:
            _replace_directory(tmp, path)
        else:
            if fsync:
                _fsync(tmp)
            os.replace(tmp, path)
    except OSError as err:
        _remove(tmp)
        if err.errno is None:
            raise OSError(f"could not write {path}: {err}") from err
        raise OSError(err.errno, err.strerror or os.strerror(err.errno), str(path)) from err
    except BaseException as err:
        _remove(tmp)
        full = _disk_full(err)
        if full is not None:  # a writer (polars, pyarrow) that reports the OS error in its own exception
            raise OSError(full, os.strerror(full), str(path)) from err
        if isinstance(err, Exception):
            err.add_note(f"while writing {path} (nothing was written under that name)")
        raise


_FULL_MESSAGES = {
    errno.ENOSPC: ("no space left on device", "os error 28"),
    errno.EDQUOT: ("disk quota exceeded", "os error 122"),
}


def _disk_full(err: BaseException) -> int | None:
    text = str(err).lower()
    return next((code for code, says in _FULL_MESSAGES.items() if any(s in text for s in says)), None)


def _replace_directory(tmp: Path, path: Path) -> None:
    if not path.exists():
        os.replace(tmp, path)
        return
    old = _create(path, directory=True)
    os.replace(path, old)  # a folder cannot be renamed over a non-empty one: swap it out first
    try:
        os.replace(tmp, path)
    except BaseException:
        os.replace(old, path)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_with(writer: Callable[[Path], Any], path: str | os.PathLike) -> None:
    """Call ``writer(temporary_path)``, then move its file to `path` (for writers that take a path)."""
    with replacing(path) as tmp:
        writer(tmp)


def write_bytes(data: bytes, path: str | os.PathLike) -> None:
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def write_text(text: str, path: str | os.PathLike) -> None:
    """UTF-8 text."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(obj: Any, path: str | os.PathLike, *, indent: int | None = 2, **dumps: Any) -> None:
    """`obj` as JSON with a trailing newline; extra keyword arguments go to ``json.dumps`` (e.g. default=str)."""
    write_text(json.dumps(obj, indent=indent, **dumps) + "\n", path)


def copy_files(source: str | os.PathLike, names, out_dir: str | os.PathLike) -> None:
    """Copy the files `names` of folder `source` into `out_dir`, each written whole and then renamed."""
    import shutil

    for name in names:
        with replacing(Path(out_dir) / name) as tmp:
            shutil.copyfile(Path(source) / name, tmp)
