"""A mean that cancels carries its input's relative error times RMS(input) / RMS(output)
(`comparison/noise.py`, `cancels`; the healthy case that needs it is a tiny BERT at L2 in
tests/falsepos/test_weights_nudged.py). What the rule must not do: clear a fault planted in a
mean whose inputs agree, 0.1% in a mean that cancels 600-fold and 1e-4 in one that does not."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import opdiff
from opdiff.testing import inject_fault


class Centred(nn.Module):
    """A linear layer whose rows are centred and shifted by 1e-3 (or not), then averaged."""

    def __init__(self, cancel: bool):
        super().__init__()
        self.fc, self.cancel = nn.Linear(64, 64), cancel

    def forward(self, x):
        y = self.fc(x)
        if self.cancel:
            y = y - y.mean(-1, keepdim=True).detach() + 1e-3
        return torch.mean(y, -1)


def _dump(path, cancel: bool, nudge: bool, fault: float = 0.0):
    torch.manual_seed(0)
    model, x = Centred(cancel), torch.randn(256, 64)
    if nudge:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + 3e-6 * torch.randn(p.shape, generator=g))
    planted = inject_fault(op="Torch.mean", call=0, scale=1 + fault) if fault \
        else contextlib.nullcontext()
    with planted, opdiff.dump(model, str(path), level="mix", task="statistics"):
        model(x).sum().backward()
    return path


@pytest.mark.parametrize("cancel, fault", [(True, 1e-3), (False, 1e-4)], ids=["cancels", "plain"])
def test_a_fault_in_the_mean_is_named(tmp_path, cancel, fault):
    golden = _dump(tmp_path / "g", cancel, nudge=False)
    result = opdiff.compare(_dump(tmp_path / "t", cancel, nudge=False, fault=fault), golden)
    fd = result.first_divergence
    assert fd is not None and fd.op == "Torch.mean", result.verdict
