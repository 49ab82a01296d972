"""A run that raised is said as such, with its exception, not as "killed ... (or is still
writing)" (issue 46, item 10): before its first op (the dump holds none), and mid-step once
some records are on disk; a run that ended without closing its step says that. Real processes
of a real model, ended by a real exception."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import opdiff
from opdiff import schemas
from opdiff.errors import DumpError

TRAIN = textwrap.dedent("""
    import sys
    import torch
    import opdiff

    dump, mode = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    dbg = opdiff.PrecisionDebugger(dump_path=dump, task="statistics", level="L1")
    dbg.start(model)
    if mode == "raise-first":
        model(torch.randn(8, 15))          # wrong width: the first op raises
    x = torch.randn(8, 16)
    for _ in range(150):                   # 600 records: more than one flush reaches the disk
        x = torch.nn.functional.pad(model(x), (0, 12))
    if mode == "raise-later":
        model(torch.randn(8, 15))
    if mode == "exit":
        sys.exit(0)                        # ends without stop()/step()
    dbg.stop()
    dbg.step()
""")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("raised")
    script = root / "train.py"
    script.write_text(TRAIN)
    out = {}
    for mode in ("full", "raise-first", "raise-later", "exit"):
        p = subprocess.run([sys.executable, str(script), str(root / mode), mode],
                           capture_output=True, text=True, timeout=300, env=dict(os.environ))
        assert (p.returncode != 0) == mode.startswith("raise"), p.stderr
        out[mode] = root / mode
    return out


def test_a_run_that_raised_before_its_first_op_says_which_exception(runs):
    with pytest.raises(DumpError) as caught:
        opdiff.compare(runs["raise-first"], runs["full"], replay="off")
    said = str(caught.value)
    assert "holds no op records: the run raised RuntimeError: mat1 and mat2 shapes cannot be " \
           "multiplied" in said, said
    assert "killed" not in said and "still writing" not in said


def test_a_run_that_raised_mid_step_says_where_and_which_exception(runs, tmp_path):
    result = opdiff.compare(runs["raise-later"], runs["full"], output_path=tmp_path,
                            replay="off")
    assert result.verdict.startswith("inconclusive: step 0 rank 0: the target dump was cut at "
                                     "record "), result.verdict
    assert "the run raised RuntimeError: mat1 and mat2 shapes" in result.verdict
    assert "killed" not in result.verdict
    summary = json.loads((tmp_path / "summary.json").read_text())
    schemas.validate("compare-summary", summary)
    cut = summary["pairs"][0]["cut"][0]
    assert cut["why"] == "raised" and cut["error"].startswith("RuntimeError: mat1 and mat2")


def test_a_run_that_ended_without_closing_its_step_says_so(runs):
    result = opdiff.compare(runs["exit"], runs["full"], replay="off")
    assert "ended there without closing the step" in result.verdict, result.verdict
    assert "killed" not in result.verdict
