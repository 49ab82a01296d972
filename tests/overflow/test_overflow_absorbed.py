"""An fp16 overflow whose inf a later op absorbs still matters (issue 46, item 5): in a
hand-written fp16 RMSNorm, `x.pow(2)` overflows, `rsqrt(inf) = 0` zeroes the norm's output and
the loss collapses to ln 10 with every gradient finite. `opdiff overflow` and the online check
both name `Tensor.pow` as an overflow, not "created and discarded"; the same model with
activations in range is clean, and an inf made at a pole and dropped (T5's log(0),
tests/overflow/test_discarded.py) is still discarded."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from torch import nn

import opdiff
from opdiff.overflow import CLEAN, OVERFLOW, analyze


class RMSNorm(nn.Module):
    """RMSNorm computed in its input's dtype (no upcast), as many hand-written ones are."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # ORIGIN


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.norm, self.head = nn.Linear(16, 32), RMSNorm(32), nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.norm(self.fc(x)))


def _model(gain: float):
    torch.manual_seed(0)
    model = Classifier().half()
    with torch.no_grad():
        model.fc.weight.mul_(gain)          # activations of a few hundred: pow(2) > 65504
        model.head.bias.zero_()
    return model, torch.randn(8, 16).half(), torch.randint(0, 10, (8,))


def _loss(model, x, y):
    return nn.functional.cross_entropy(model(x).float(), y)


@pytest.fixture(scope="module")
def overflowed(tmp_path_factory):
    path = tmp_path_factory.mktemp("rmsnorm") / "dump"
    model, x, y = _model(300.0)
    with opdiff.dump(model, str(path), level="mix", task="statistics"):
        loss = _loss(model, x, y)
        loss.backward()
    assert loss.item() == pytest.approx(math.log(10), abs=1e-4)     # the norm's output is 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    return path


def test_an_absorbed_fp16_overflow_is_an_overflow(overflowed):
    result = analyze(overflowed)
    assert result.status == OVERFLOW, result.steps[0].message
    assert result.origin.name == "Tensor.pow.0.forward" and not result.origin.discarded
    assert "x.pow(2)" in (result.origin.location.code or "")


def test_the_command_says_overflow(overflowed, tmp_path):
    p = subprocess.run([sys.executable, "-m", "opdiff", "overflow", str(overflowed), "-o",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    report = json.loads((tmp_path / "out" / "overflow.json").read_text())
    assert report["status"] == OVERFLOW, report["status"]
    assert "not an overflow" not in p.stdout


def test_the_online_check_stops_there(tmp_path):
    model, x, y = _model(300.0)
    dbg = opdiff.PrecisionDebugger(dump_path=str(tmp_path / "d"), task="overflow_check",
                                   level="mix", overflow_nums=1)
    try:
        with pytest.raises(opdiff.OverflowDetected, match=r"Tensor\.pow\.0\.forward"):
            dbg.start(model)
            _loss(model, x, y).backward()
            dbg.stop()
            dbg.step()
    finally:
        dbg.stop()


def test_the_same_model_in_range_is_clean(tmp_path):
    model, x, y = _model(1.0)
    with opdiff.dump(model, str(tmp_path / "d"), level="mix", task="statistics"):
        _loss(model, x, y).backward()
    assert analyze(tmp_path / "d").status == CLEAN
