"""Statistics-only dumps (task="statistics", the default): healthy bf16 autocast names nothing,
faults large enough for statistics to see are named, and the result says what it cannot see.

Real runs of the tiny CNN, LSTM and transformer of tests/replay/replay_models.py, trained with
SGD for a few steps (the bf16 and fp32 weights drift apart after the first step, which is when
statistics used to cry wolf).
"""
import contextlib
import json
import sys
from pathlib import Path

import pytest
import torch

import opdiff
import opdiff.testing
from opdiff.comparison.verdicts import Policy, Thresholds
from opdiff.errors import ConfigError

sys.path.insert(0, str(Path(__file__).parent / "replay"))
from replay_models import make  # noqa: E402  (the models the replay tests use)

MODELS = ("cnn", "lstm", "transformer")


def train(name, path, *, bf16=False, fault=None, steps=(0,)):
    """SGD steps of one model, dumping `steps` with task="statistics" at level mix.
    bf16: autocast (the LSTM, which CPU autocast does not cover, runs in bf16 outright);
    fault: inject_fault arguments, planted afresh in every step."""
    model, x = make(name)
    if bf16 and name == "lstm":
        model, x = model.bfloat16(), x.bfloat16()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dbg = opdiff.PrecisionDebugger(dump_path=str(path), task="statistics", level="mix",
                                   step=list(steps))
    for _ in range(max(steps) + 1):
        planted = opdiff.testing.inject_fault(**fault) if fault else contextlib.nullcontext()
        with planted:
            dbg.start(model)
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16 and name != "lstm"):
                out = model(x)
            out.float().pow(2).mean().backward()
            optimizer.step()
            dbg.stop()
            dbg.step()
        if fault:
            assert planted.hits == 1, f"the fault on {fault['op']} fired {planted.hits} times"
    return path


@pytest.fixture(scope="module")
def goldens(tmp_path_factory):
    root = tmp_path_factory.mktemp("gold")
    for name in MODELS:
        train(name, root / name, steps=(0, 2))
    return root


def _statistics_note(result):
    return next((n for n in result.notes if "statistics only" in n), None)


@pytest.mark.parametrize("name", MODELS)
def test_healthy_bf16_names_nothing_and_says_what_statistics_cannot_see(goldens, tmp_path, name):
    train(name, tmp_path / "t", bf16=True, steps=(0, 2))
    result = opdiff.compare(tmp_path / "t", goldens / name)
    assert result.first_divergence is None, result.verdict
    assert result.counts["error"] == 0 and result.counts["warning"] > 0
    assert [p["first_divergence"] for p in result.pairs] == [None, None]
    note = _statistics_note(result)
    assert note is not None, result.notes
    assert "0.8% (its norm) or 2% (its max, min or mean) in forward, 50% in backward" in note
    assert "bfloat16 rounding" in note
    assert "task='tensor'" in note
    assert "as far as statistics can tell" in result.verdict


def test_limits_reach_the_summary_and_the_html_report(goldens, tmp_path):
    train("cnn", tmp_path / "t", bf16=True)
    result = opdiff.compare(tmp_path / "t", goldens / "cnn" / "step0" / "rank0",
                            output_path=tmp_path / "out")
    note = _statistics_note(result)
    assert note is not None and note.startswith("statistics only")
    summary = json.loads(Path(result.files["summary"]).read_text())
    assert note in summary["notes"]
    assert "cannot be told apart from bfloat16 rounding" in Path(result.files["html"]).read_text()


def test_tensor_dumps_get_no_statistics_note(tmp_path):
    for side in ("t", "g"):
        model, x = make("cnn")
        with opdiff.dump(model, tmp_path / side, level="L1", task="tensor"):
            model(x).sum().backward()
    result = opdiff.compare(tmp_path / "t", tmp_path / "g", replay="off")
    assert _statistics_note(result) is None and result.first_divergence is None
    assert "statistics" not in result.verdict


FP32_FORWARD = [("cnn", "Functional.conv2d", 2), ("cnn", "Functional.batch_norm", 1),
                ("cnn", "Tensor.__iadd__", 0), ("lstm", "VF.lstm", 0),
                ("transformer", "Functional.layer_norm", 1),
                ("transformer", "Functional.multi_head_attention_forward", 1)]


@pytest.mark.parametrize("name,op,call", FP32_FORWARD)
def test_fp32_forward_fault_of_1e4_is_named(goldens, tmp_path, name, op, call):
    train(name, tmp_path / "t", fault=dict(op=op, call=call, phase="forward", scale=1 + 1e-4))
    fd = opdiff.compare(tmp_path / "t", goldens / name / "step0" / "rank0").first_divergence
    assert fd is not None and fd.name == f"{op}.{call}.forward", fd
    assert "judged from statistics only" in fd.reason and fd.location is not None


@pytest.mark.parametrize("name,op,call", [("cnn", "Functional.relu", 3),
                                          ("transformer", "Functional.linear", 2)])
def test_fp32_backward_fault_of_1e4_is_named(goldens, tmp_path, name, op, call):
    train(name, tmp_path / "t", fault=dict(op=op, call=call, phase="backward", scale=1 + 1e-4))
    fd = opdiff.compare(tmp_path / "t", goldens / name / "step0" / "rank0").first_divergence
    assert fd is not None and fd.name == f"{op}.{call}.backward", fd


@pytest.mark.parametrize("name,op,call,phase,scale", [
    ("cnn", "Functional.conv2d", 2, "forward", 1.01),
    ("transformer", "Functional.layer_norm", 1, "forward", 1.01),
    ("cnn", "Functional.conv2d", 2, "forward", 1.05),
    ("lstm", "VF.lstm", 0, "forward", 1.05),
    ("transformer", "Functional.linear", 0, "forward", -1.0),
    ("cnn", "Functional.batch_norm", 1, "backward", 2.0),
    ("transformer", "Functional.layer_norm", 1, "backward", 2.0)])
def test_bf16_fault_statistics_can_see_is_named(goldens, tmp_path, name, op, call, phase, scale):
    train(name, tmp_path / "t", bf16=True,
          fault=dict(op=op, call=call, phase=phase, scale=scale))
    result = opdiff.compare(tmp_path / "t", goldens / name / "step0" / "rank0")
    fd = result.first_divergence
    assert fd is not None and fd.name == f"{op}.{call}.{phase}", result.verdict


def test_bf16_backward_fault_below_what_statistics_resolve_is_not_pinned_on_another_op(
        goldens, tmp_path):
    # 5% off in the backward of BatchNorm: healthy bf16 gradients differ from fp32 by as much,
    # so statistics cannot find it; the compare must not blame some other op instead, and must
    # say where its sight ends.
    train("cnn", tmp_path / "t", bf16=True,
          fault=dict(op="Functional.batch_norm", call=1, phase="backward", scale=1.05))
    result = opdiff.compare(tmp_path / "t", goldens / "cnn" / "step0" / "rank0")
    assert result.first_divergence is None, result.verdict
    assert "50% in backward" in _statistics_note(result)


def test_statistics_floors_are_thresholds_a_user_can_set():
    policy = Policy({"statistics_backward_tolerance": {"bf16": 0.3}, "statistics_small_numel": 16})
    assert policy.statistics_tolerance_for("torch.bfloat16", "torch.float32", "backward") == 0.3
    assert policy.statistics_tolerance_for("torch.bfloat16", "torch.float32", "backward",
                                           numel=8) == pytest.approx(0.6)
    assert policy.statistics_tolerance_for("torch.float32", "torch.float32", "forward",
                                           numel=1000) == Policy().thresholds.statistics_tolerance[
        "float32"]
    with pytest.raises(ConfigError, match="statistics_tolerance"):
        Thresholds.load({"statistics_tolerance": 0.1})
    with pytest.raises(ConfigError, match="unknown dtype"):
        Thresholds.load({"statistics_tolerance": {"int3": 0.1}})
