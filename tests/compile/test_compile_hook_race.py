"""A debugger's global module hooks removed while dynamo compiles another model (a finalizer run
by the garbage collector mid-compile) must not break that compile: dynamo guards on the hooks
it traced, and building that guard found the hook gone (InternalTorchDynamoError: KeyError)."""
from __future__ import annotations

import torch

import opdiff
from opdiff.capture.modules import ModuleCapture


def test_hooks_removed_during_a_compile_wait_until_it_is_over(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    dbg = opdiff.PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix", task="statistics")
    dbg.start(model)
    model(torch.ones(2, 4)).sum()
    dbg.stop()
    dbg.step()
    layer = next(x for x in dbg._layers if isinstance(x, ModuleCapture))
    hooks = torch.nn.modules.module._global_forward_hooks
    ours = [h.id for h in layer.handles]
    assert any(i in hooks for i in ours)

    def backend(gm, example_inputs):
        layer.remove()          # what the finalizer does when gc runs here
        return gm

    other = torch.nn.Linear(4, 4)
    x = torch.ones(2, 4)
    out = torch.compile(other, backend=backend)(x)
    assert torch.equal(out, other(x))
    dbg = layer = None
    import gc
    gc.collect()
    torch._dynamo.reset()
    model(x)                    # outside any compile, the debugger gone: the hooks are gone
    assert not any(i in hooks for i in ours)
