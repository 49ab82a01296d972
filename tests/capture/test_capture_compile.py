"""L2 with torch.compile: the aten-level mode must not silently turn compilation off."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import opdiff


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))


def _compiled_step(dump_root, level):
    """One compiled forward and backward under capture: (its output, the eager output, the
    graphs the compiler was handed)."""
    torch._dynamo.reset()
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = _model()
    x = torch.randn(3, 4)
    want = model(x)
    compiled = torch.compile(model, backend=counting_backend)
    with opdiff.dump(model, dump_root, level=level):
        out = compiled(x)
        out.sum().backward()
    return out, want, graphs


def test_l2_keeps_torch_compile_compiling(dump_root, read_dump):
    out, want, graphs = _compiled_step(dump_root, "L2")
    assert len(graphs) == 1, "compilation was skipped or split while L2 capture was on"
    assert torch.equal(out, want)
    dump = read_dump(dump_root)
    # The compiled graph runs its aten ops eagerly here (backend returns gm.forward): L2 sees them.
    assert dump.with_op("Aten.addmm", "forward")
    assert [r for r in dump.records if r["phase"] == "backward"]
    torch._dynamo.reset()


@pytest.mark.slow
def test_l2_with_aot_eager_backend(dump_root, read_dump):
    torch._dynamo.reset()
    model = _model()
    x = torch.randn(3, 4)
    want = model(x)
    want.sum().backward()
    want_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, backend="aot_eager")
    with opdiff.dump(model, dump_root, level="L2"):
        out = compiled(x)
        out.sum().backward()
    assert torch.allclose(out, want, atol=1e-6)
    for p, g in zip(model.parameters(), want_grads):
        assert torch.allclose(p.grad, g, atol=1e-6)
    from torch._dynamo.utils import counters
    assert counters["stats"]["unique_graphs"] >= 1
    dump = read_dump(dump_root)
    assert dump.records and not [r for r in dump.records if "error" in r]
    torch._dynamo.reset()


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_api_and_module_levels_do_not_split_torch_compile_graphs(level, dump_root):
    # Dynamo traces torch-function modes and module hooks: capture must not be traced into the
    # user's graph (dozens of graph breaks and recompilations, compile effectively off).
    out, want, graphs = _compiled_step(dump_root, level)
    torch._dynamo.reset()
    assert torch.equal(out, want)
    assert len(graphs) == 1, f"{len(graphs)} graphs compiled instead of 1"
