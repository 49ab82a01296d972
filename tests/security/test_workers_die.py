"""Worker processes die with the compare or check that started them: killed with SIGKILL or
SIGTERM while its pool works, a compare leaves no worker behind replaying, writing the spool
or holding the caller's stdout open (`comparison/workers.py`). Real subprocesses, real signals."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import opdiff

SRC = str(Path(opdiff.__file__).resolve().parents[1])
CLI = "import sys; from opdiff.cli import main; sys.exit(main(sys.argv[1:]))"
GONE_WITHIN = 20.0     # seconds; a worker importing torch on a busy machine needs a few


class _Slow(torch.nn.Module):
    """Small tensors, slow float64 replays: 3D convolutions with 5x5x5 kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv3d(6, 6, 5, padding=2) for _ in range(12))

    def forward(self, x):
        for conv in self.convs:
            x = torch.tanh(conv(x))
        return x


def _dumps(root: Path, steps: int) -> tuple[Path, Path]:
    for side in ("t", "g"):
        torch.manual_seed(0)
        model, x = _Slow(), torch.randn(1, 6, 12, 12, 12)
        dbg = opdiff.PrecisionDebugger(dump_path=str(root / side), task="tensor", level="mix",
                                     step=list(range(steps)))
        for _ in range(steps):
            dbg.start(model)
            model(x).pow(2).mean().backward()
            dbg.stop()
            dbg.step()
    return root / "t", root / "g"


def _children(pid: int) -> dict[int, str]:
    """Living descendants of `pid` (zombies count as gone): {pid: command line}."""
    parents: dict[int, int] = {}
    lines: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        parents[int(entry)], lines[int(entry)] = int(fields[1]), cmd
    found, todo = {}, [pid]
    while todo:
        p = todo.pop()
        for child, parent in parents.items():
            if parent == p and child not in found:
                found[child] = lines[child]
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("steps", [1, 2], ids=["one_pair", "two_pairs"])
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_workers_die_with_a_killed_compare(tmp_path, sig, steps):
    """steps=1: the replay's worker pool (--replay-jobs 2); steps=2: the pair workers too (one
    per step, each with its replay pool)."""
    target, golden = _dumps(tmp_path, steps)
    _kill_while_working(tmp_path, ["compare", str(target), str(golden), "-o",
                                   str(tmp_path / "out"), "--replay", "all", "--replay-jobs", "2",
                                   "--no-progress"], sig, 2 * steps)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_workers_die_with_a_killed_check(tmp_path):
    target, _golden = _dumps(tmp_path, 1)
    _kill_while_working(tmp_path, ["check", str(target / "step0" / "rank0"), "-o",
                                   str(tmp_path / "out"), "--jobs", "2", "--no-progress"],
                        signal.SIGKILL, 2)


def _kill_while_working(tmp_path: Path, args: list[str], sig: int, expected: int) -> None:
    """Start the CLI, wait for `expected` pool workers, let them work, send `sig` and check
    that every worker is gone within GONE_WITHIN seconds."""
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OPDIFF_REPLAY_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", CLI, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    workers: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            workers = {p: c for p, c in _children(proc.pid).items() if "spawn_main" in c}
            if len(workers) >= expected:
                break
            time.sleep(0.05)
        assert proc.poll() is None and len(workers) >= expected, \
            f"no worker pool seen: {proc.poll()} {workers}"
        time.sleep(2.0)                        # they start replaying
        workers.update({p: c for p, c in _children(proc.pid).items() if "spawn_main" in c})
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
        start = time.monotonic()
        while time.monotonic() - start < GONE_WITHIN and any(_alive(p) for p in workers):
            time.sleep(0.1)
        print(f"{len(workers)} workers gone {time.monotonic() - start:.1f} s after signal {sig}")
        left = [p for p in workers if _alive(p)]
        assert not left, f"workers alive {GONE_WITHIN} s after the compare was killed: {left}"
        # nothing holds the compare's stdout open any more
        assert proc.stdout is not None
        proc.stdout.read()
    finally:
        for p in workers:          # (only on failure: the processes this test started)
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()
