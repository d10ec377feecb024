"""A one-node SLURM cluster for the tests, on this very machine.

:func:`ensure_installed` installs Debian's ``slurmctld slurmd slurm-client munge`` with apt-get when they are
missing; :func:`start` writes ``/etc/slurm/slurm.conf`` (it has to be there, not behind ``$SLURM_CONF``:
the executor plugin strips every ``SLURM_*`` variable before the ``srun`` inside a job), starts ``munged``
(unless a working one already answers), ``slurmctld`` and ``slurmd`` in the foreground as children of this
process, and waits until the node is idle. :meth:`Cluster.stop` cancels what is left in the queue and stops
the daemons it started, by PID.

The cluster: accounting off (``accounting_storage/none``, so ``sacct`` does not work and the executor plugin
has to poll with ``squeue``), ``proctrack/linuxproc`` and ``task/none`` (no cgroups needed), ``cons_tres``
with cores and memory as consumable resources, ``SlurmUser=root`` (jobs run as the user who submits them,
root here), one partition ``debug`` holding the one node, named after this host and reached at 127.0.0.1
(so the host name need not resolve). Everything else (state, spool, logs, PID files) lives under
:data:`BASE` and is wiped at each start. One cluster per machine: a session holds :data:`LOCK` (an flock,
released when its process ends) while its cluster runs, and a second session waits for it; daemons left
behind by a killed session are found through their PID files and stopped at the next start.

Reuse::

    from slurm_cluster import slurm_cluster  # session-scoped fixture: a running Cluster, or a skip

(tests/conftest.py does this for the suite).

``python tests/slurm_cluster.py start|stop`` does the same by hand (``stop`` ends the daemons recorded in
``BASE/*.pid`` by an earlier ``start``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["Cluster", "SlurmUnavailable", "ensure_installed", "start", "slurm_cluster"]

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel", "munge", "unmunge")
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

SLURM_CONF = Path("/etc/slurm/slurm.conf")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_RUN = Path("/run/munge")
BASE = Path("/var/lib/anisweep-slurm")  # state, spool, logs and PID files of the test cluster
LOCK = Path("/var/lib/anisweep-slurm.lock")  # held while a test session runs the cluster
MARKER = "# Written by anisweep tests/slurm_cluster.py: a one-node test cluster; rewritten at each start."
PARTITION = "debug"


class SlurmUnavailable(RuntimeError):
    """SLURM cannot be installed or started here (not root, no apt-get, a foreign config): skip, with why."""


def _which(name: str) -> str | None:
    return shutil.which(name, path=os.environ.get("PATH", "") + os.pathsep + SBIN_PATH)


def _missing() -> list[str]:
    return [name for name in (*DAEMONS, *CLIENTS) if _which(name) is None]


def _run(cmd: list[str], timeout: float = 60, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": os.environ.get("PATH", "") + os.pathsep + SBIN_PATH}
    if "input" not in kwargs:
        kwargs["stdin"] = subprocess.DEVNULL
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check, env=env, **kwargs)


def ensure_installed(log=print) -> float:
    """Install the Debian packages if a daemon or client is missing; returns the seconds it took (0 if none).

    Idempotent: does nothing when everything is on PATH. Raises :class:`SlurmUnavailable` only when it cannot
    install (not root, no apt-get); a failing apt-get is an error, not a skip.
    """
    missing = _missing()
    if not missing:
        return 0.0
    if os.geteuid() != 0:
        raise SlurmUnavailable(f"SLURM is not installed ({', '.join(missing)} missing) and this is not root")
    if _which("apt-get") is None:
        raise SlurmUnavailable(f"SLURM is not installed ({', '.join(missing)} missing) and there is no apt-get")
    t0 = time.monotonic()
    log(f"slurm_cluster: installing {' '.join(PACKAGES)} with apt-get ({', '.join(missing)} missing)")
    env = {
        **os.environ,
        "DEBIAN_FRONTEND": "noninteractive",
        "PATH": os.environ.get("PATH", "") + os.pathsep + SBIN_PATH,
    }
    # Keep the packages' postinst scripts from starting the daemons themselves (we start them, as children):
    # a policy-rc.d that denies every start, only for the install, unless the machine already has one.
    policy = Path("/usr/sbin/policy-rc.d")
    own_policy = not policy.exists()
    if own_policy:
        policy.write_text("#!/bin/sh\n# anisweep tests/slurm_cluster.py, during apt-get install only\nexit 101\n")
        policy.chmod(0o755)
    try:
        for cmd in (
            ["apt-get", "-o", "DPkg::Lock::Timeout=300", "update", "-q"],
            ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-q", "--no-install-recommends", *PACKAGES],
        ):
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
                )
    finally:
        if own_policy:
            policy.unlink(missing_ok=True)
    still = _missing()
    if still:
        raise RuntimeError(f"apt-get installed {' '.join(PACKAGES)} but {', '.join(still)} are still missing")
    seconds = time.monotonic() - t0
    log(f"slurm_cluster: installed in {seconds:.1f} s")
    return seconds


def _node_line() -> tuple[str, str]:
    """(node name, the NodeName line for slurm.conf) from what slurmd itself detects (``slurmd -C``)."""
    out = _run([_which("slurmd"), "-C"]).stdout
    line = next(line for line in out.splitlines() if line.startswith("NodeName="))
    fields = dict(item.split("=", 1) for item in line.split())
    node = socket.gethostname().split(".")[0] or fields["NodeName"]
    fields["NodeName"] = node
    # A little under what slurmd reports, so that a few MB of drift never drains the node ("Low RealMemory").
    fields["RealMemory"] = str(max(int(int(fields.get("RealMemory", "1024")) * 0.95), 512))
    line = " ".join(f"{k}={v}" for k, v in fields.items())
    return node, f"{line} NodeAddr=127.0.0.1 NodeHostname={node} State=UNKNOWN"


def slurm_conf(node: str, node_line: str) -> str:
    return f"""{MARKER}
ClusterName=anisweep
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation={BASE}/ctld
SlurmdSpoolDir={BASE}/spool
SlurmctldPidFile={BASE}/slurmctld.pid
SlurmdPidFile={BASE}/slurmd.pid
SlurmctldLogFile={BASE}/slurmctld.log
SlurmdLogFile={BASE}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: track job processes through /proc and bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# No accounting: sacct and sacctmgr fail, squeue is the only status source.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
# Finished jobs stay visible to squeue and scontrol this long: the plugin needs >= 3 x its first status-check
# delay, and test_slurm reads every job's record once the whole sweep is done (over 10 minutes on a busy machine).
MinJobAge=3600
ReturnToService=2
KillWait=5
InactiveLimit=0
{node_line}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class Cluster:
    node: str
    partition: str = PARTITION
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    reused_munged: bool = False
    installed_s: float = 0.0  # apt-get, when it had to run
    started_s: float = 0.0
    lock_fd: int | None = None

    def log_tail(self, name: str = "slurmctld", lines: int = 40) -> str:
        path = BASE / f"{name}.log"
        if not path.exists():
            return f"({path} does not exist)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def controller_log(self) -> str:
        path = BASE / "slurmctld.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def squeue(self) -> str:
        return _run(["squeue", "--states=all", "--noheader", "--format=%i|%j|%T|%k"], check=False).stdout

    def stop(self, log=print) -> None:
        """Cancel every job still known, then end the daemons this process started, by PID."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            _run(["scancel", "--user", "root"], check=False, timeout=30)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                states = _run(["squeue", "--noheader", "--format=%T"], check=False, timeout=30).stdout.split()
                if not any(s in ("RUNNING", "COMPLETING", "PENDING", "CONFIGURING") for s in states):
                    break
                time.sleep(1)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            _stop_pid(proc.pid, proc)
            (BASE / f"{name}.pid").unlink(missing_ok=True)
            log(f"slurm_cluster: stopped {name} (pid {proc.pid})")
        remove_conf()
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # releases the flock
            self.lock_fd = None


def remove_conf() -> None:
    """Remove the slurm.conf start() wrote (never another): left behind, it names a controller that no longer
    runs, and every `scontrol` (the SLURM executor plugin runs one whenever Snakemake imports it) waits 10 s."""
    if SLURM_CONF.is_file() and SLURM_CONF.read_text(errors="replace").startswith(MARKER):
        SLURM_CONF.unlink()


def _lock(log=print, timeout: float = 900) -> int:
    """One test cluster per machine: wait for another session's to stop (its lock dies with its process)."""
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise RuntimeError(
                    f"another session has held {LOCK} (its test SLURM cluster) for {timeout:.0f} s"
                ) from None
            log(f"slurm_cluster: waiting for another session's test cluster ({LOCK})")
            time.sleep(5)


def _stop_pid(pid: int, proc: subprocess.Popen | None = None, timeout: float = 15) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None:
            if proc.poll() is not None:
                return
        elif not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if proc is not None:
        proc.wait(timeout=10)


def _stop_stale(log=print) -> None:
    """End daemons that an earlier, killed test session started (recorded in BASE/*.pid), by PID."""
    for name in reversed(DAEMONS):  # slurmd, slurmctld, then munged
        pidfile = BASE / f"{name}.pid"
        if not pidfile.exists():
            continue
        try:
            pid = int(pidfile.read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except (ValueError, IndexError, OSError):
            cmdline = ""
        if cmdline and Path(cmdline).name.startswith(name):
            log(f"slurm_cluster: stopping a stale {name} (pid {pid}) from an earlier run")
            _stop_pid(pid)
        pidfile.unlink(missing_ok=True)


def _munge_works() -> bool:
    if _which("munge") is None or _which("unmunge") is None:
        return False
    try:
        cred = _run(["munge", "-n"], check=False, timeout=10)
        if cred.returncode != 0:
            return False
        return _run(["unmunge"], check=False, timeout=10, input=cred.stdout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _spawn(name: str, cmd: list[str], cluster: Cluster, **kwargs) -> subprocess.Popen:
    out = open(BASE / f"{name}.out", "ab")
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kwargs
    )
    out.close()
    cluster.procs[name] = proc
    (BASE / f"{name}.pid").write_text(f"{proc.pid}\n")
    return proc


def _wait(what: str, ready, cluster: Cluster, timeout: float, log_name: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        for name, proc in cluster.procs.items():
            if proc.poll() is not None:
                out = (BASE / f"{name}.out").read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"{name} exited ({proc.returncode}) while waiting for {what}:\n{out}\n{cluster.log_tail(name)}"
                )
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}:\n{cluster.log_tail(log_name)}")


def start(log=print) -> Cluster:
    """Write the config and start munged, slurmctld and slurmd; returns once the node is idle."""
    if os.geteuid() != 0:
        raise SlurmUnavailable("starting a SLURM cluster needs root (SlurmUser=root, /etc/slurm)")
    if SLURM_CONF.exists() and not SLURM_CONF.read_text(errors="replace").startswith(MARKER):
        raise SlurmUnavailable(f"{SLURM_CONF} exists and was not written by tests/slurm_cluster.py; not overwriting it")
    t0 = time.monotonic()
    BASE.mkdir(parents=True, exist_ok=True)
    lock_fd = _lock(log)
    try:
        return _start(lock_fd, t0, log)
    except BaseException:
        os.close(lock_fd)
        raise


def _start(lock_fd: int, t0: float, log) -> Cluster:
    _stop_stale(log)  # daemons of an earlier session that was killed (it no longer holds the lock)
    for child in BASE.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    for sub in ("ctld", "spool"):
        (BASE / sub).mkdir(mode=0o755)

    node, node_line = _node_line()
    SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
    SLURM_CONF.write_text(slurm_conf(node, node_line))
    cluster = Cluster(node=node, lock_fd=lock_fd)

    try:
        # munge: a key readable by the munge user only, then munged (as munge), unless one already works.
        if _munge_works():
            cluster.reused_munged = True
            log("slurm_cluster: a working munged is already running; using it")
        else:
            if not MUNGE_KEY.exists():
                MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
                MUNGE_KEY.write_bytes(os.urandom(128))
            shutil.chown(MUNGE_KEY, "munge", "munge")
            MUNGE_KEY.chmod(0o400)
            MUNGE_RUN.mkdir(parents=True, exist_ok=True)
            shutil.chown(MUNGE_RUN, "munge", "munge")
            MUNGE_RUN.chmod(0o755)
            for d in ("/var/lib/munge", "/var/log/munge"):
                Path(d).mkdir(parents=True, exist_ok=True)
                shutil.chown(d, "munge", "munge")
            (MUNGE_RUN / "munged.pid").unlink(missing_ok=True)
            _spawn("munged", [_which("munged"), "--foreground", "--force"], cluster, user="munge", group="munge")
            _wait("munged", _munge_works, cluster, 30, "munged")

        _spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(SLURM_CONF)], cluster)
        _wait("slurmctld", lambda: _run(["scontrol", "ping"], check=False).returncode == 0, cluster, 60, "slurmctld")
        _spawn("slurmd", [_which("slurmd"), "-D", "-N", node, "-f", str(SLURM_CONF)], cluster)

        def node_idle() -> bool:
            states = _run(["sinfo", "--noheader", "--node", node, "--format=%t"], check=False).stdout.split()
            return bool(states) and all(s.rstrip("*~#!%$@^-") == "idle" for s in states)

        _wait(f"node {node} idle in sinfo", node_idle, cluster, 90, "slurmd")
    except BaseException:
        cluster.lock_fd = None  # start() releases it
        cluster.stop(log)
        raise
    cluster.started_s = time.monotonic() - t0
    log(f"slurm_cluster: node {node} idle in partition {PARTITION} after {cluster.started_s:.1f} s")
    return cluster


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running one-node SLURM (installed if needed); skips only where it cannot be installed or started."""
    try:
        installed_s = ensure_installed()
        cluster = start()
        cluster.installed_s = installed_s
    except SlurmUnavailable as why:
        pytest.skip(str(why))
    try:
        yield cluster
    finally:
        cluster.stop()


if __name__ == "__main__":
    if sys.argv[1:] == ["start"]:
        ensure_installed()
        c = start()
        for proc in c.procs.values():  # detach: the daemons outlive this script; `stop` ends them by PID
            proc.returncode = 0
        print(f"running: {', '.join(f'{n}={p.pid}' for n, p in c.procs.items())}; logs in {BASE}")
    elif sys.argv[1:] == ["stop"]:
        fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.exit(f"a test session is using the cluster ({LOCK} is locked); not stopping it")
        if _which("scancel"):
            _run(["scancel", "--user", "root"], check=False)
        _stop_stale()
        remove_conf()
    else:
        sys.exit("usage: python tests/slurm_cluster.py start|stop")
