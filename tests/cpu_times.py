"""`pytest -p cpu_times --cpu-times FILE`: each test's CPU seconds (this process and every process it started,
user + system, setup and teardown included) as JSON lines in FILE, to compare test costs on a shared machine,
where wall time says more about the neighbours than about the test.

Under pytest-xdist (the default: -n auto) each worker records the tests it runs, in its own process, and appends
whole lines to FILE; the sum over FILE is the suite's CPU time (the workers' start-up and collection left out),
comparable with a serial run's (`-n 0`).

The warm process of tests/warm_snakemake.py counts with its dry runs. Processes that outlive their parent (a
run's warm worker, started by its first job) are reparented to pytest (a child subreaper) and reaped after each
test phase, so that their CPU time counts too.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import resource
import subprocess
import sys
import time

import pytest

PR_SET_CHILD_SUBREAPER = 36


def pytest_addoption(parser):
    parser.addoption("--cpu-times", metavar="FILE", help="write each test's CPU seconds (with children) to FILE")


def pytest_configure(config):
    path = config.getoption("--cpu-times")
    if path:
        config.pluginmanager.register(CpuTimes(path), "cpu-times-recorder")


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + forkserver_seconds()


def forkserver_seconds() -> float:
    """The warm dry-run process's CPU time and that of the forks it has reaped (tests/warm_snakemake.py)."""
    warm = sys.modules.get("warm_snakemake")
    pid = warm and warm.forkserver_pid()
    if not pid:
        return 0.0
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime, stime, cutime, cstime


def reap_orphans() -> None:
    """Reap the exited processes adopted as subreaper; leave those a live Popen object still waits for."""
    while True:
        try:
            found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if found is None:
            return
        owned = {o.pid for o in gc.get_objects() if isinstance(o, subprocess.Popen) and o.returncode is None}
        if found.si_pid in owned:
            return
        os.waitpid(found.si_pid, 0)


class CpuTimes:
    def __init__(self, path: str):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self.out = open(path, "a")  # open for the session

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        reap_orphans()
        cpu, wall = cpu_seconds(), time.monotonic()
        yield
        reap_orphans()
        record = {"test": item.nodeid, "cpu": round(cpu_seconds() - cpu, 3), "wall": round(time.monotonic() - wall, 3)}
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()
