"""Running `opdiff run` as a user does: a subprocess with this checkout's opdiff on PYTHONPATH
and one thread per process (the machine is shared). Used by tests/launch and tests/integrations."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


SRC = str(Path(__file__).resolve().parents[1] / "src")


def environment(**extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SRC] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["OMP_NUM_THREADS"] = "1"
    env.pop("OPDIFF_RUN_CONFIG", None)
    env.update(extra)
    return env


def run(args: list, cwd: Path, timeout: int = 300, input: str | None = None, **extra: str):
    """`python ARGS` in `cwd`; the CompletedProcess (text)."""
    return subprocess.run([sys.executable, *args], cwd=str(cwd), env=environment(**extra),
                          capture_output=True, text=True, timeout=timeout, input=input)
