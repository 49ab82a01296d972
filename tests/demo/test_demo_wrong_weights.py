"""`opdiff demo --scenario wrong-weights` through the command line: golden and target run in two
processes from two checkpoints that differ in one weight element (off by 1e-2, a conversion
bug); the verdict names the parameter by its FQN and the first op that reads it, no op's
arithmetic."""
from __future__ import annotations

import contextlib
import io
import json
import os

import pytest

from opdiff.cli import main
from opdiff.demo import models
from opdiff.demo.origin_stories import SPOIL, SPOILED

from .helpers import model_line

READER = "Functional.conv3d.4.forward"     # the fifth convolution: layers.1.conv2


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("wrong-weights") / "demo"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["demo", "--scenario", "wrong-weights", "-o", str(out)])
    return {"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue(), "out": out}


def _summary(demo) -> dict:
    return json.loads((demo["out"] / "summary.json").read_text())


@pytest.mark.slow
def test_the_origin_is_the_converted_parameter_read_by_its_convolution(demo):
    assert demo["code"] == 0, demo["stderr"]
    fd = _summary(demo)["first_divergence"]
    assert (fd["origin"], fd["tensor"]) == ("parameter", SPOILED)
    assert (fd["name"], fd["op"], fd["phase"]) == (READER, "Functional.conv3d", "forward")
    assert fd["step"] == 0 and fd["rank"] == 0
    assert "differs before any op" in fd["reason"]
    assert os.path.samefile(fd["location"]["file"], models.__file__)
    assert fd["location"]["line"] == model_line(models.BasicBlock3d, "out = self.conv2(out)")
    assert fd["metrics"]["MaxAbsErr"] == pytest.approx(SPOIL, rel=1e-3)


@pytest.mark.slow
def test_two_processes_two_checkpoints_and_the_reports(demo):
    out = demo["out"]
    import torch

    golden = torch.load(out / "checkpoint" / "golden.pt", weights_only=True)
    converted = torch.load(out / "checkpoint" / "converted.pt", weights_only=True)
    differ = {k for k in golden if not torch.equal(golden[k], converted[k])}
    assert differ == {SPOILED}
    assert int((golden[SPOILED] != converted[SPOILED]).sum()) == 1
    for side in ("golden", "target"):
        assert (out / "dump" / side / "step0" / "rank0" / "records.jsonl").is_file()
    html = (out / "report.html").read_text(encoding="utf-8")
    assert SPOILED in html and READER in html
    text = demo["stdout"]
    assert "Golden run, in its own process" in text and "Target run, in another process" in text
    assert f"parameter {SPOILED} differs before any op uses it" in text
    assert f"✔ opdiff named the converted weight, parameter {SPOILED}" in text
    assert "Traceback" not in demo["stderr"]


@pytest.mark.slow
def test_no_op_is_an_error_besides_the_origin(demo):
    with open(demo["out"] / "rows.jsonl", encoding="utf-8") as f:
        fields = json.loads(f.readline())["fields"]
        rows = [dict(zip(fields, json.loads(line))) for line in f]
    errors = [r["target_name"] for r in rows if r["result"] == "error"]
    assert errors == [f"Parameter.{SPOILED}.0.forward.output.0"]
