"""`--engine ray` on a real local Ray cluster (started and stopped here): the local engine's
result row for row, a worker killed mid-compare is retried, node-pinned dumps run on the node
that offers their resource, and without Ray the CLI says `pip install opdiff[ray]` (exit 2)."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import opdiff

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def local(roots):
    return opdiff.compare(str(roots[0]), str(roots[1]))


def _same(a, b) -> None:
    assert a.rows == b.rows and len(a.rows) > 0
    assert a.first_divergence == b.first_divergence and a.first_divergence is not None
    assert a.pairs == b.pairs and a.counts == b.counts
    assert _untimed(a.notes) == _untimed(b.notes)


def _untimed(notes: list[str]) -> list[str]:
    # replay's notes say how long it took (so which pairs share one note varies run to run)
    return [n for n in notes if not re.search(r"replayed .* in [0-9.]+ s", n)]


def test_ray_gives_the_local_result_row_for_row(cluster, roots, local):
    _same(opdiff.compare(str(roots[0]), str(roots[1]), engine="ray"), local)


def _ray_workers() -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmd.startswith((b"ray::_remote", b"ray::_worker")):   # a task running a pair
            found.append(int(pid))
    return found


def test_a_worker_killed_mid_compare_is_retried(cluster, roots, local):
    killed: list[int] = []
    # A pair can finish before the killer sees its worker (the machine is fast or the poll
    # unlucky): every attempt must still give the local result, and one of them must lose a
    # worker for the retry to be tested.
    for _attempt in range(4):
        done = threading.Event()

        def kill_one(done: threading.Event = done) -> None:   # the first worker seen running a pair
            while not done.is_set() and not killed:
                busy = _ray_workers()
                if busy:
                    os.kill(busy[0], signal.SIGKILL)
                    killed.append(busy[0])
                time.sleep(0.005)

        killer = threading.Thread(target=kill_one)
        killer.start()
        try:
            again = opdiff.compare(str(roots[0]), str(roots[1]), engine="ray")
        finally:
            done.set()
            killer.join()
        _same(again, local)
        if killed:
            break
    assert killed, "no Ray worker was seen running a pair"


def test_without_ray_the_cli_says_how_to_get_it(roots):
    code = ("import sys; sys.modules['ray'] = None\n"
            "from opdiff.cli import main\n"
            f"sys.exit(main(['compare', {str(roots[0])!r}, {str(roots[1])!r}, '--engine', 'ray',"
            " '--no-progress']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert "pip install opdiff[ray]" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_an_address_where_nothing_listens_is_one_line_at_once(roots):
    # (ray.init alone retries the GCS for minutes at such an address)
    with socket.socket() as free:               # a port nothing listens on: bound, then closed
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    start = time.monotonic()
    opdiff_bin = Path(sys.executable).with_name("opdiff")
    proc = subprocess.run([str(opdiff_bin), "compare", str(roots[0]), str(roots[1]),
                           "--engine", "ray", "--ray-address", f"127.0.0.1:{port}",
                           "--no-progress"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert time.monotonic() - start < 60


def _ray_command() -> list[str]:
    """Ray's CLI: beside this interpreter, else its entry point run by this interpreter (a venv
    made with --system-site-packages has Ray's package but not its script)."""
    beside = Path(sys.executable).with_name("ray")
    if beside.exists():
        return [str(beside)]
    # this interpreter, not a `ray` on PATH: the nodes' workers must import this opdiff
    return [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]


def _ray_cli(*args: str) -> None:
    proc = subprocess.run([*_ray_command(), *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_two_nodes_dumps_pinned_to_the_second(roots, local, monkeypatch):
    # Two Ray "nodes" on this machine; the target dumps are said to live on the second one.
    # (Runs after the module's in-process cluster is shut down: it uses its own processes.)
    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")    # a local test cluster, no token
    port = "6391"
    _ray_cli("start", "--head", f"--port={port}", "--num-cpus=1", "--include-dashboard=false",
             '--resources={"dumpA": 1}', "--disable-usage-stats")
    try:
        _ray_cli("start", f"--address=127.0.0.1:{port}", "--num-cpus=1",
                 '--resources={"dumpB": 1}', "--disable-usage-stats")
        pinned = opdiff.compare(str(roots[0]), str(roots[1]), engine="ray",
                                ray_address=f"127.0.0.1:{port}", ray_pins={str(roots[0]): "dumpB"})
        _same(pinned, local)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        _ray_cli("stop", "--force")
