"""The worker: imports what the commands need once, then forks a child per command handed to its socket.

`python -m anisweep.worker.server OWNER SOCKET`, started by the first client of a run (anisweep.worker.client).
One process, one thread, never running a tensor operation itself, so that a fork inherits no thread pool and no
lock held by another thread.
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import gc
import importlib
import marshal
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback

from anisweep.worker.client import FORWARDED

IDLE_SECONDS = 300  # with no job in flight and none asked for: the worker exits (its owner's end also ends it)
KILL_AFTER_SECONDS = 10  # a job whose client went away gets SIGTERM, then SIGKILL after this long
# glibc's malloc (mallopt(3)): blocks under MMAP_THRESHOLD come from the heap, and up to TRIM_THRESHOLD of free heap
# stays with the process. With the defaults, setting neither, a job's tensor temporaries of a few MB are handed
# back to the kernel when freed and fault their pages in again at the next allocation: a third of a weights job's
# CPU time and an eighth of a toy's training step went to those page faults.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest
TRIM_THRESHOLD = 128 << 20
PRELOAD = (
    "polars",  # first: its SIGINT handler is replaced before any job forks (preload)
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.conversion_mapping",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",  # weights, logit_lens: the checkpoint's tokenizer
    "transformers.models.bert.modeling_bert",  # the toys' architectures (and Pythia's, MultiBERTs')
    "transformers.models.gpt_neox.modeling_gpt_neox",
    "pyarrow.parquet",
    "scipy.stats",
    "matplotlib.pyplot",
    "anisweep.cli",
    "anisweep.checkpoints.fetch",
    "anisweep.checkpoints.catalogue",
    "anisweep.tangent.analysis",
    "anisweep.extract.run",
    "anisweep.measures.metrics",
    "anisweep.measures.sweep",
    "anisweep.weights.run",
    "anisweep.weights.lens",
    "anisweep.plots.sweep",
)


class Job:
    def __init__(self, pid: int, connection: socket.socket):
        self.pid, self.connection = pid, connection
        self.pidfd = os.pidfd_open(pid)
        self.kill_at: float | None = None


class Worker:
    """A listening socket, the owner it serves, and the jobs in flight."""

    def __init__(self, owner_fd: int, listener: socket.socket, path: str, lock):
        self.owner_fd, self.listener, self.path, self.lock = owner_fd, listener, path, lock
        self.jobs: dict[int, Job] = {}  # by pidfd
        self.clients: dict[int, Job] = {}  # by the fd of the client's connection, while it is connected
        self.idle_since = time.monotonic()

    @property
    def open(self) -> bool:
        return self.listener is not None

    def step(self, timeout: float) -> None:
        """Wait up to `timeout` s for a request, a job's end or the owner's, and handle what came."""
        watched = [*self.jobs, *self.clients] + ([self.listener, self.owner_fd] if self.open else [])
        ready, _, _ = select.select(watched, [], [], timeout)
        now = time.monotonic()
        if self.open and (self.owner_fd in ready or (not self.jobs and now - self.idle_since > IDLE_SECONDS)):
            self.close()
            return
        if self.open and self.listener in ready:
            inherited = [self.lock, self.listener, self.owner_fd, *self.jobs]
            job = _accept(self.listener, inherited + [job.connection for job in self.jobs.values()])
            if job is not None:
                self.jobs[job.pidfd] = self.clients[job.connection.fileno()] = job
        for fd in [fd for fd in ready if fd in self.clients]:
            job = self.clients.pop(fd)  # a client sends nothing after its request: this is its end
            _signal(job, signal.SIGTERM)
            job.kill_at = now + KILL_AFTER_SECONDS
        for fd in [fd for fd in ready if fd in self.jobs]:
            self.finish(self.jobs.pop(fd))
            self.idle_since = now
        for job in self.jobs.values():
            if job.kill_at is not None and now > job.kill_at:
                _signal(job, signal.SIGKILL)
                job.kill_at = None

    def finish(self, job: Job) -> None:
        self.clients.pop(job.connection.fileno(), None)
        _, status = os.waitpid(job.pid, 0)
        os.close(job.pidfd)
        _reply(job.connection, status)
        job.connection.close()

    def close(self) -> None:
        """Take no new job (those in flight finish and report)."""
        self.listener.close()
        os.unlink(self.path)
        os.close(self.owner_fd)
        self.listener = None


def serve(owner: int, path: str) -> None:
    lock = open(path[: -len(".sock")] + ".lock", "w")  # held for the worker's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # another worker serves this owner already
    try:
        owner_fd = os.pidfd_open(owner)
    except ProcessLookupError:
        return
    if os.path.exists(path):
        os.unlink(path)  # a dead worker's
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(previous)
    listener.listen(128)
    worker = Worker(owner_fd, listener, path, lock)
    keep_freed_memory()
    for module in PRELOAD:  # a job asked for meanwhile forks from what is imported so far
        preload(module)
        worker.step(0)
        if not worker.open:
            break
    # the imports' objects out of the collector's reach: a job's full collection would walk (and so copy, page by
    # page, from the worker) all of them, 0.4 CPU s, where the objects that are its own are few
    gc.freeze()
    while worker.open or worker.jobs:
        worker.step(1.0)


def keep_freed_memory() -> None:
    """Have malloc keep the memory a job frees for its next allocation (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD),
    where the C library has mallopt; the jobs, forks of this process, inherit the setting."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def _python_handles_sigint(_polars) -> None:
    """polars installs a SIGINT handler with SA_RESTART (pola-rs/polars#21739), under which a job blocked in a
    restartable call (opening a FIFO, reading a pipe, waitpid) sees its KeyboardInterrupt only once the call returns:
    Python's own handler again. A job gives up polars' Ctrl-C abort of a long query, which anisweep never runs."""
    signal.signal(signal.SIGINT, signal.getsignal(signal.SIGINT))


# What the worker does with a module once imported, so that its jobs never do it (or, for polars, undo it):
AFTER_IMPORT = {
    "polars": _python_handles_sigint,
    # the renamings table every model load reads, built (0.1 s) at the first
    "transformers.conversion_mapping": lambda module: module.get_checkpoint_conversion_mapping("bert"),
    "anisweep.cli": lambda module: module.parser(),  # every job parses its command line with it (cached)
}


def preload(module: str) -> None:
    if module == "matplotlib.pyplot":
        import matplotlib

        matplotlib.use("Agg")
    try:
        imported = importlib.import_module(module)
        if module in AFTER_IMPORT:
            AFTER_IMPORT[module](imported)
    except Exception:  # an optional module missing: a job that needs it fails on it itself, as it would have
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()


def _accept(listener: socket.socket, inherited) -> Job | None:
    """Take one request and fork its job; None where the peer is another user or the request is broken."""
    connection, _ = listener.accept()
    try:
        _, uid, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != os.getuid():
            connection.close()
            return None
        connection.settimeout(10)
        request, fds = _receive(connection)
        connection.settimeout(None)
    except (OSError, ValueError, EOFError, TypeError):  # marshal's errors for a payload that is not one
        connection.close()
        return None
    # a signal that reaches the child before its interpreter is ready would be lost (CPython forgets the signals it
    # caught but has not yet handled when it forks, and one raised in an at-fork hook is only printed): held until
    # _run_job takes it
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        pid = os.fork()
        if pid == 0:
            _run_job(request, fds, [*inherited, connection], mask)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for fd in fds:
        os.close(fd)
    job = Job(pid, connection)
    _reply(connection, pid)
    return job


def _receive(connection: socket.socket) -> tuple[dict, list[int]]:
    header, fds, _, _ = socket.recv_fds(connection, 4, 3)
    try:
        if len(fds) != 3:
            raise ValueError(f"expected 3 file descriptors, got {len(fds)}")
        return _request(connection, header), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _request(connection: socket.socket, header: bytes) -> dict:
    while len(header) < 4:
        more = connection.recv(4 - len(header))
        if not more:
            raise ValueError("the request ended early")
        header += more
    (size,) = struct.unpack("!I", header)
    payload = bytearray()
    while len(payload) < size:
        more = connection.recv(min(1 << 16, size - len(payload)))
        if not more:
            raise ValueError("the request ended early")
        payload += more
    request = marshal.loads(payload)  # from a process of this user's (SO_PEERCRED), the same interpreter
    if not isinstance(request, dict):
        raise ValueError(f"the request is a {type(request).__name__}, not a dict")
    return request


def _reply(connection: socket.socket, number: int) -> None:
    try:
        connection.sendall(b"%d\n" % number)
    except OSError:  # the client has gone: its end was or will be handled
        pass


def _signal(job: Job, number: int) -> None:
    try:
        os.kill(job.pid, number)
    except ProcessLookupError:
        pass


def _run_job(request: dict, fds: list[int], inherited, mask) -> None:
    """In the forked child: become the command's process, as `python -m anisweep ARGV` in the client's working
    directory, environment and standard streams; never returns."""
    status = 1
    try:
        for item in inherited:
            item.close() if hasattr(item, "close") else os.close(item)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal held since the fork is raised here, on its streams
        if sys.path and sys.path[0] == os.getcwd():  # `python -m` looks first where it was started
            sys.path[0] = request["cwd"]
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _apply_threads()
        sys.argv = [sys.argv[0], *request["argv"]]
        from anisweep.cli import main

        status = main(request["argv"])
    except SystemExit as error:
        status = error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
        if not isinstance(error.code, int | None):
            print(error.code, file=sys.stderr)
    except KeyboardInterrupt:  # as Python itself ends on one: the traceback, then death by SIGINT
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def _apply_threads() -> None:
    """Snakemake gives each job OMP_NUM_THREADS (its threads); torch read it when the worker imported it."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))


def main(owner: int, path: str) -> None:
    base = path[: -len(".sock")]
    try:
        serve(owner, path)
    finally:
        for leftover in (base + ".log", base + ".lock"):
            if leftover.endswith(".lock") or os.path.getsize(leftover) == 0:
                os.unlink(leftover)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
