"""Replay on real models: a 1% backward fault in bf16 (and 1e-4 in fp32) is named, although a
healthy bf16 run's gradients differ from fp32 golden by far more; healthy runs name nothing;
forward faults stay named."""
import re

import pytest

import opdiff
from replay_models import Fp32AccumulatingKernels, run

MODELS = ("cnn", "lstm", "transformer")


@pytest.fixture(scope="module")
def goldens(tmp_path_factory):
    root = tmp_path_factory.mktemp("gold")
    for name in MODELS:
        run(name, root / name)
    return root


def _named(goldens, tmp_path, name, op, call, phase, bf16, replay="auto"):
    scale = 1 + (1e-2 if bf16 else 1e-4)
    run(name, tmp_path / "t", bf16=bf16, fault=dict(op=op, call=call, phase=phase, scale=scale))
    return opdiff.compare(tmp_path / "t", goldens / name, replay=replay)


@pytest.mark.parametrize("name", MODELS)
def test_healthy_bf16_names_nothing_after_replaying_the_backward(goldens, tmp_path, name):
    run(name, tmp_path / "t", bf16=True)
    result = opdiff.compare(tmp_path / "t", goldens / name)
    assert result.first_divergence is None, result.verdict
    assert any(n.startswith("replayed ") for n in result.notes), result.notes
    everything = opdiff.compare(tmp_path / "t", goldens / name, replay="all")
    assert everything.first_divergence is None, everything.verdict


def test_target_kernels_that_differ_from_cpus_but_are_correct_are_not_blamed(goldens, tmp_path):
    with Fp32AccumulatingKernels():
        run("cnn", tmp_path / "t", bf16=True)
    result = opdiff.compare(tmp_path / "t", goldens / "cnn", replay="all")
    assert result.first_divergence is None, result.verdict


@pytest.mark.slow
@pytest.mark.parametrize("op,call", [("Functional.conv2d", 2), ("Functional.batch_norm", 1)])
def test_backward_fault_is_named_when_the_target_kernels_differ_from_cpus(goldens, tmp_path, op,
                                                                          call):
    with Fp32AccumulatingKernels():
        run("cnn", tmp_path / "t", bf16=True, fault=dict(op=op, call=call, phase="backward",
                                                         scale=1.01))
    _check_backward(opdiff.compare(tmp_path / "t", goldens / "cnn"), op, call)


# One per model runs by default; the rest are in the slow set below.
FAST_BF16_BACKWARD = [("cnn", "Functional.batch_norm", 1), ("lstm", "VF.lstm", 0),
                      ("transformer", "Functional.layer_norm", 1)]
BF16_BACKWARD = [
    ("cnn", "Functional.conv2d", 2), ("cnn", "Functional.relu", 3), ("cnn", "Tensor.__iadd__", 0),
    ("cnn", "Functional.conv2d", 0), ("cnn", "Functional.batch_norm", 3),
    ("lstm", "Functional.linear", 0), ("lstm", "Tensor.__getitem__", 0),
    ("lstm", "Tensor.float", 0),           # only the bf16 run has this cast: a region
    ("transformer", "Functional.multi_head_attention_forward", 0),
    ("transformer", "Functional.linear", 2), ("transformer", "Tensor.__add__", 1),
    ("transformer", "Functional.relu", 0)]


def _check_backward(result, op, call):
    fd = result.first_divergence
    assert fd is not None, result.verdict
    if op == "Tensor.float":    # no twin in the fp32 run: a region of its op alone
        assert fd.origin == "region" and fd.phase == "backward", fd.name
        assert [o["name"] for o in fd.region["target_ops"]] == [f"{op}.{call}.backward"]
        assert fd.region["golden_ops"] == [] and fd.location is not None
        assert "replayed as a chain of the forward calls of its 1 target op(s)" in fd.reason
        return
    assert fd.name == f"{op}.{call}.backward" and fd.phase == "backward", fd.name
    assert "replayed in float64" in fd.reason and fd.location is not None


@pytest.mark.parametrize("name,op,call", FAST_BF16_BACKWARD)
def test_bf16_backward_fault_of_one_percent_is_named(goldens, tmp_path, name, op, call):
    result = _named(goldens, tmp_path, name, op, call, "backward", bf16=True)
    _check_backward(result, op, call)


@pytest.mark.slow
@pytest.mark.parametrize("name,op,call", BF16_BACKWARD)
def test_bf16_backward_fault_of_one_percent_is_named_in_more_ops(goldens, tmp_path, name, op,
                                                                 call):
    result = _named(goldens, tmp_path, name, op, call, "backward", bf16=True)
    _check_backward(result, op, call)


def test_bf16_backward_fault_reason_gives_both_errors(goldens, tmp_path):
    fd = _named(goldens, tmp_path, "cnn", "Functional.batch_norm", 1, "backward",
                bf16=True).first_divergence
    assert "the op's own gradient error is" in fd.reason
    assert "bfloat16 CPU kernel" in fd.reason
    assert 1.005 < _replayed_scale(fd.reason) < 1.015


def _replayed_scale(reason: str) -> float:
    """The target's scale against float64 as the replay clause states it."""
    m = re.search(r"scaled by ([0-9.]+) against ([0-9.]+)", reason)
    assert m, reason
    return float(m.group(1))


FP32_BACKWARD = [("cnn", "Functional.batch_norm", 2), ("cnn", "Tensor.__iadd__", 1),
                 ("lstm", "VF.lstm", 0), ("lstm", "Functional.linear", 0),
                 ("transformer", "Functional.multi_head_attention_forward", 1),
                 ("transformer", "Functional.layer_norm", 0), ("transformer", "Functional.linear", 4)]


@pytest.mark.slow
@pytest.mark.parametrize("name,op,call", FP32_BACKWARD)
def test_fp32_backward_fault_of_1e4_is_named(goldens, tmp_path, name, op, call):
    fd = _named(goldens, tmp_path, name, op, call, "backward", bf16=False).first_divergence
    assert fd is not None and fd.name == f"{op}.{call}.backward" and fd.phase == "backward"


FORWARD = [("cnn", "Functional.conv2d", 2), ("cnn", "Functional.batch_norm", 1),
           ("lstm", "VF.lstm", 0), ("transformer", "Functional.layer_norm", 1),
           ("transformer", "Functional.multi_head_attention_forward", 1)]


@pytest.mark.slow
@pytest.mark.parametrize("name,op,call", FORWARD)
@pytest.mark.parametrize("bf16", [True, False], ids=["bf16-1e-2", "fp32-1e-4"])
def test_forward_fault_is_still_named_and_confirmed(goldens, tmp_path, name, op, call, bf16):
    fd = _named(goldens, tmp_path, name, op, call, "forward", bf16=bf16).first_divergence
    assert fd is not None and fd.name == f"{op}.{call}.forward", fd
    assert "replayed in float64" in fd.reason          # the replay agrees with the comparison


def test_forward_fault_is_named_with_replay_confirming(goldens, tmp_path):
    fd = _named(goldens, tmp_path, "cnn", "Tensor.__iadd__", 1, "forward",
                bf16=True).first_divergence
    assert fd.name == "Tensor.__iadd__.1.forward"
    assert fd.location.code.strip() == "out += residual"
    assert "replayed in float64" in fd.reason and 1.005 < _replayed_scale(fd.reason) < 1.015


def test_replay_off_keeps_the_comparison_alone(goldens, tmp_path):
    result = _named(goldens, tmp_path, "cnn", "Functional.conv2d", 2, "forward", bf16=False,
                    replay="off")
    assert result.first_divergence.name == "Functional.conv2d.2.forward"
    assert "replayed" not in result.first_divergence.reason and not result.notes


def test_statistics_dumps_are_compared_without_replay(goldens, tmp_path):
    run("cnn", tmp_path / "g", task="statistics")
    run("cnn", tmp_path / "t", bf16=True, task="statistics")
    result = opdiff.compare(tmp_path / "t", tmp_path / "g")
    alone = opdiff.compare(tmp_path / "t", tmp_path / "g", replay="off")
    # nothing to replay from (no tensors); the only note is on what statistics can resolve
    assert not any(n.startswith("replayed") for n in result.notes), result.notes
    assert [r.result for r in result.rows] == [r.result for r in alone.rows]
    assert (result.first_divergence is None) == (alone.first_divergence is None)


def test_cli_replay_option(goldens, tmp_path, capsys):
    from opdiff.cli import main

    run("lstm", tmp_path / "t", bf16=True, fault=dict(op="VF.lstm", call=0, phase="backward",
                                                      scale=1.01))
    assert main(["compare", str(tmp_path / "t"), str(goldens / "lstm"), "--no-progress",
                 "--fail-on-divergence"]) == 1
    assert "VF.lstm.0.backward" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(tmp_path / "t"), str(goldens / "lstm"), "--replay", "sometimes"])
    assert exc.value.code == 2
