"""Capture hooks into Inductor when the program first imports it, not before: a fresh process
whose first `torch.compile` call is inside the debugger's window still has its kernels recorded
(with their programs, in a tensor dump), and a run that never compiles never imports Inductor
(about a second: capture/imports.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import opdiff

    inductor = lambda: "torch._inductor.codecache" in sys.modules
    path = sys.argv[1]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    seen = {"at_start": inductor()}
    with opdiff.dump(model, path + "/eager", level="L2", task="tensor"):
        model(x).sum().backward()
    seen["after_eager"] = inductor()
    with opdiff.dump(model, path + "/compiled", level="L2", task="tensor"):
        torch.compile(model)(x).sum().backward()     # the process's first torch.compile
    seen["hooks_left"] = [type(f).__name__ for f in sys.meta_path if "opdiff" in type(f).__module__]
    print(json.dumps(seen))
""")


@pytest.mark.slow
def test_kernels_are_recorded_when_the_first_compile_is_inside_the_window(tmp_path: Path):
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"),
               TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    src = Path(__file__).resolve().parents[2] / "src"
    env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    # an eager run never pays for importing Inductor; the finder is gone after the window
    assert seen == {"at_start": False, "after_eager": False, "hooks_left": []}, seen
    lines = (tmp_path / "compiled" / "step0" / "rank0" / "records.jsonl").read_text()
    kernels = [r for r in map(json.loads, lines.splitlines()) if r["kind"] == "kernel"]
    phases = {r["phase"] for r in kernels}
    assert any("silu" in r["op"] for r in kernels) and phases == {"forward", "backward"}, \
        [r["name"] for r in kernels]
    # generated while opdiff recorded: each kernel knows what it computes
    assert all("steps" in r.get("program", {}) for r in kernels), \
        [r.get("program") for r in kernels]
