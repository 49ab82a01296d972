"""Which compiler stage makes a compiled step differ from eager: torch's `CompilerBisector`
judged by opdiff's verdict (`opdiff compile-bisect`, `opdiff.compile_bisect`).

- `judge.py`: one run against the eager golden, every tensor by what its dtype allows;
- `stages.py`: driving the bisector, the answer in words, the settings that reproduce it;
- `inprocess.py`: `compile_bisect(step)`, the step run in this process;
- `command.py`: `bisect_command(cmd)`, a command run in fresh processes, judged by the
  gradients of one optimizer step, which `probe.py` takes in each of them (started by
  `site/sitecustomize.py`: this package must not import torch when imported).
"""
from __future__ import annotations

from typing import Any

__all__ = ["compile_bisect", "bisect_command", "BisectInputError", "StageResult"]


def __getattr__(name: str) -> Any:
    if name in ("compile_bisect", "BisectInputError"):
        from . import inprocess
        return getattr(inprocess, name)
    if name == "bisect_command":
        from .command import bisect_command
        return bisect_command
    if name == "StageResult":
        from .stages import StageResult
        return StageResult
    raise AttributeError(f"module 'opdiff.bisect' has no attribute {name!r}")
