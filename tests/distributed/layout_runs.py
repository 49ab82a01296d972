"""One spawned multi-process run of the layouts tests: a worker script started in its own
session, killed with its ranks when it overruns, its directory returned."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

LIMIT_S = 300


def run_worker(tmp: Path, source: str, name: str, what: str, *args: object) -> str:
    """Run `source` (a script taking ROOT STORE ARGS...) as run `name`; ROOT when it ends well.
    `what`: the run in words, for the message when it does not finish in LIMIT_S."""
    script = tmp / f"worker_{name}.py"
    script.write_text(source)
    root = tmp / name
    proc = subprocess.Popen([sys.executable, str(script), str(root), str(tmp / f"store_{name}"),
                             *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{name}: {what} under capture does not finish in {LIMIT_S} s")
    assert proc.returncode == 0, stderr[-2000:]
    return str(root)
