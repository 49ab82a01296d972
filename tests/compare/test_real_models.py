"""Real models captured with opdiff.dump: healthy bf16 autocast names nothing, planted faults are named.

Models are tiny (a residual CNN with BatchNorm, an LSTM, a 2-layer transformer encoder) and run
one forward+backward step on CPU.
"""
import contextlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import opdiff
import opdiff.testing

pytestmark = pytest.mark.slow


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        residual = x
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += residual
        return F.relu(out)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.b1, self.b2 = Block(8), Block(8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.b2(self.b1(F.relu(self.stem(x)))).mean((2, 3)))


class LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(16, 32)
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.layer2 = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        return self.head(self.layer2(self.layer(self.emb(x))).mean(1))


def make(name):
    torch.manual_seed(0)
    if name == "cnn":
        return CNN(), torch.randn(2, 3, 12, 12)
    if name == "lstm":
        return LSTMNet(), torch.randn(2, 6, 8)
    return Transformer(), torch.randn(2, 6, 16)


def run(name, path, bf16=False, fault=None):
    model, x = make(name)
    cast = bf16 and name == "lstm"   # CPU autocast has no bf16 LSTM kernel: run the model in bf16
    if cast:
        model, x = model.bfloat16(), x.bfloat16()
    ctx = opdiff.testing.inject_fault(**fault) if fault else contextlib.nullcontext()
    with ctx, opdiff.dump(model, path, level="mix", task="tensor"):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16 and not cast):
            out = model(x)
        out.float().pow(2).mean().backward()


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
    assert fd.location.code.strip() == "out += residual" and fd.location.file == __file__


@pytest.mark.parametrize("op,call", [("Functional.conv2d", 2), ("Functional.relu", 3),
                                     ("Functional.batch_norm", 1)])
def test_fp32_backward_fault_is_named(goldens, tmp_path, op, call):
    run("cnn", tmp_path / "t", fault=dict(op=op, call=call, phase="backward", scale=1 + 1e-4))
    fd = opdiff.compare(tmp_path / "t", goldens / "cnn").first_divergence
    assert fd is not None and fd.name == f"{op}.{call}.backward" and fd.phase == "backward"
