"""A real local Ray cluster for the Ray engine tests (compare's here, check's in tests/check):
the module-scoped `cluster` fixture, a worker killed while a call runs, Ray's CLI for a two-node
cluster, and the one-line exit-2 check of a failing CLI run.

    from ray_cluster import cluster, killing_a_worker     # noqa: F401 - the fixture by name

    def test_retry(cluster):
        killing_a_worker(lambda: check_dump(path, engine="ray"), (b"ray::check_batch",), same)
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from opdiff.comparison.result import note_kind

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    """A 2-CPU Ray cluster in this process for the module's tests, shut down after them.

    Without token authentication, as the two-node test's clusters: a process that once joined
    a cluster with RAY_AUTH_MODE=disabled keeps that mode, and a cluster started with tokens
    afterwards refuses it ("Authentication token is missing")."""
    if ray.is_initialized():
        ray.shutdown()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_AUTH_MODE", "disabled")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()


def same_result(a: Any, b: Any) -> None:
    """Two compares of one pair of roots gave the same result: rows, first divergence (one was
    found), pairs, counts and notes (less replay's timings, whose grouping varies run to run)."""
    assert a.rows == b.rows and len(a.rows) > 0
    assert a.first_divergence == b.first_divergence and a.first_divergence is not None
    assert a.pairs == b.pairs and a.counts == b.counts
    assert _untimed(a.notes) == _untimed(b.notes)
    # each note's kind comes back from the tasks too (notes are pickled with it)
    assert [note_kind(n) for n in _untimed(a.notes)] == [note_kind(n) for n in _untimed(b.notes)]


def _untimed(notes: list[str]) -> list[str]:
    return [n for n in notes if not re.search(r"replayed .* in [0-9.]+ s", n)]


def ray_workers(prefixes: tuple[bytes, ...]) -> list[int]:
    """Pids of the Ray workers now running a task whose name starts with one of `prefixes`
    (a worker's command line is `ray::<task name>`)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmd.startswith(prefixes):
            found.append(int(pid))
    return found


def killing_a_worker(run: Callable[[], Any], prefixes: tuple[bytes, ...],
                     same: Callable[[Any], None], attempts: int = 4) -> int:
    """Run `run()` while a thread SIGKILLs the first worker seen running one of its tasks;
    `same(result)` must hold for every attempt. A task can finish before the killer sees its
    worker, so up to `attempts` runs are made until one lost a worker. The pid killed."""
    killed: list[int] = []
    for _attempt in range(attempts):
        done = threading.Event()

        def kill_one(done: threading.Event = done) -> None:
            while not done.is_set() and not killed:
                busy = ray_workers(prefixes)
                if busy:
                    os.kill(busy[0], signal.SIGKILL)
                    killed.append(busy[0])
                time.sleep(0.002)

        killer = threading.Thread(target=kill_one)
        killer.start()
        try:
            result = run()
        finally:
            done.set()
            killer.join()
        same(result)
        if killed:
            return killed[0]
    raise AssertionError("no Ray worker was seen running a task")


def ray_command() -> list[str]:
    """Ray's CLI: beside this interpreter, else its entry point run by this interpreter (a venv
    made with --system-site-packages has Ray's package but not its script)."""
    beside = Path(sys.executable).with_name("ray")
    if beside.exists():
        return [str(beside)]
    # this interpreter, not a `ray` on PATH: the nodes' workers must import this opdiff
    return [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]


def ray_cli(*args: str) -> None:
    """Run `ray ARGS...` (a local test cluster, no auth token); it must succeed."""
    proc = subprocess.run([*ray_command(), *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert proc.returncode == 0, proc.stderr[-2000:]


def one_line_exit_2(proc: subprocess.CompletedProcess, words: str) -> None:
    """The CLI failed as a user's mistake should: exit 2, one line holding `words`, no
    traceback."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert words in err and "Traceback" not in err
    assert len(err.splitlines()) == 1, err
