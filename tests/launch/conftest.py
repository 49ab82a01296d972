"""The `opdiff_run` fixture: `opdiff run ARGS` in a fresh directory (see tests/runkit.py)."""
from __future__ import annotations

import pytest
from runkit import run


@pytest.fixture
def opdiff_run(tmp_path):
    """opdiff_run(opdiff run's arguments..., input=None, **env) -> CompletedProcess, in tmp_path."""
    def go(*args: str, input: str | None = None, **extra: str):
        return run(["-m", "opdiff", "run", *args], tmp_path, input=input, **extra)
    return go
