"""`opdiff demo --scenario dropout` through the command line: the target script seeds the
generator again after building the model, so its dropout masks differ; the verdict names the
dropout call as a random origin and points to opdiff.seed_all."""
from __future__ import annotations

import contextlib
import io
import json
import os

import pytest

from opdiff.cli import main
from opdiff.demo import models

from .helpers import model_line

DROPOUT = "Functional.dropout.0.forward"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("dropout") / "demo"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["demo", "--scenario", "dropout", "-o", str(out)])
    return {"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue(), "out": out}


@pytest.mark.slow
def test_the_origin_is_random_and_points_to_seed_all(demo):
    assert demo["code"] == 0, demo["stderr"]
    fd = json.loads((demo["out"] / "summary.json").read_text())["first_divergence"]
    assert (fd["origin"], fd["name"], fd["op"]) == ("random", DROPOUT, "Functional.dropout")
    assert "opdiff.seed_all" in fd["reason"] and "another state" in fd["reason"]
    assert os.path.samefile(fd["location"]["file"], models.__file__)
    assert fd["location"]["line"] == model_line(models.DropoutClassifier,
                                                "return self.fc2(self.drop(hidden))")
    # everything before the dropout agrees exactly: the same weights and data
    with open(demo["out"] / "rows.jsonl", encoding="utf-8") as f:
        fields = json.loads(f.readline())["fields"]
        rows = [dict(zip(fields, json.loads(line))) for line in f]
    first = next(i for i, r in enumerate(rows) if r["op_name"] == DROPOUT)
    assert first > 0 and all(r["error"] == 0 for r in rows[:first] if r["error"] is not None)
    # the dropout's own row says why, as the divergence does: its draws, not a local error
    blamed = [r for r in rows if r["op_name"] == DROPOUT and r["result"] == "error"]
    assert blamed and all(r["reason"].startswith("random draws differ") for r in blamed)
    assert not any("local error" in (r["reason"] or "") for r in blamed)


@pytest.mark.slow
def test_the_story_and_the_report(demo):
    text = demo["stdout"]
    assert "torch.manual_seed(4321)" in text and "Target run, in another process" in text
    assert f"First divergence: {DROPOUT}" in text
    assert f"✔ opdiff named the random origin, {DROPOUT}" in text
    html = (demo["out"] / "report.html").read_text(encoding="utf-8")
    assert DROPOUT in html and "opdiff.seed_all" in html
    assert "Traceback" not in demo["stderr"]
