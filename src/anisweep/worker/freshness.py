"""Whether the code a worker imported is still the code on disk: a job forked from a worker runs what the worker
imported, so a worker whose code has changed since forks no more jobs (anisweep.worker.server).

What is watched, stat-ed before each fork (about 170 paths, under a millisecond), as it was when the worker started,
before it imported any of the package's modules but its own:
- every file of the package itself (its modules and the data they read), by inode, size and modification time: an
  edit, a replacement or a removal of any is a change, whether the worker had imported that file yet or not;
- the folders installed packages live in (site-packages): installing, upgrading or removing a package changes its
  folder's entries. An edit inside an installed package's files goes unseen.
"""

from __future__ import annotations

import os
import site
from pathlib import Path


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def installed_packages_folders() -> list[str]:
    folders = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    return [folder for folder in folders if os.path.isdir(folder)]


class CodeOnDisk:
    """The package's files and the installed packages' folders as they were when the worker started."""

    def __init__(self, package_folder: Path):
        files = [p for p in package_folder.rglob("*") if "__pycache__" not in p.parts and p.is_file()]
        self.seen = {path: _identity(path) for path in [*map(str, files), *installed_packages_folders()]}

    def changed(self) -> str | None:
        """The first path that is not as it was, or None."""
        for path, identity in self.seen.items():
            if _identity(path) != identity:
                return path
        return None
