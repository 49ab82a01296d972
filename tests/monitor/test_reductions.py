"""The numbers the monitor records are the norms and maxima of what ran, whatever the layout
(contiguous, transposed, a view that does not start at its allocation, bf16), and finite values
whose float32 squares overflow are measured in float64: for module outputs and gradients, and
for parameters, gradients and optimizer state."""
from __future__ import annotations

import math

import pytest
import torch

import opdiff
from opdiff.monitor.parameters import ParameterProbe
from opdiff.trend import read_run


class Shapes(torch.nn.Module):
    """Children whose outputs take every path: contiguous, transposed, an unaligned view, bf16."""

    def __init__(self):
        super().__init__()
        self.dense = torch.nn.Linear(64, 96)
        self.turn = Transpose()
        self.view = Shift()
        self.low = ToBF16()

    def forward(self, x):
        y = self.turn(self.dense(x))
        return self.view(y).sum() + self.low(y).float().sum()


class Transpose(torch.nn.Module):
    def forward(self, x):
        return (x * 1.5).t()


class Shift(torch.nn.Module):
    def forward(self, x):
        return (x * 2.0).reshape(-1)[1:]           # starts 4 bytes past the allocation


class ToBF16(torch.nn.Module):
    def forward(self, x):
        return x.to(torch.bfloat16) * 3


def _norm64(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t.detach().double()))


def test_every_reduction_path_records_the_norm_and_max_of_the_output(tmp_path):
    torch.manual_seed(0)
    model = Shapes()
    seen: dict = {}

    def keep(module, args, out, name):
        seen[name] = (out.detach().clone(), out.is_contiguous(), out.data_ptr() % 64)
        out.register_hook(lambda grad: seen.__setitem__(name + ".grad", grad.clone()))

    for name, m in model.named_children():
        m.register_forward_hook(lambda mod, a, out, name=name: keep(mod, a, out, name))
    x = torch.randn(256, 64)
    with opdiff.Monitor(model, tmp_path, update_norm=False) as mon:
        model(x).backward()
        mon.step()
    stream = read_run(tmp_path).ranks[0]
    assert seen["dense"][1] and not seen["turn"][1] and seen["view"][2]     # the layouts
    for name in ("dense", "turn", "view", "low"):
        out = seen[name][0]
        rel = 1e-2 if out.dtype == torch.bfloat16 else 1e-6
        assert stream.series(f"{name}:fwd_norm")[0] == pytest.approx(_norm64(out), rel=rel), name
        assert stream.series(f"{name}:fwd_max")[0] == pytest.approx(float(out.abs().max()), rel=1e-6)
        assert stream.series(f"{name}:fwd_nan")[0] == 0 and stream.series(f"{name}:fwd_inf")[0] == 0
        grad = seen[name + ".grad"]
        assert stream.series(f"{name}:bwd_norm")[0] == pytest.approx(_norm64(grad), rel=rel), name


def test_finite_values_whose_float32_squares_overflow_are_measured_in_float64(tmp_path):
    big = torch.nn.Sequential(torch.nn.Linear(1, 8192, bias=False))
    with torch.no_grad():
        big[0].weight.fill_(1e20)                  # 1e40 squares: float32 overflows, the norm fits
    opt = torch.optim.SGD(big.parameters(), lr=0.0)
    with opdiff.Monitor(big, tmp_path, optimizer=opt, update_norm=False) as mon:
        (big(torch.ones(1, 1)) * 1e-30).sum().backward()
        opt.step()
        mon.step()
    stream = read_run(tmp_path).ranks[0]
    expected = 1e20 * math.sqrt(8192)
    assert stream.series("0:fwd_norm")[0] == pytest.approx(expected, rel=1e-6)   # module output
    assert stream.series("0:fwd_inf")[0] == 0 and stream.series("0:fwd_nan")[0] == 0
    assert stream.series("0.weight:norm")[0] == pytest.approx(expected, rel=1e-6)   # parameter


def test_parameter_side_norms_agree_with_float64_and_survive_float32_overflow():
    torch.manual_seed(0)
    model = torch.nn.Module()
    values = {"plain": torch.randn(8192), "large": torch.full((5000,), 1e20),
              "low": torch.randn(4096).to(torch.bfloat16), "small": torch.randn(7),
              "inf": torch.tensor([1.0, math.inf] * 3000), "nan": torch.tensor([1.0, math.nan] * 3000)}
    for name, v in values.items():
        model.register_parameter(name, torch.nn.Parameter(v))
        getattr(model, name).grad = v * 2
    probe = ParameterProbe(model)
    out, grad_norm = probe.finish([t.item() for t in probe.pending()])
    for name, v in list(values.items())[:4]:
        rel = 1e-2 if v.dtype == torch.bfloat16 else 1e-6
        assert out[f"{name}:norm"] == pytest.approx(_norm64(v), rel=rel), name
        assert out[f"{name}:grad_norm"] == pytest.approx(2 * _norm64(v), rel=rel), name
    assert out["inf:norm"] == math.inf and math.isnan(out["nan:norm"])
    assert math.isnan(grad_norm)
