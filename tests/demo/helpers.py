"""Helpers for the demo tests: play a scenario, find a line of the demo models."""
from __future__ import annotations

import inspect
import io

import pytest
from rich.console import Console

from opdiff.demo import models
from opdiff.store.frames import is_internal

# The demo's models live inside the opdiff package; capture must treat them as user code to
# name their `+=` (Tensor.__iadd__) and to point locations at their lines.
CAPTURE_SEES_DEMO = not is_internal(models.__file__)
needs_demo_as_user_code = pytest.mark.xfail(
    not CAPTURE_SEES_DEMO, strict=True,
    reason="capture skips src/opdiff/demo/ frames as opdiff internals: the demo must register "
           "its folder as user code (store.frames.register_user_code)")


def model_line(cls, text: str) -> int:
    """Line number in models.py of the first line of `cls` whose code is `text`."""
    lines, start = inspect.getsourcelines(cls)
    for i, line in enumerate(lines):
        if line.strip() == text:
            return start + i
    raise LookupError(text)


def play(scenario: str, output):
    """Run a scenario through the library; returns (DemoResult, printed text)."""
    import opdiff.demo

    buffer = io.StringIO()
    console = Console(file=buffer, width=120, highlight=False, color_system=None)
    result = opdiff.demo.run(scenario, output=output, console=console)
    return result, buffer.getvalue()
