"""`opdiff demo` (the default, seed 000's story) through the command line, checked against the
fault it plants: the first divergence must be the faulty block's `+=`, at its source line."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os

import pytest

from opdiff.cli import main
from opdiff.demo import models
from opdiff.report import outputs

from .helpers import model_line, needs_demo_as_user_code

CULPRIT = "Tensor.__iadd__.2.forward"      # the third `+=`: residual block layers.2


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """Run `opdiff demo` with no arguments in a fresh working directory."""
    cwd = tmp_path_factory.mktemp("iadd")
    old = os.getcwd()
    os.chdir(cwd)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["demo"])
    finally:
        os.chdir(old)
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(),
            "out": cwd / "opdiff-demo"}


def _summary(demo) -> dict:
    return json.loads((demo["out"] / "summary.json").read_text())


@needs_demo_as_user_code
def test_exit_code_and_default_output_directory(demo):
    assert demo["code"] == 0, demo["stderr"]
    out = demo["out"]
    assert "dump/golden/step0/rank0/records.jsonl" in outputs.written(out)   # opdiff's, proven
    for side in ("golden", "target"):
        assert (out / "dump" / side / "step0" / "rank0" / "records.jsonl").is_file()
        assert not (out / "dump" / side / "step1").exists()     # only step 0 is recorded


@needs_demo_as_user_code
def test_first_divergence_is_the_planted_iadd_at_its_source_line(demo):
    fd = _summary(demo)["first_divergence"]
    assert fd is not None, "the planted fault was not found"
    assert (fd["name"], fd["op"], fd["phase"]) == (CULPRIT, "Tensor.__iadd__", "forward")
    assert fd["module"] == "Module.layers.2.BasicBlock3d.forward.0"
    loc = fd["location"]
    assert os.path.samefile(loc["file"], models.__file__)
    assert loc["line"] == model_line(models.BasicBlock3d, "out += residual")
    assert loc["code"].strip() == "out += residual"
    # Why: the inputs (bn2's output and the residual) agree, the output does not.
    assert fd["input_metrics"]["Cosine"] > 0.999999
    assert fd["metrics"]["MaxRelativeErr"] == pytest.approx(1e-3, rel=0.05)


@needs_demo_as_user_code
def test_csv_agrees_with_summary_and_shows_seed_000s_finding(demo):
    csvs = sorted(demo["out"].glob("compare_result_*.csv"))
    assert len(csvs) == 1
    with open(csvs[0], newline="", encoding="utf-8") as f:
        rows = {r["NPU Name"]: r for r in csv.DictReader(f)}
    # The inputs of the culprit (bn2's output, the residual) pass; its output fails.
    assert rows[f"{CULPRIT}.input.0"]["Accuracy Reached or Not"] == "Yes"
    assert rows[f"{CULPRIT}.input.1"]["Accuracy Reached or Not"] == "Yes"
    assert rows[f"{CULPRIT}.output.0"]["Accuracy Reached or Not"] == "No"
    # Every `+=` before the faulty one agrees exactly.
    for k in range(2):
        assert float(rows[f"Tensor.__iadd__.{k}.forward.output.0"]["MaxAbsErr"]) == 0.0
    summary = _summary(demo)
    assert summary["files"]["csv"] == str(csvs[0])
    assert summary["counts"]["error"] >= 1


@needs_demo_as_user_code
def test_report_html_is_written_and_names_the_culprit(demo):
    html = (demo["out"] / "report.html").read_text(encoding="utf-8")
    assert html.lstrip().lower().startswith("<!doctype html")
    assert CULPRIT in html and "out += residual" in html


@needs_demo_as_user_code
def test_story_verdict_files_and_next_commands_are_printed(demo):
    text = demo["stdout"]
    for step in ("1. Built a 3D-ResNet", "2. Golden run", "3. Target run", "4. Compared"):
        assert step in text
    assert text.index("2. Golden run") < text.index("3. Target run") < text.index("4. Compared")
    assert f"First divergence: {CULPRIT}" in text
    assert "out += residual" in text and "inputs agree" in text
    assert f"✔ opdiff named the planted fault, {CULPRIT}" in text
    assert "summary.json" in text and "report.html" in text
    assert 'opdiff.PrecisionDebugger(dump_path="./dump/target", level="mix")' in text
    assert "opdiff compare ./dump/target ./dump/golden -o ./out" in text
    assert "Traceback" not in demo["stderr"]
