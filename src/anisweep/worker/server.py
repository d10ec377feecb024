"""The worker: imports what the commands need once, then forks a child per command handed to its socket.

`python -m anisweep.worker.server OWNER SOCKET`, started by the first client of a run (anisweep.worker.client).
One process, one thread, never running a tensor operation itself, so that a fork inherits no thread pool and no
lock held by another thread.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import importlib
import math
import os
import select
import signal
import socket
import struct
import sys
import time
import traceback
from pathlib import Path

from anisweep.worker import files
from anisweep.worker.client import FORWARDED
from anisweep.worker.freshness import CodeOnDisk
from anisweep.worker.incoming import Broken, Request

IDLE_SECONDS = 300  # with no job in flight and none asked for: the worker exits (its owner's end also ends it)
REQUEST_SECONDS = 60  # for a client's request to arrive whole once it has connected; other clients are served meanwhile
KILL_AFTER_SECONDS = 10  # a job whose client went away gets SIGTERM, then SIGKILL after this long
# glibc's malloc (mallopt(3)): blocks under MMAP_THRESHOLD come from the heap, and up to TRIM_THRESHOLD of free heap
# stays with the process. With the defaults, setting neither, a job's tensor temporaries of a few MB are handed
# back to the kernel when freed and fault their pages in again at the next allocation: a third of a weights job's
# CPU time and an eighth of a toy's training step went to those page faults.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest
TRIM_THRESHOLD = 128 << 20
PR_SET_PDEATHSIG = 1  # prctl(2)
LIBC = ctypes.CDLL(None, use_errno=True)
PACKAGE_FOLDER = Path(__file__).resolve().parents[1]
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
    """A listening socket, the owner it serves, the requests being read and the jobs in flight."""

    def __init__(self, owner_fd: int, listener: socket.socket, base: str, lock, code: CodeOnDisk):
        self.owner_fd, self.listener, self.base, self.lock, self.code = owner_fd, listener, base, lock, code
        self.requests: dict[int, Request] = {}  # by the fd of the client's connection, until the request is whole
        self.jobs: dict[int, Job] = {}  # by pidfd
        self.clients: dict[int, Job] = {}  # by the fd of the client's connection, while it is connected
        self.idle_since = time.monotonic()

    @property
    def open(self) -> bool:
        return self.listener is not None

    def step(self, timeout: float) -> None:
        """Wait up to `timeout` s for a connection, a request's bytes, a job's end or the owner's, and handle what
        came; no client waits for another's request."""
        poller = select.poll()
        for fd in [*self.jobs, *self.clients, *self.requests] + (
            [self.listener.fileno(), self.owner_fd] if self.open else []
        ):
            poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(math.ceil(timeout * 1000))}
        # what each ready descriptor was before any is handled: handling one closes some and opens others, and a
        # number closed can come back as another's within this step
        ended = [self.jobs[fd] for fd in ready if fd in self.jobs]
        gone = [self.clients[fd] for fd in ready if fd in self.clients]
        arrived = [self.requests[fd] for fd in ready if fd in self.requests]
        now = time.monotonic()
        if self.open and (self.owner_fd in ready or (not self.jobs and now - self.idle_since > IDLE_SECONDS)):
            self.close()
            return
        for job in gone:  # a client sends nothing after its request: this is its end
            del self.clients[job.connection.fileno()]
            _signal(job, signal.SIGTERM)
            job.kill_at = now + KILL_AFTER_SECONDS
        for job in ended:
            self.finish(job)
            self.idle_since = now
        for job in self.jobs.values():
            if job.kill_at is not None and now > job.kill_at:
                _signal(job, signal.SIGKILL)
                job.kill_at = None
        for request in arrived:
            if self.requests.get(request.fileno()) is request:  # not dropped meanwhile (a close drops them all)
                self.read(request)
        for request in [r for r in self.requests.values() if now > r.deadline]:
            self.drop(request)
        if self.open and self.listener.fileno() in ready:
            self.accept(now)

    def accept(self, now: float) -> None:
        """Take every connection waiting, from this user's processes only."""
        while True:
            try:
                connection, _ = self.listener.accept()
            except BlockingIOError:
                return
            try:
                _, uid, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            except OSError:
                uid = None
            if uid != os.getuid():
                connection.close()
                continue
            self.requests[connection.fileno()] = Request(connection, now + REQUEST_SECONDS)

    def read(self, request: Request) -> None:
        """Read what a client has sent; once its request is whole, start its job."""
        try:
            command = request.read()
        except (Broken, OSError):  # answered by closing the connection, without a job
            self.drop(request)
            return
        if command is None:
            return
        del self.requests[request.fileno()]
        if self.code.changed() is not None:
            # a fork would run the code as it was when imported: the client runs the command in its own process,
            # and the next one starts a worker that imports the code as it is now
            request.close()
            self.close()
            return
        held = [self.lock, self.listener, self.owner_fd, *self.jobs, *self.requests.values()]
        job = _fork(request, command, held + [job.connection for job in self.jobs.values()])
        self.jobs[job.pidfd] = self.clients[job.connection.fileno()] = job

    def drop(self, request: Request) -> None:
        del self.requests[request.fileno()]
        request.close()

    def finish(self, job: Job) -> None:
        del self.jobs[job.pidfd]
        self.clients.pop(job.connection.fileno(), None)
        _, status = os.waitpid(job.pid, 0)
        os.close(job.pidfd)
        _reply(job.connection, status)
        job.connection.close()

    def close(self) -> None:
        """Take no new job (those in flight finish and report), and leave the socket's path to the next worker."""
        files.release(self.base, self.lock)
        self.listener.close()
        self.listener = self.lock = None
        os.close(self.owner_fd)
        for request in list(self.requests.values()):
            self.drop(request)


def serve(owner: int, path: str) -> None:
    base = path[: -len(".sock")]
    lock = files.take(base)
    if lock is None:
        return  # another worker serves this owner already
    try:
        owner_fd = os.pidfd_open(owner)
    except ProcessLookupError:
        files.release(base, lock)
        return
    try:
        files.log_to(base)
        files.remove_dead(os.path.dirname(path))
        code = CodeOnDisk(PACKAGE_FOLDER)  # before the worker imports any of the package's modules but its own
        listener = _listen(path)
    except BaseException:
        files.release(base, lock)
        os.close(owner_fd)
        raise
    worker = Worker(owner_fd, listener, base, lock, code)
    try:
        keep_freed_memory()
        for module in PRELOAD:  # a job asked for meanwhile forks from what is imported so far
            preload(module)
            worker.step(0)
            if not worker.open:
                break
        # the imports' objects out of the collector's reach: a job's full collection would walk (and so copy, page
        # by page, from the worker) all of them, 0.4 CPU s, where the objects that are its own are few
        gc.freeze()
        while worker.open or worker.jobs:
            worker.step(1.0)
    finally:
        if worker.open:
            worker.close()


def _listen(path: str) -> socket.socket:
    """A socket at `path` that only this user can connect to, taking no request until asked."""
    try:
        os.unlink(path)  # a dead worker's
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(previous)
    listener.listen(128)
    listener.setblocking(False)
    return listener


def keep_freed_memory() -> None:
    """Have malloc keep the memory a job frees for its next allocation (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD),
    where the C library has mallopt; the jobs, forks of this process, inherit the setting."""
    mallopt = getattr(LIBC, "mallopt", None)
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


def _fork(request: Request, command: dict, held) -> Job:
    """Fork the job of a whole request, tell its client the job's pid, and hand the client's streams to the job."""
    # a signal that reaches the child before its interpreter is ready would be lost (CPython forgets the signals it
    # caught but has not yet handled when it forks, and one raised in an at-fork hook is only printed): held until
    # _run_job takes it
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    worker = os.getpid()
    try:
        pid = os.fork()
        if pid == 0:
            _run_job(command, request.fds, [*held, request.connection], mask, worker)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for fd in request.fds:
        os.close(fd)
    job = Job(pid, request.connection)
    _reply(request.connection, pid)
    return job


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


def _run_job(request: dict, fds: list[int], inherited, mask, worker: int) -> None:
    """In the forked child: become the command's process, as `python -m anisweep ARGV` in the client's working
    directory, environment and standard streams, for as long as the worker lives; never returns."""
    status = 1
    try:
        _die_with(worker)
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


def _die_with(worker: int) -> None:
    """Have the kernel kill this job when the worker dies (PR_SET_PDEATHSIG): its client has then reported it
    failed, and a job left running would go on writing its outputs under the next run."""
    if LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != worker:  # it died before the call: no signal will come
        os.kill(os.getpid(), signal.SIGKILL)


def _apply_threads() -> None:
    """Snakemake gives each job OMP_NUM_THREADS (its threads); torch read it when the worker imported it."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2])
