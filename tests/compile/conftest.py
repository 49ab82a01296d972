"""Steps of a tiny Llama, eager and under torch.compile, made once per test session and shared
by tests/compile/test_*.py.

    def test_x(compiled_step):
        golden = compiled_step("L2")                          # eager, dumped at L2
        target = compiled_step("L2", "aot_eager", "silu:1")   # compiled, silu's 2nd call spoiled
        plain = compiled_step(None, "aot_eager")              # compiled, no opdiff
        tensors = compiled_step("L2", "aot_eager", task="tensor")

Each returns a `compilekit.Step` (loss, gradients, dynamo counters, dump path).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import pytest

from compilekit import Step, run_step


@pytest.fixture(scope="session")
def compiled_step(tmp_path_factory) -> Callable[..., Step]:
    made: dict[tuple, Step] = {}
    root = tmp_path_factory.mktemp("compile")

    def get(level: Optional[str], backend: Optional[str] = None,
            fault: Optional[str] = None, task: str = "statistics") -> Step:
        key = (level, backend, fault, task)
        if key not in made:
            path: Optional[Path] = None
            if level is not None:
                path = root / "_".join(str(k).replace(":", "-") for k in key)
            made[key] = run_step(path, level or "L2", backend, fault, task)
        return made[key]

    return get
