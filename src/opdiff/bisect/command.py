"""`opdiff compile-bisect -- python train.py ...`: the bisect with the user's unchanged command,
each run a fresh process.

    result = bisect_command(["python", "train.py", "--steps", "1"])

The command must call `torch.compile` and make an optimizer step (torch.optim). Each run is
judged by the gradients of its `step`-th optimizer step (`probe.py` takes them and ends the
run there): they hold everything the forward and the backward computed that reaches the loss.
The golden is the same command with TORCH_COMPILE_DISABLE=1 (torch.compile does nothing), run
twice to check that it is deterministic. The bisector's state lives in a private directory,
which every run also uses as its TORCHINDUCTOR_CACHE_DIR (that is where torch looks for it):
the user's own Inductor cache and bisect status are never touched.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

from ..comparison.verdicts import Policy
from .inprocess import BISECT_ENV, BisectInputError, golden_of, refuse_bisect_environment
from .judge import RunVerdict, judge
from .probe import ENV as PROBE_ENV
from .stages import StageResult, StepFailed, drive

SITE_DIR = str(Path(__file__).resolve().parent.parent / "launch" / "site")   # (shared with opdiff run)


class _Runs:
    """Runs the command with the probe, one result file and one log per run."""

    def __init__(self, cmd: list[str], step: int, workdir: Path, timeout: Optional[float]):
        self.cmd, self.step, self.workdir, self.timeout = cmd, step, workdir, timeout
        self.count = 0
        base = {k: v for k, v in os.environ.items()
                if k not in BISECT_ENV and k not in ("TORCH_COMPILE_BACKEND", "TORCH_COMPILE_DISABLE")}
        paths = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIR]
        base["PYTHONPATH"] = os.pathsep.join([SITE_DIR] + paths)
        self.base = base

    def __call__(self, env: dict[str, str]) -> tuple[Optional[dict[str, Any]], dict[str, str], str]:
        """(gradients, the probe's metadata, what went wrong) of one run; gradients None when
        the run failed or made no optimizer step."""
        from safetensors import safe_open

        self.count += 1
        out = self.workdir / f"run{self.count}.safetensors"
        logfile = self.workdir / f"run{self.count}.log"
        full = dict(self.base, **env)
        full[PROBE_ENV] = json.dumps({"out": str(out), "step": self.step})
        try:
            with open(logfile, "wb") as log:
                code = subprocess.run(self.cmd, env=full, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, timeout=self.timeout).returncode
        except OSError as exc:
            raise BisectInputError(f"cannot run '{self.cmd[0]}': {exc.strerror or exc}") from None
        except subprocess.TimeoutExpired:
            return None, {}, f"it ran past the {self.timeout:g} s timeout"
        if code != 0:
            return None, {}, f"exit status {code}: {_last_line(logfile)}"
        if not out.exists():
            return None, {}, (f"it made no optimizer step {self.step} (torch.optim) "
                              f"before it ended: {_last_line(logfile)}")
        with safe_open(str(out), "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {}), ""


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def bisect_command(cmd: list[str], *, step: int = 0, thresholds: Any = None,
                   timeout: Optional[float] = None,
                   progress: Optional[Callable[[str], None]] = None) -> StageResult:
    """Which compiler stage makes `cmd`'s compiled step differ from eager (see the module).

    step: which optimizer step is judged (from 0). thresholds: as `opdiff.compare`'s.
    timeout: seconds one run may take. Raises `BisectInputError` for a command that is
    missing, fails or makes no optimizer step in eager, is not deterministic or compiles nothing.
    """
    if not cmd:
        raise BisectInputError("compile-bisect needs a command after '--', e.g. "
                               "opdiff compile-bisect -- python train.py")
    refuse_bisect_environment()
    cmd = list(cmd)
    if cmd[0].endswith(".py") and not os.access(cmd[0], os.X_OK):
        cmd.insert(0, sys.executable)       # `compile-bisect -- train.py`, as `opdiff run` takes it
    policy = Policy(thresholds)
    workdir = Path(tempfile.mkdtemp(prefix="opdiff-bisect-"))
    state_dir = str(workdir / "inductor")
    runs = _Runs(cmd, step, workdir, timeout)
    try:
        eager = []
        for _ in range(2):
            grads, _meta, problem = runs({"TORCH_COMPILE_DISABLE": "1"})
            if grads is None:
                raise BisectInputError(f"the command fails in eager (torch.compile disabled): "
                                       f"{problem}")
            eager.append(grads)
        golden = golden_of(eager, policy, "the command")
        first = [True]

        def judged(env: dict[str, str]) -> RunVerdict:
            grads, meta, problem = runs(dict(env, TORCHINDUCTOR_CACHE_DIR=state_dir))
            if grads is None:
                where = " / ".join(v for k, v in env.items() if k.startswith("TORCH_BISECT_"))
                raise StepFailed(f"the compiled command failed under {where}: {problem}")
            if first[0]:
                first[0] = False
                if meta.get("frames") == "0":
                    raise BisectInputError("the command compiled nothing with torch.compile "
                                           f"before optimizer step {step}")
            return judge(grads, golden, policy)

        def run_once() -> RunVerdict:
            return judged(_bisector_env())

        return drive(run_once, state_dir=state_dir, confirm=judged, progress=progress)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _bisector_env() -> dict[str, str]:
    """What torch's own `run` mode hands its command for the bisector's current state
    (`python -m torch._inductor.compiler_bisector run`), read from the state files."""
    from torch._inductor.compiler_bisector import CompilerBisector as CB

    env: dict[str, str] = {}
    backend, subsystem = CB.get_backend(), CB.get_subsystem()
    if backend:
        env["TORCH_COMPILE_BACKEND"] = backend
        env["TORCH_BISECT_BACKEND"] = backend
    if backend and subsystem:
        env["TORCH_BISECT_SUBSYSTEM"] = subsystem
        if CB.get_run_state(backend, subsystem) == "test_disable":
            env["TORCH_BISECT_MAX"] = "-1"      # off: every application counts past -1
    return env


__all__ = ["bisect_command", "SITE_DIR"]
