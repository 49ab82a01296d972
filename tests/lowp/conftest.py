"""Dumps of the tiny Llama of fp8kit.py, bf16 and emulated FP8, made once per test session."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import pytest

from fp8kit import make_dump


@pytest.fixture(scope="session")
def fp8_dump(tmp_path_factory) -> Callable[..., Path]:
    made: dict[tuple, Path] = {}
    root = tmp_path_factory.mktemp("fp8")

    def get(precision: str, plant: Optional[str] = None) -> Path:
        key = (precision, plant)
        if key not in made:
            name = "_".join(str(k).replace(":", "-").replace(".", "-") for k in key)
            made[key] = make_dump(root / name, precision, plant)
        return made[key]

    return get
