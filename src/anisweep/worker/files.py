"""A worker's files beside its socket, BASE.sock, BASE.lock and BASE.log (BASE = OWNER-FINGERPRINT in the
folder of anisweep.worker.address): the worker that holds BASE.lock owns all three. It removes them, the log only
where empty, when it stops taking jobs; a worker that starts removes those a dead worker left, of every owner
that has ended."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from anisweep.worker import address


def take(base: str):
    """BASE.lock, opened and locked, or None where a live worker holds it."""
    while True:
        lock = open(base + ".lock", "a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            return None
        try:
            current = os.stat(lock.name).st_ino == os.fstat(lock.fileno()).st_ino
        except FileNotFoundError:
            current = False
        if current:
            return lock
        lock.close()  # its holder removed it between our open and our lock: lock the file there now


def release(base: str, lock) -> None:
    """Remove the socket, the log where empty, and the lock, then let the lock go: the next worker makes its own."""
    Path(base + ".sock").unlink(missing_ok=True)
    try:
        if os.path.getsize(base + ".log") == 0:
            os.unlink(base + ".log")
    except FileNotFoundError:
        pass
    Path(lock.name).unlink(missing_ok=True)
    lock.close()


def log_to(base: str) -> None:
    """Write this process's output to BASE.log (its starter opened it, but that file may have been removed as a
    dead worker's since: then a new one)."""
    try:
        info, ours = os.stat(base + ".log"), os.fstat(2)
        if (info.st_dev, info.st_ino) == (ours.st_dev, ours.st_ino):
            return
    except FileNotFoundError:
        pass
    log = os.open(base + ".log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def remove_dead(folder: str) -> list[str]:
    """Remove the files of every worker that died (its lock free) serving an owner that has ended (no client of it
    will start another); returns their bases. A non-empty log stays: what it holds may be why its worker died."""
    removed = []
    for lock_path in sorted(Path(folder).glob("*.lock")):
        owner = lock_path.name.split("-", 1)[0]
        if not owner.isdigit() or address.alive(int(owner)):
            continue
        base = str(lock_path)[: -len(".lock")]
        lock = take(base)
        if lock is not None:
            release(base, lock)
            removed.append(base)
    return removed
