"""The design's localisation bar on the demo's own stories: a planted fp32 fault of relative
size 1e-4 (ten times smaller than the demo plants) is still named as the first divergence."""
from __future__ import annotations

import pytest

from opdiff.demo import scenarios

from .helpers import needs_demo_as_user_code, play


@pytest.mark.parametrize("scenario,culprit", [
    pytest.param("iadd", "Tensor.__iadd__.2.forward", marks=needs_demo_as_user_code),
    ("lstm-backward", "VF.lstm.0.backward"),
])
def test_a_1e4_fault_is_named(tmp_path, monkeypatch, scenario, culprit):
    monkeypatch.setattr(scenarios, "FAULT_SIZE", 1e-4)
    result, text = play(scenario, tmp_path / "out")
    fd = result.compare.first_divergence
    assert fd is not None and fd.name == culprit
    assert fd.metrics["MaxRelativeErr"] == pytest.approx(1e-4, rel=0.05)
    assert "off by 0.0001" in text or "1 + 0.0001" in text
