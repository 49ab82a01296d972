"""The runnable examples of the docs run: every code block fenced as ```python title="runnable"```
is executed, the blocks of one page in order in one fresh process, in an empty directory."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = re.compile(r'^```python title="runnable"\n(.*?)^```', re.S | re.M)


def runnable_blocks(text: str) -> list[str]:
    return RUNNABLE.findall(text)


PAGES = [p for p in sorted((ROOT / "docs").rglob("*.md")) if runnable_blocks(p.read_text(encoding="utf-8"))]


def test_the_docs_hold_runnable_examples():
    assert PAGES, 'no ```python title="runnable"``` block in docs/'
    assert runnable_blocks('x\n```python title="runnable"\nprint(1)\n```\n') == ["print(1)\n"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_examples_run(page, tmp_path):
    script = "\n".join(runnable_blocks(page.read_text(encoding="utf-8")))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"{page.relative_to(ROOT)}'s runnable example failed:\n{proc.stderr[-3000:]}"
