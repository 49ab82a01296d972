"""Dumps of tiny Hugging Face models whose two runs execute different attention ops (eager
against SDPA), made once per test session and shared by tests/comparison/test_regions*.py.

    def test_x(hf_dump):
        golden = hf_dump("llama", "eager", "statistics")
        target = hf_dump("llama", "sdpa", "statistics", fault="Functional.silu:1", bf16=True)

Models are built from configs (nothing downloaded): 2 layers, hidden 32, eval mode, the same
seed on both sides, one forward and backward under `opdiff.dump(level="mix")`. A fault is
planted below the recorder with `opdiff.testing.inject_fault` (op:call, scale 1.02).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import pytest

from regionkit import make_dump


@pytest.fixture(scope="session")
def hf_dump(tmp_path_factory) -> Callable[..., Path]:
    made: dict[tuple, Path] = {}
    root = tmp_path_factory.mktemp("regions")

    def get(family: str, impl: str, task: str, fault: Optional[str] = None,
            bf16: bool = False, noise: float = 0.0, renamed: bool = False) -> Path:
        key = (family, impl, task, fault, bf16, noise, renamed)
        if key not in made:
            name = "_".join(str(k).replace(":", "-").replace(".", "-") for k in key)
            made[key] = make_dump(root / name, *key)
        return made[key]

    return get
