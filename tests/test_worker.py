"""The warm worker (anisweep.worker): a command handed to it behaves as the command in its own process (output,
exit status, signals), it serves its owner's user only, and it ends with its owner."""

from __future__ import annotations

import marshal
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import anisweep as anisweep_package
from anisweep.worker import address, client, files, server

pytestmark = pytest.mark.slow  # the worker imports torch and transformers once per owner

CONFIG = Path(__file__).parent / "configs" / "tiny.yaml"
PACKAGE = Path(anisweep_package.__file__).parent


def wait_for(condition, seconds: float = 120, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def workers_of(owner: int) -> list[int]:
    """The pids of the worker processes serving `owner` (not their jobs, forks with the same command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"anisweep.worker.server" in words and str(owner).encode() in words:
            found[int(entry.name)] = parent
    return [pid for pid, parent in found.items() if parent not in found]


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.fixture(scope="module")
def runtime_dir():
    """The folder of the module's worker sockets, and a copy of the package that its commands and workers run:
    a worker forks no job once the package's files change, so an edit to the checkout while the tests run would
    make a test's job run in a process of its own."""
    folder = tempfile.mkdtemp(prefix="aw", dir="/tmp")  # short: a socket's path has at most 107 bytes
    shutil.copytree(PACKAGE, Path(folder, "src", "anisweep"), ignore=shutil.ignore_patterns("__pycache__"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def owner(runtime_dir):
    """A stand-in for the Snakemake process that asked for the worker."""
    process = subprocess.Popen(["sleep", "600"])
    yield process.pid
    process.kill()
    process.wait()


def environment(runtime_dir: str, owner: int | str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != address.OWNER_VARIABLE}
    env["XDG_RUNTIME_DIR"] = runtime_dir
    env["PYTHONPATH"] = os.pathsep.join([str(Path(runtime_dir, "src")), *filter(None, [env.get("PYTHONPATH")])])
    if owner is not None:
        env[address.OWNER_VARIABLE] = str(owner)
    return env


def anisweep(*args: str, env: dict, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anisweep", *args], env=env, capture_output=True, text=True, **kwargs)


def test_a_command_in_the_worker_prints_and_exits_as_in_its_own_process(tmp_path, runtime_dir, owner):
    for args in (["checkpoints", "--configfile", str(CONFIG)], ["checkpoints", "--configfile", "no-such.yaml"]):
        alone = anisweep(*args, env=environment(runtime_dir, None), cwd=tmp_path)
        warm = anisweep(*args, env=environment(runtime_dir, owner), cwd=tmp_path)
        assert (warm.returncode, warm.stdout, warm.stderr) == (alone.returncode, alone.stdout, alone.stderr)
    assert alone.returncode == 1 and "no-such.yaml" in alone.stderr
    assert len(workers_of(owner)) == 1, "the commands above ran in a worker"
    usage = anisweep("no-such-command", env=environment(runtime_dir, owner))
    assert usage.returncode == 2 and "invalid choice" in usage.stderr


def test_the_worker_runs_the_command_where_it_was_started(tmp_path, runtime_dir, owner):
    (tmp_path / "here.yaml").write_text(CONFIG.read_text())
    warm = anisweep("checkpoints", "--configfile", "here.yaml", env=environment(runtime_dir, owner), cwd=tmp_path)
    assert warm.returncode == 0, warm.stderr
    assert '"toy-neox"' in warm.stdout


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_command_reaches_its_job(tmp_path, runtime_dir, owner, number):
    """A job blocked on opening a FIFO (no writer) until its signal comes."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    env = environment(runtime_dir, owner)
    anisweep("checkpoints", "--configfile", str(CONFIG), env=env)  # the worker is up
    (worker,) = workers_of(owner)
    before = set(children(worker))
    command = subprocess.Popen([sys.executable, "-m", "anisweep", "checkpoints", "--configfile", str(fifo)], env=env)
    wait_for(lambda: set(children(worker)) - before, what="the job's fork")
    (job,) = set(children(worker)) - before
    command.send_signal(number)
    assert command.wait(timeout=30) == -number
    wait_for(lambda: job not in children(worker), 30, "the job's end")


def test_a_signal_sent_the_moment_the_job_is_forked_is_not_lost(tmp_path, runtime_dir, owner):
    """The client forwards a signal as soon as it has the job's pid, which is often before the forked child has
    run at all: the signal must still end the job (CPython drops signals that come before its after-fork work)."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    env = environment(runtime_dir, owner)
    anisweep("checkpoints", "--configfile", str(CONFIG), env=env)  # the worker is up
    (path,) = Path(runtime_dir, f"anisweep-worker-{os.getuid()}").glob(f"{owner}-*.sock")
    for _ in range(5):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(path))
            replies = connection.makefile("rb")
            client._send(connection, ["checkpoints", "--configfile", str(fifo)])
            os.kill(int(replies.readline()), signal.SIGINT)
            connection.settimeout(30)
            status = int(replies.readline())
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT


@pytest.mark.parametrize("payload", [b"not marshal", marshal.dumps(["a list", "not a dict"])])
def test_a_broken_request_is_refused_and_the_worker_serves_on(tmp_path, runtime_dir, owner, payload):
    """A request that is not a marshalled dict is answered by closing the connection, without a job, and the
    descriptors that came with it are not kept open in the worker."""
    env = environment(runtime_dir, owner)
    anisweep("checkpoints", "--configfile", str(CONFIG), env=env)  # the worker is up
    (worker,) = workers_of(owner)
    (path,) = Path(runtime_dir, f"anisweep-worker-{os.getuid()}").glob(f"{owner}-*.sock")
    open_before = len(os.listdir(f"/proc/{worker}/fd"))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(str(path))
        socket.send_fds(connection, [struct.pack("!I", len(payload))], [0, 1, 2])
        connection.sendall(payload)
        connection.settimeout(30)
        assert connection.recv(100) == b""  # closed, no pid
    assert not children(worker)
    # no more than before: the first command's connection may still have been open then (the worker closes it
    # after its reply), while the three descriptors sent with this request would be three more
    wait_for(lambda: len(os.listdir(f"/proc/{worker}/fd")) <= open_before, 10, "the request's descriptors closed")
    warm = anisweep("checkpoints", "--configfile", str(CONFIG), env=env, cwd=tmp_path)
    assert warm.returncode == 0, warm.stderr


BLOCKED_JOB = """
import os, signal, sys, time
from anisweep.worker.server import preload
preload("polars")
pid = os.fork()
if pid == 0:
    try:
        open(sys.argv[1]).read()  # no writer: blocks in open(2), a call the kernel restarts after a SA_RESTART handler
    except KeyboardInterrupt:
        os._exit(7)
    os._exit(0)
while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "S":  # until it sleeps in open(2)
    time.sleep(0.01)
time.sleep(0.1)
os.kill(pid, signal.SIGINT)
for _ in range(100):
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        sys.exit(os.waitstatus_to_exitcode(status))
    time.sleep(0.1)
os.kill(pid, signal.SIGKILL)
sys.exit("the job did not take its SIGINT")
"""


def test_sigint_reaches_a_job_blocked_in_a_system_call_though_polars_is_loaded(tmp_path):
    """polars installs its own SIGINT handler with SA_RESTART (pola-rs/polars#21739), under which the job would sit
    in open(2) until a writer came: the worker puts Python's handler back."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    run = subprocess.run([sys.executable, "-c", BLOCKED_JOB, str(fifo)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 7, run.stderr


def test_a_killed_command_takes_its_job_with_it(tmp_path, runtime_dir, owner):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    env = environment(runtime_dir, owner)
    anisweep("checkpoints", "--configfile", str(CONFIG), env=env)
    (worker,) = workers_of(owner)
    before = set(children(worker))
    command = subprocess.Popen([sys.executable, "-m", "anisweep", "checkpoints", "--configfile", str(fifo)], env=env)
    wait_for(lambda: set(children(worker)) - before, what="the job's fork")
    (job,) = set(children(worker)) - before
    command.kill()
    command.wait()
    wait_for(lambda: job not in children(worker), 30, "the job's end")


def test_the_worker_ends_with_its_owner(runtime_dir):
    owner = subprocess.Popen(["sleep", "600"])
    env = environment(runtime_dir, owner.pid)
    assert anisweep("checkpoints", "--configfile", str(CONFIG), env=env).returncode == 0
    (worker,) = workers_of(owner.pid)
    sockets = list(Path(runtime_dir, f"anisweep-worker-{os.getuid()}").glob(f"{owner.pid}-*.sock"))
    assert len(sockets) == 1
    owner.kill()
    owner.wait()
    wait_for(lambda: not workers_of(owner.pid), 30, "the worker's end")
    assert not sockets[0].exists()
    assert not list(sockets[0].parent.glob(f"{owner.pid}-*")), "the worker leaves no lock or empty log behind"


def test_no_worker_without_an_owner_or_where_others_could_open_its_socket(tmp_path, monkeypatch):
    monkeypatch.delenv(address.OWNER_VARIABLE, raising=False)
    assert client.run(["--help"]) is None
    for value in address.OFF:
        monkeypatch.setenv(address.OWNER_VARIABLE, value)
        assert client.run(["--help"]) is None
    shared = tempfile.mkdtemp(prefix="aw", dir="/tmp")
    try:
        os.mkdir(Path(shared, f"anisweep-worker-{os.getuid()}"), 0o755)
        os.chmod(Path(shared, f"anisweep-worker-{os.getuid()}"), 0o755)
        monkeypatch.setenv("XDG_RUNTIME_DIR", shared)
        monkeypatch.setenv(address.OWNER_VARIABLE, str(os.getpid()))
        with pytest.raises(address.Unsafe):
            address.folder()
        assert client.run(["--help"]) is None
        assert not workers_of(os.getpid())
    finally:
        shutil.rmtree(shared)


def test_offer_names_the_asking_process_unless_turned_off_or_a_live_owner_is_named(owner):
    env = {}
    assert address.offer(env) and env[address.OWNER_VARIABLE] == str(os.getpid())
    env = {address.OWNER_VARIABLE: "off"}
    assert not address.offer(env) and env[address.OWNER_VARIABLE] == "off"
    env = {address.OWNER_VARIABLE: str(owner)}  # a live process of this user's: its worker serves this run too
    assert address.offer(env) and env[address.OWNER_VARIABLE] == str(owner)
    ended = subprocess.Popen(["true"])
    ended.wait()
    env = {address.OWNER_VARIABLE: str(ended.pid)}  # a stale name: this process owns the worker
    assert address.offer(env) and env[address.OWNER_VARIABLE] == str(os.getpid())


ALLOCATING = """
import resource, sys
if sys.argv[1] == "kept":
    from anisweep.worker.server import keep_freed_memory
    keep_freed_memory()
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):  # a job's temporaries: several blocks of a few MB, freed together
    blocks = [bytearray(4 << 20) for _ in range(4)]
    del blocks
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
"""


def test_the_worker_has_malloc_keep_what_a_job_frees_for_its_next_allocation():
    """The 16 MB the loop holds at a time faults in once (4,096 pages), not at each of its 50 rounds."""

    def page_faults(setting: str) -> int:
        run = subprocess.run([sys.executable, "-c", ALLOCATING, setting], capture_output=True, text=True, check=True)
        return int(run.stdout)

    assert page_faults("default") > 20 * 4096, "glibc's defaults give each round's blocks back to the kernel"
    assert page_faults("kept") < 2 * 4096


def socket_of(runtime_dir: str, owner: int) -> Path:
    (path,) = Path(runtime_dir, f"anisweep-worker-{os.getuid()}").glob(f"{owner}-*.sock")
    return path


def catches(pid: int, number: int) -> bool:
    """Whether process `pid` has a handler for signal `number` (/proc's SigCgt mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (number - 1) & 1)
    return False


def gone(pid: int) -> bool:
    """Whether `pid` has ended (a zombie has: it waits only for its parent to read its status)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture
def own_owner():
    """A stand-in owner for one test, whose worker the test may kill."""
    process = subprocess.Popen(["sleep", "600"])
    yield process
    process.kill()
    process.wait()


EDITED_MAIN = """

_main_before_the_edit = main


def main(argv=None):
    print("edited main", flush=True)
    return _main_before_the_edit(argv)
"""


def test_a_job_runs_the_code_on_disk_when_it_starts(tmp_path, runtime_dir, own_owner):
    """A module the worker imported is edited between two jobs of one run: the second job runs the edited code,
    as it would in a process of its own, not what the worker imported before the edit."""
    package = tmp_path / "src" / "anisweep"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    preloaded = [module for module in server.PRELOAD if module.startswith("anisweep.")]
    assert preloaded.index("anisweep.cli") < len(preloaded) - 1
    marker = tmp_path / "imported"  # made when the worker has imported its last module, anisweep.cli before it
    with open(package.joinpath(*preloaded[-1].split(".")[1:]).with_suffix(".py"), "a") as last:
        last.write(f"\nopen({str(marker)!r}, 'w').close()\n")
    env = environment(runtime_dir, own_owner.pid)
    env["PYTHONPATH"] = os.pathsep.join([str(package.parent), env["PYTHONPATH"]])
    first = anisweep("checkpoints", "--configfile", str(CONFIG), env=env)
    assert first.returncode == 0, first.stderr
    assert "edited main" not in first.stdout and len(workers_of(own_owner.pid)) == 1
    wait_for(marker.exists, what="the worker's imports")
    with open(package / "cli" / "__init__.py", "a") as module:
        module.write(EDITED_MAIN)
    for _ in range(2):  # the job at the edit, and one after it
        edited = anisweep("checkpoints", "--configfile", str(CONFIG), env=env)
        assert edited.returncode == 0, edited.stderr
        assert edited.stdout.startswith("edited main\n") and edited.stdout.endswith(first.stdout)
    assert len(workers_of(own_owner.pid)) == 1, "a worker with the edited code serves the run"


def test_a_job_dies_with_its_worker(tmp_path, runtime_dir, own_owner):
    """A worker killed while a job runs: the command fails, and neither the job nor the worker is left running (a
    job left would go on writing its outputs under the next run)."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    env = environment(runtime_dir, own_owner.pid)
    command = subprocess.Popen([sys.executable, "-m", "anisweep", "checkpoints", "--configfile", str(fifo)], env=env)
    wait_for(lambda: workers_of(own_owner.pid) and children(workers_of(own_owner.pid)[0]), what="the job's fork")
    # the command has read the job's pid (it then forwards signals to it): killed before that, the worker would
    # have started nothing as far as the command knows, and the command would run the job itself
    wait_for(lambda: catches(command.pid, signal.SIGUSR1), 60, "the command to hear of its job")
    (worker,) = workers_of(own_owner.pid)
    (job,) = children(worker)
    os.kill(worker, signal.SIGKILL)
    assert command.wait(timeout=60) == 1
    wait_for(lambda: gone(job), 30, "the job's end")
    assert gone(worker)


def test_a_silent_client_holds_up_no_other(runtime_dir, owner):
    """A client that connects and sends nothing: the worker serves the next client's job meanwhile."""
    env = environment(runtime_dir, owner)
    anisweep("checkpoints", "--configfile", str(CONFIG), env=env)  # the worker is up
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.connect(str(socket_of(runtime_dir, owner)))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(socket_of(runtime_dir, owner)))
            replies = connection.makefile("rb")
            client._send(connection, ["checkpoints", "--configfile", str(CONFIG)])
            connection.settimeout(60)
            assert int(replies.readline()) > 0
            assert int(replies.readline()) == 0
        silent.setblocking(False)
        with pytest.raises(BlockingIOError):  # still connected, waiting for its request: the job did not wait for it
            silent.recv(1)


def test_a_worker_that_starts_removes_what_a_killed_one_left(runtime_dir):
    first = subprocess.Popen(["sleep", "600"])
    assert anisweep("checkpoints", "--configfile", str(CONFIG), env=environment(runtime_dir, first.pid)).returncode == 0
    (worker,) = workers_of(first.pid)
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: gone(worker), 30, "the worker's end")
    left = sorted(Path(runtime_dir, f"anisweep-worker-{os.getuid()}").glob(f"{first.pid}-*"))
    assert [path.suffix for path in left] == [".lock", ".log", ".sock"]
    assert left[1].stat().st_size == 0
    first.kill()
    first.wait()
    second = subprocess.Popen(["sleep", "600"])
    try:
        assert (
            anisweep("checkpoints", "--configfile", str(CONFIG), env=environment(runtime_dir, second.pid)).returncode
            == 0
        )
        assert not [path for path in left if path.exists()]
    finally:
        second.kill()
        second.wait()
        wait_for(lambda: not workers_of(second.pid), 60, "the second worker's end")


def test_a_command_whose_owner_has_ended_starts_no_worker(tmp_path, monkeypatch):
    """ANISWEEP_WORKER left naming an ended process: the command runs in its own process at once, where a worker
    started for that owner would exit at once and the command wait for it to listen."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    started = []
    monkeypatch.setattr(client, "_start", lambda path, owner: started.append(owner))
    monkeypatch.setattr(client, "CONNECT_SECONDS", 1)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv(address.OWNER_VARIABLE, str(ended.pid))
    assert client.run(["--help"]) is None
    assert not started


def test_a_lock_is_held_by_one_worker_and_released_though_its_file_was_removed(tmp_path):
    base = str(tmp_path / "1-fingerprint")
    lock = files.take(base)
    assert lock is not None and files.take(base) is None, "a second worker finds the lock held"
    Path(base + ".log").touch()
    os.unlink(base + ".lock")  # the folder's files removed under a live worker
    files.release(base, lock)
    assert not list(tmp_path.iterdir())
    again = files.take(base)
    assert again is not None
    files.release(base, again)
