"""Scenario bf16-healthy: bf16 autocast against fp32 differs everywhere and nothing is broken.
The compare must not name a culprit (the design's "must not cry wolf")."""
from __future__ import annotations

import json

import pytest

from .helpers import play


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return play("bf16-healthy", tmp_path_factory.mktemp("bf16") / "out")


def test_target_really_ran_in_bf16_and_differs_almost_everywhere(demo):
    result, _ = demo
    rows = result.compare.rows
    # Autocast ran the convolutions and linear layers in bf16; golden never left fp32.
    conv = [r for r in rows if r.op_name.startswith("Functional.conv3d.")
            and r.role == "output" and r.phase == "forward"]
    assert conv and all((r.target_dtype, r.golden_dtype) == ("bfloat16", "float32") for r in conv)
    assert {r.golden_dtype for r in rows} <= {"float32", "int64", None}
    measured = [r for r in rows if r.error is not None]
    differ = [r for r in measured if r.error > 0]
    assert len(differ) > 0.5 * len(measured)
    assert result.losses["target"] != result.losses["golden"]
    assert result.expected is None                       # nothing was planted


def test_no_culprit_is_named(demo):
    result, text = demo
    assert result.compare.first_divergence is None
    summary = json.loads((result.output / "summary.json").read_text())
    assert summary["first_divergence"] is None
    assert result.found and "no op is to blame" in text


def test_reports_are_written(demo):
    result, _ = demo
    assert (result.output / "summary.json").is_file() and (result.output / "report.html").is_file()
