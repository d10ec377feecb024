"""The command's side of the worker: hand the command to the run's worker, starting it if need be, and take its
status. Standard library only, and few modules of it (no json, no subprocess unless a worker must be started): a
job's process costs some 40 ms of CPU on top of Python's own start, every one of a sweep's hundreds of jobs pays it.

The protocol: the client sends a 4-byte length, then the request (a marshalled dict: argv, cwd, env) with its
standard streams; the worker answers with two lines, each one decimal integer: the job's pid once it is forked,
then its wait status once it ends."""

from __future__ import annotations

import marshal
import os
import signal
import socket
import struct
import sys
import time

from anisweep.worker import address

CONNECT_SECONDS = 60  # for a worker just started to bind its socket (it imports after that, while jobs queue)
STARTS = 3  # workers a command starts at most while it waits for one to listen
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def run(argv: list[str]) -> int | None:
    """Run `anisweep argv` in the run's worker and return its exit status (a job killed by a signal kills this
    process with the same signal), or None where there is no worker to use: none was asked for, its owner has
    ended, or it could not be reached before the command started (then the caller runs the command itself)."""
    owner = address.owner_pid()
    if owner is None or not address.alive(owner):  # a worker started for an ended owner would exit at once
        return None
    try:
        path = address.socket_path(owner)
        connection = _connect(path, owner)
    except (OSError, address.Unsafe):
        return None
    if connection is None:
        return None
    with connection:
        reply = connection.makefile("rb")
        try:
            _send(connection, argv)
            started = reply.readline()
        except OSError:
            return None
        if not started:  # the worker closed before forking: nothing ran
            return None
        job = int(started)
        for sig in FORWARDED:
            signal.signal(sig, lambda number, _frame: _forward(job, number))
        finished = reply.readline()  # a forwarded signal's handler runs and the read resumes (PEP 475)
    if not finished:  # the job dies with it (anisweep.worker.server)
        print(f"anisweep: the worker ended while running job {job}, which was killed with it", file=sys.stderr)
        return 1
    return _exit_status(int(finished))


def _connect(path: str, owner: int) -> socket.socket | None:
    """A connection to the worker at `path`, starting one where none listens, and again where the one started
    ended without listening (it found another holding the path, which then stopped taking jobs: its code changed)."""
    started, starts = None, 0
    deadline = time.monotonic() + CONNECT_SECONDS
    while True:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(path)
            return connection
        except (FileNotFoundError, ConnectionRefusedError):
            connection.close()
        if starts < STARTS and (started is None or started.poll() is not None):
            started, starts = _start(path, owner), starts + 1
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)


def _start(path: str, owner: int):
    """Start a worker for `owner` at `path` (one that finds another already there exits at once)."""
    import subprocess

    with open(path[: -len(".sock")] + ".log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "anisweep.worker.server", str(owner), path],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )


def _send(connection: socket.socket, argv: list[str]) -> None:
    """The command, its working directory and environment, and this process's standard streams."""
    payload = marshal.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)})
    socket.send_fds(connection, [struct.pack("!I", len(payload))], [0, 1, 2])
    connection.sendall(payload)


def _forward(job: int, number: int) -> None:
    try:
        os.kill(job, number)
    except ProcessLookupError:
        pass


def _exit_status(status: int) -> int:
    """The job's wait status as this process's own: its exit code, or death by its signal."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        return 128 + number
    return os.waitstatus_to_exitcode(status)
