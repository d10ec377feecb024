"""Where a run's worker listens: a socket in a folder only its user can open, named by the Snakemake process it
serves and by what the imports it holds depend on (interpreter, environment). Standard library
only: the client imports this before anything else."""

from __future__ import annotations

import hashlib
import os
import stat
import sys

OWNER_VARIABLE = "ANISWEEP_WORKER"

# Set by Snakemake for each job to the job's threads (snakemake/shell.py); the worker applies them to the forked
# job, so they do not make a worker of their own. Nor do the shell's bookkeeping and pytest's name of its test.
PER_JOB_VARIABLES = frozenset(
    {
        "OMP_NUM_THREADS",
        "GOTO_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "_",
        "SHLVL",
        "PWD",
        "OLDPWD",
        "PYTEST_CURRENT_TEST",
    }
)


class Unsafe(Exception):
    """The worker's folder is not this user's alone: no worker is used."""


OFF = ("off", "0", "false", "no")


def offer(environ=os.environ) -> bool:
    """Ask for a worker for the commands this process starts (it is their owner), unless the environment turns it
    off (ANISWEEP_WORKER=off) or already names a live owner: a run started inside another's, or by a test module
    that shares one worker among its many small runs, uses that owner's worker, which ends with that owner.
    Returns whether a worker is asked for."""
    if turned_off(environ):
        return False
    owner = owner_pid(environ)
    if owner is None or not alive(owner):
        environ[OWNER_VARIABLE] = str(os.getpid())
    return True


def turned_off(environ=os.environ) -> bool:
    """Whether the environment turns the worker off (ANISWEEP_WORKER=off, 0, false or no)."""
    return environ.get(OWNER_VARIABLE, "").strip().lower() in OFF


def alive(pid: int) -> bool:
    """Whether `pid` is a running process of this user's."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def owner_pid(environ=os.environ) -> int | None:
    """The pid of the Snakemake process that asked for a worker, or None (no worker)."""
    value = environ.get(OWNER_VARIABLE, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def folder() -> str:
    """This user's private folder for worker sockets, made with mode 0700 and refused (Unsafe) if it is anything
    but a folder this user owns that no one else can open."""
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    if len(base) > 40:  # a socket's path has at most 107 bytes
        base = "/tmp"
    path = os.path.join(base, f"anisweep-worker-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise Unsafe(f"{path} is not a folder of this user's that only it can open")
    return path


def fingerprint(environ=os.environ) -> str:
    """What a worker's imports depend on: the interpreter and the environment (less the per-job variables)."""
    digest = hashlib.sha256()
    for part in (sys.executable, repr(sys.flags)):
        digest.update(part.encode() + b"\0")
    for key in sorted(set(environ) - PER_JOB_VARIABLES):
        digest.update(f"{key}={environ[key]}".encode(errors="surrogateescape") + b"\0")
    return digest.hexdigest()[:16]


def socket_path(owner: int) -> str:
    return os.path.join(folder(), f"{owner}-{fingerprint()}.sock")
