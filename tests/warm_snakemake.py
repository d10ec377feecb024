"""Snakemake dry runs without a Python start each: `dry_run(command)` runs a `python -m snakemake ...` command
line in a fork of a warm process that imported Snakemake and the modules the Snakefile imports, once per test
session (`python tests/warm_snakemake.py` reads a request a line, forks, waits and answers the exit status).
Each run still has its own process, working directory, environment, standard streams and exit status, and
parses the Snakefile afresh; only the imports are shared.

Standard library only, so that the warm process imports nothing of the tests' own (torch, transformers).
A dry run schedules jobs and runs none, so no job ever runs in a fork of this process.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import subprocess
import sys
import tempfile
import traceback

PRELOAD = [
    "snakemake.cli",
    "snakemake.settings.types",
    "snakemake.utils",
    "anisweep.config",
    "anisweep.code_inputs",
    "anisweep.checkpoints.catalogue",
    "anisweep.checkpoints.identity",
    "anisweep.checkpoints.sweep_audit",
    "anisweep.checkpoints.audit",
    "anisweep.checkpoints.config_checks",
    "anisweep.checkpoints.local",
    "anisweep.adapters",
    "anisweep.checkpoints.hub_repo",
    "anisweep.checkpoints.preflight",
    "anisweep.measures.partial",
    "anisweep.measures.registry",
    "anisweep.measures.stale",
    "anisweep.plots.sweep",
    "anisweep.plots.untrained",
    "anisweep.plots.spectra",
    "anisweep.plots.survey",
    "anisweep.mechanism",
    "anisweep.mechanism.qk_svd",
    "anisweep.media",
    "anisweep.tables",
    "anisweep.worker.address",
]

_server: subprocess.Popen | None = None
_server_env: dict | None = None  # the environment it started in, which its imports read


def forkserver_pid() -> int | None:
    """The warm process's pid once started (its CPU time and its reaped forks' are the dry runs' cost)."""
    return _server.pid if _server is not None and _server.poll() is None else None


def dry_run(command: list[str], timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)` for a command
    `[sys.executable, "-m", "snakemake", ...]` that plans and runs no job (a dry run, or one that stops on bad
    input)."""
    global _server, _server_env
    assert command[:3] == [sys.executable, "-m", "snakemake"], command
    env = dict(os.environ if env is None else env)
    if forkserver_pid() is None or _imports_read(env) != _server_env:
        if forkserver_pid() is not None:
            _server.kill()
            _server.wait()
        _server, _server_env = (
            subprocess.Popen(
                [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env
            ),
            _imports_read(env),
        )
    with tempfile.TemporaryDirectory(prefix="dry-run-") as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        request = {"argv": command[3:], "cwd": os.getcwd(), "env": env}
        _server.stdin.write(json.dumps({**request, "out": out, "err": err}) + "\n")
        _server.stdin.flush()
        ready, _, _ = select.select([_server.stdout], [], [], timeout)
        if not ready:
            _server.kill()  # and its fork with it: the next dry run starts another
            _server.wait()
            raise subprocess.TimeoutExpired(command, timeout)
        status = json.loads(_server.stdout.readline())["status"]
        with open(out) as stdout, open(err) as stderr:
            return subprocess.CompletedProcess(command, status, stdout.read(), stderr.read())


def _imports_read(env: dict) -> dict:
    """The environment that imports may read (HF_HOME, PYTHONPATH): all but pytest's name of the current test."""
    return {key: value for key, value in env.items() if key != "PYTEST_CURRENT_TEST"}


def serve() -> None:
    for module in PRELOAD:
        importlib.import_module(module)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _snakemake(request)
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
        sys.stdout.flush()


def _snakemake(request: dict) -> None:
    """In the fork: the command's streams, directory and environment, then Snakemake's command line; never
    returns."""
    status = 1
    try:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for target, path in ((1, request["out"]), (2, request["err"])):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [sys.argv[0], *request["argv"]]
        from snakemake.cli import main

        main(request["argv"])
        status = 0
    except SystemExit as error:
        status = error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


if __name__ == "__main__":
    serve()
