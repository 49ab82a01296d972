"""A many-pair compare ended by SIGTERM or SIGHUP leaves no spool folder, no worker and no
resource-tracker warning; a worker process that dies (a crash, the OOM killer) costs only that
pair its replay, said once in a note, and the compare completes. Real `opdiff compare` processes;
the deaths are made by a `sitecustomize` planted on the children's path (a test hook only)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import opdiff

from outputs_kit import RUN_CLI, env

HOOK = textwrap.dedent('''
    import os, signal, sys, time
    mode = os.environ.get("OPDIFF_TEST_WORKER", "")
    if mode and sys.argv[-1:] == ["--multiprocessing-fork"]:       # a spawned worker only
        if mode == "die-at-start":
            os.kill(os.getpid(), signal.SIGKILL)
        import importlib.abc, importlib.util

        def patch(module):
            real = module.compare_pair
            def compare_pair(t, g, options=None, **how):
                if mode == "slow":
                    time.sleep(600)
                replay = getattr(options, "replay", how.get("replay"))
                if mode == "die-replaying-step1" and replay != "off" and "step1" in str(t.path):
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(t, g, options, **how)
            module.compare_pair = compare_pair

        class Hook(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name != "opdiff.comparison.pair":
                    return None
                sys.meta_path.remove(self)
                spec = importlib.util.find_spec(name)
                run = spec.loader.exec_module
                def exec_module(module):
                    run(module)
                    patch(module)
                spec.loader.exec_module = exec_module
                return spec
        sys.meta_path.insert(0, Hook())
''')


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """Two steps of a small net, tensors saved; the target's second Linear is off."""
    root = tmp_path_factory.mktemp("pairs")
    for side, fault in (("target", True), ("golden", False)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        planted = opdiff.testing.inject_fault(op="Functional.linear", call=None, scale=1.01) \
            if fault else None
        if planted is not None:
            planted.__enter__()
        try:
            dbg = opdiff.PrecisionDebugger(dump_path=str(root / side), task="tensor", step=[0, 1])
            for _ in range(2):
                dbg.start()
                model(torch.randn(4, 8)).sum().backward()
                dbg.stop()
                dbg.step()
        finally:
            if planted is not None:
                planted.__exit__(None, None, None)
    (root / "hook").mkdir()
    (root / "hook" / "sitecustomize.py").write_text(HOOK)
    return root


def start(dumps: Path, *args, mode: str, **extra: str) -> subprocess.Popen:
    e = env()
    e.update(extra, OPDIFF_TEST_WORKER=mode,
             PYTHONPATH=os.pathsep.join([e["PYTHONPATH"], str(dumps / "hook")]))
    return subprocess.Popen([sys.executable, "-c", RUN_CLI, "compare", *map(str, args),
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=e)


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signalled_many_pair_compare_leaves_nothing_behind(dumps, tmp_path, sig):
    spool = tmp_path / "spool"
    spool.mkdir()
    proc = start(dumps, dumps / "target", dumps / "golden", "-o", tmp_path / "out",
                 mode="slow", OPDIFF_SPOOL_DIR=str(spool))
    try:
        deadline = time.monotonic() + 120
        while not (list(spool.iterdir()) and len(children(proc.pid)) >= 2):  # spool and workers
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the compare never reached its workers"
            time.sleep(0.2)
        time.sleep(1.0)
        workers = children(proc.pid)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, err
    assert list(spool.iterdir()) == [], "the spool folder was left"
    assert "resource_tracker" not in err and "leaked" not in err, err
    assert "Traceback" not in err, err
    deadline = time.monotonic() + 10
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(w) for w in workers)


def test_a_dead_replay_worker_costs_that_pair_its_replay_only(dumps, tmp_path):
    proc = start(dumps, dumps / "target" / "step0" / "rank0", dumps / "golden" / "step0" / "rank0",
                 "--replay", "all", "-j", "2", mode="die-at-start")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert out.count("a replay worker process died") == 1, out
    assert "BrokenProcessPool" not in out + err


def test_a_pair_whose_worker_dies_replaying_is_compared_without_replay(dumps, tmp_path):
    out = tmp_path / "out"
    proc = start(dumps, dumps / "target", dumps / "golden", "--replay", "all", "-o", out,
                 mode="die-replaying-step1")
    said, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    notes = [line for line in said.splitlines() if "died while this pair was replayed" in line]
    assert len(notes) == 1 and "step 1 rank 0" in notes[0], said
    import json
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(p["step"] for p in summary["pairs"]) == [0, 1]
    assert "BrokenProcessPool" not in said + err
