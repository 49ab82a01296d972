"""A lazy module (nn.LazyLinear) materialised inside the recorded step: starting the debugger
on it does not raise into the user's program, its parameters' gradients are recorded once they
exist, and the uninitialised memory its initialisers overwrite is not recorded as the
parameter's value (it was blamed as "differs before any op reads it", error 1e37)."""
from __future__ import annotations

import json

import pytest
import torch

import opdiff


def _step(dump, dtype, task, fault=1.0):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LazyLinear(16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(8, 12)
    dbg = opdiff.PrecisionDebugger(dump_path=str(dump), task=task, level="mix", step=[0])
    dbg.start(model)          # raised ValueError (a hook on an UninitializedParameter) before
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        hidden = model[1](model[0](x)) * fault
        loss = model[2](hidden).float().pow(2).mean()
    loss.backward()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt.step()
    dbg.stop()
    dbg.step()
    return [json.loads(line) for line in (dump / "step0/rank0/records.jsonl").open()]


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_lazy_module_materialised_in_the_step_is_recorded_healthy(tmp_path, task):
    golden = _step(tmp_path / "golden", torch.float32, task)
    _step(tmp_path / "target", torch.bfloat16, task)
    leaf = next(r for r in golden if r["name"] == "Parameter.0.weight.0.forward")
    assert leaf["reader"] == "Functional.linear.0.forward"      # not the initialiser
    assert abs(leaf["outputs"][0]["stats"]["max"]) < 1         # kaiming-initialised values
    assert any(r["op"] == "Module.0.LazyLinear.parameters_grad" for r in golden)
    result = opdiff.compare(str(tmp_path / "target"), str(tmp_path / "golden"))
    assert result.first_divergence is None, result.verdict


def test_a_fault_after_a_lazy_module_is_still_named(tmp_path):
    _step(tmp_path / "golden", torch.float32, "tensor")
    _step(tmp_path / "target", torch.float32, "tensor", fault=1.05)
    result = opdiff.compare(str(tmp_path / "target"), str(tmp_path / "golden"))
    assert result.first_divergence is not None and result.first_divergence.op == "Tensor.__mul__"
