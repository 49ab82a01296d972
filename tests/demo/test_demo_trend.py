"""Scenario trend (seed 001's first question): two monitored trainings part at step 30; trend
names the step and the module, and the op-level dump it configures names the kernel."""
from __future__ import annotations

import json

import pytest

from .helpers import play


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return play("trend", tmp_path_factory.mktemp("trend") / "out")


def test_trend_names_the_step_and_module_then_compare_names_the_op(demo):
    result, text = demo
    fd = result.trend.first_divergence
    assert (fd.step, fd.module, fd.phase) == (30, "blocks.1.act", "forward")
    assert "the runs were bitwise equal in steps 0-29" in fd.reason
    assert result.compare.first_divergence.name == "Functional.gelu.1.forward"
    assert result.found and "✔ trend named step 30 and blocks.1.act" in text
    assert "✘" not in text


def test_the_losses_look_alike_to_the_eye(demo):
    result, _ = demo
    golden, target = result.losses["golden"], result.losses["target"]
    assert golden[:30] == target[:30] and golden[30:] != target[30:]
    assert abs(golden[-1] - target[-1]) < 1e-3 * abs(golden[-1])


def test_files_a_user_gets(demo):
    result, _ = demo
    out = result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first_divergence"]["step"] == 30
    assert json.loads((out / "next_dump.json").read_text())["step"] == [30]
    assert (out / "trend.html").read_text().count("<svg") >= 4
    assert sorted(p.name for p in (out / "dump" / "target").iterdir()) == ["step30"]
    assert result.seconds < 60
