"""What the monitor tests share: the tiny model families of tests/conftest.py, and training
scripts run in a real child process with this interpreter, SIGKILLed once they report progress.

    from .conftest import MODEL_CASES, start_python, kill_after

    proc = start_python(script, mon_dir, progress, wait=False)
    done = kill_after(proc, progress, lines=40)     # the steps the child reported done
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Loaded by path: other folders' conftest.py modules are also named `conftest`, and whichever
# pytest imported last would answer.
_spec = importlib.util.spec_from_file_location("opdiff_test_models",
                                               Path(__file__).parents[1] / "conftest.py")
_models = sys.modules.setdefault("opdiff_test_models", importlib.util.module_from_spec(_spec))
if not hasattr(_models, "MODEL_CASES"):
    _spec.loader.exec_module(_models)
MODEL_CASES = _models.MODEL_CASES
TRAINING_FAMILIES = _models.TRAINING_FAMILIES


def start_python(script: Path, *args, wait: bool = True):
    """Run `script ARGS` with this interpreter and this test's sys.path (so the child imports
    this opdiff): wait for it to succeed, or return the running Popen."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cmd = [sys.executable, str(script), *map(str, args)]
    if wait:
        subprocess.run(cmd, env=env, check=True, timeout=300)
        return None
    return subprocess.Popen(cmd, env=env)


def kill_after(proc: subprocess.Popen, progress: Path, lines: int, timeout: float = 240) -> list:
    """Wait until the child has written `lines` lines (one step number each) to `progress`, then
    SIGKILL it; the test fails if it ends on its own or makes no progress. Returns the steps it
    reported done."""
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if progress.exists() and len(progress.read_text().split()) >= lines:
                break
            if proc.poll() is not None:
                pytest.fail(f"the training process ended with {proc.returncode}")
            time.sleep(0.05)
        else:
            pytest.fail("the training process made no progress")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return [int(s) for s in progress.read_text().split()]
