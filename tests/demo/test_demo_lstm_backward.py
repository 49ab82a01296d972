"""Scenario lstm-backward (seed 001): an LSTM whose backward is wrong while its forward is right.
The compare must name VF.lstm's backward as the culprit, and nothing in the forward."""
from __future__ import annotations

import json

import pytest

from opdiff.demo import _demo_process_state, scenarios

from .helpers import play

CULPRIT = "VF.lstm.0.backward"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return play("lstm-backward", tmp_path_factory.mktemp("lstm") / "out")


def test_forward_is_exact_and_the_fault_shows_from_the_lstm_backward_on(demo):
    result, _ = demo
    golden, target = result.losses["golden"], result.losses["target"]
    assert target[0] == golden[0]            # step 0's forward is untouched by the fault
    assert target[1] != golden[1]            # the wrong gradients changed the weights
    rows = result.compare.rows
    forward = [r for r in rows if r.op_name == "VF.lstm.0.forward"]
    assert forward and all(r.metrics.get("MaxAbsErr") == 0.0 for r in forward)
    faulty = [r for r in rows if r.target_name and r.target_name.startswith(f"{CULPRIT}.output.")]
    assert faulty and all(r.error == pytest.approx(1e-3, rel=0.02) for r in faulty)
    # The gradient flowing into the LSTM's backward agrees exactly: the error starts there.
    incoming = [r for r in rows if r.target_name and r.target_name.startswith(f"{CULPRIT}.input.")]
    assert incoming and all(r.metrics.get("MaxAbsErr") == 0.0 for r in incoming)


def test_first_divergence_is_the_lstm_backward(demo):
    result, text = demo
    fd = result.compare.first_divergence
    assert fd is not None
    assert (fd.name, fd.op, fd.phase) == (CULPRIT, "VF.lstm", "backward")
    summary = json.loads((result.output / "summary.json").read_text())
    assert summary["first_divergence"]["name"] == CULPRIT
    assert result.found and f"✔ opdiff named the planted fault, {CULPRIT}" in text


def test_recording_did_not_change_the_training(demo):
    """The losses the story prints are the ones the runs give without opdiff recording them."""
    result, _ = demo
    fault = dict(op="VF.lstm", call=0, phase="backward", scale=1 + scenarios.FAULT_SIZE)
    with _demo_process_state():      # the same threads and determinism as the demo ran with
        model, batch = scenarios.seeded_lstm()
        assert scenarios.train(model, batch) == result.losses["golden"]
        model, batch = scenarios.seeded_lstm()
        assert scenarios.train(model, batch, fault=fault) == result.losses["target"]


def test_reports_are_written(demo):
    result, text = demo
    out = result.output
    assert len(list(out.glob("compare_result_*.csv"))) == 1
    assert (out / "summary.json").is_file() and (out / "report.html").is_file()
    assert "4. Compared target with golden" in text
