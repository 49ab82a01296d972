"""Real models captured with opdiff.dump: healthy bf16 autocast names nothing, planted faults are named.

Models are tiny (a residual CNN with BatchNorm, an LSTM, a 2-layer transformer encoder) and run
one forward+backward step on CPU.
"""
import sys
from pathlib import Path

import pytest

import opdiff

pytestmark = pytest.mark.slow


# The models and the dump step are shared with the replay tests.
sys.path.insert(0, str(Path(__file__).parent / "replay"))
import replay_models  # noqa: E402
from replay_models import run  # noqa: E402


@pytest.fixture(scope="module")
def goldens(tmp_path_factory):
    root = tmp_path_factory.mktemp("gold")
    for name in ("cnn", "lstm", "transformer"):
        run(name, root / name)
    return root


@pytest.mark.parametrize("name", ["cnn", "lstm", "transformer"])
def test_healthy_bf16_names_nothing(goldens, tmp_path, name):
    run(name, tmp_path / "t", bf16=True)
    result = opdiff.compare(tmp_path / "t", goldens / name)
    assert result.first_divergence is None, result.verdict
    assert result.counts["error"] == 0 and result.counts["warning"] > 0


FORWARD_FAULTS = [
    ("cnn", "Functional.conv2d", 2), ("cnn", "Functional.batch_norm", 1),
    ("cnn", "Tensor.__iadd__", 0), ("cnn", "Functional.linear", 0),
    ("lstm", "VF.lstm", 0), ("lstm", "Functional.linear", 0),
    ("transformer", "Functional.linear", 0), ("transformer", "Functional.layer_norm", 1),
    ("transformer", "Functional.multi_head_attention_forward", 1),
]


@pytest.mark.parametrize("name,op,call", FORWARD_FAULTS)
@pytest.mark.parametrize("bf16", [True, False], ids=["bf16-1e-2", "fp32-1e-4"])
def test_forward_fault_is_named_with_its_line(goldens, tmp_path, name, op, call, bf16):
    scale = 1 + (1e-2 if bf16 else 1e-4)
    run(name, tmp_path / "t", bf16=bf16, fault=dict(op=op, call=call, phase="forward", scale=scale))
    fd = opdiff.compare(tmp_path / "t", goldens / name).first_divergence
    assert fd is not None and fd.name == f"{op}.{call}.forward"
    assert fd.phase == "forward" and fd.location is not None and fd.location.line > 0


def test_iadd_culprit_points_at_out_plus_residual(goldens, tmp_path):
    run("cnn", tmp_path / "t", fault=dict(op="Tensor.__iadd__", call=1, phase="forward",
                                          scale=1 + 1e-4))
    fd = opdiff.compare(tmp_path / "t", goldens / "cnn").first_divergence
    assert fd.name == "Tensor.__iadd__.1.forward"
    assert fd.location.code.strip() == "out += residual" and fd.location.file == replay_models.__file__


@pytest.mark.parametrize("op,call", [("Functional.conv2d", 2), ("Functional.relu", 3),
                                     ("Functional.batch_norm", 1)])
def test_fp32_backward_fault_is_named(goldens, tmp_path, op, call):
    run("cnn", tmp_path / "t", fault=dict(op=op, call=call, phase="backward", scale=1 + 1e-4))
    fd = opdiff.compare(tmp_path / "t", goldens / "cnn").first_divergence
    assert fd is not None and fd.name == f"{op}.{call}.backward" and fd.phase == "backward"
