"""One run on its own (a real 100-step training): a NaN planted in one module's output at step
70 is reported at step 70 in that module, an activation spike at step 70 where it starts, and a
healthy run raises nothing."""
from __future__ import annotations

import json

import pytest

from opdiff.trend import trend

from .training import train

STEPS, AT = 100, 70


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("alerts")
    train(root / "healthy", STEPS)
    train(root / "nan", STEPS, fault="nan", fault_step=AT)
    train(root / "spike", STEPS, fault="spike", fault_step=AT)
    return root


def test_nan_is_reported_at_its_step_in_the_first_module_in_forward_order(root, tmp_path):
    result = trend(root / "nan", output=tmp_path)
    nan = [a for a in result.alerts if a.kind in ("nan", "inf")]
    assert len(nan) == 1
    a = nan[0]
    assert (a.kind, a.step, a.module, a.phase) == ("nan", AT, "blocks.1.fc1", "forward")
    assert "1 NaN" in a.reason and "every module before it was finite" in a.reason
    assert result.found and result.verdict == "alert"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["first_divergence"] is None
    assert summary["alerts"][0]["module"] == "blocks.1.fc1"
    # The op-level follow-up: the overflow check of that step, which stops at the origin op.
    config = json.loads((tmp_path / "next_dump.json").read_text())
    assert config["task"] == "overflow_check" and config["step"] == [AT]


def test_spike_is_reported_where_it_starts(root):
    result = trend(root / "spike")
    spikes = [a for a in result.alerts if a.kind == "spike"]
    assert [(a.step, a.module) for a in spikes] == [(AT, "blocks.1.fc2")]
    assert not result.problems and not result.found          # a spike is not a failure
    assert "x the median of steps" in spikes[0].reason


def test_a_healthy_run_raises_nothing(root, tmp_path):
    result = trend(root / "healthy", output=tmp_path)
    assert result.alerts == [] and result.verdict == "clean"
    assert result.message == f"no inf/NaN and no spike in {STEPS} steps"
    assert not (tmp_path / "next_dump.json").exists()
    assert (tmp_path / "trend.html").is_file()


def test_two_runs_also_list_each_runs_alerts(root):
    result = trend(root / "nan", root / "healthy")
    assert result.first_divergence is not None and result.first_divergence.step == AT
    assert result.first_divergence.module == "blocks.1.fc1"
    assert [(a.run, a.kind, a.step) for a in result.alerts if a.kind == "nan"] == \
        [("target", "nan", AT)]
