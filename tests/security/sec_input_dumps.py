"""Small real dumps for the security tests of dump reading and source context (sec-input):
a tiny model run twice under opdiff, the target with one planted fault, and the CLI run as a
real process (so a hang or a crash is seen as the user would see it)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

import opdiff
import opdiff.testing

FAULT = dict(op="Functional.linear", call=1, scale=1.05)


def capture(path: Path, fault: bool) -> Path:
    """One step of a Linear-ReLU-Linear net, forward and backward; returns step0/rank0."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)
    planted = opdiff.testing.inject_fault(**FAULT) if fault else None
    if planted is not None:
        planted.__enter__()
    try:
        dbg = opdiff.PrecisionDebugger(dump_path=str(path), task="tensor")
        dbg.start()
        model(x).sum().backward()       # the user's line the report shows
        dbg.stop()
    finally:
        if planted is not None:
            planted.__exit__(None, None, None)
    return path / "step0" / "rank0"


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`opdiff ARGS...` in a fresh process with this checkout's opdiff."""
    env = dict(os.environ)
    src = str(Path(opdiff.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("COLUMNS", None)
    code = "import sys; from opdiff.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
