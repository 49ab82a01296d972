"""In each process `opdiff compile-bisect` starts: take the gradients one optimizer step is
about to apply, write them, and end the process there.

OPDIFF_BISECT_PROBE holds {"out": "/path/run3.safetensors", "step": 0}: at the pre-hook of the
`step`-th optimizer step (from 0, counting every optimizer's steps) the gradient of each
parameter that optimizer updates is written as `grad[i]` (i: its place in the optimizer's
parameter groups) with what dynamo compiled so far (frames, AOTAutograd graphs) in the file's
metadata; then SystemExit(0) ends the run: later steps would only cost time. Only stdlib is
imported until torch is: a process that never imports torch pays one environment lookup.
"""
from __future__ import annotations

import importlib.abc
import json
import os
import sys
from typing import Any, Optional, Sequence

ENV = "OPDIFF_BISECT_PROBE"


def install() -> None:
    """Register the hook now if torch is imported, else as soon as it is."""
    if not os.environ.get(ENV):
        return
    if "torch" in sys.modules and hasattr(sys.modules["torch"], "optim"):
        _register()
    else:
        sys.meta_path.insert(0, _TorchWatcher())


def _register() -> None:
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    settings = json.loads(os.environ[ENV])
    seen = [0]

    def take(opt: Any, args: Any, kwargs: Any) -> None:
        if seen[0] == int(settings.get("step", 0)):
            _write(opt, settings["out"])
            raise SystemExit(0)
        seen[0] += 1

    register_optimizer_step_pre_hook(take)


def _write(opt: Any, path: str) -> None:
    from safetensors.torch import save_file
    from torch._dynamo.utils import counters

    grads = {}
    params = [p for group in opt.param_groups for p in group["params"]]
    for i, p in enumerate(params):
        if p.grad is not None:
            grads[f"grad[{i}]"] = p.grad.detach().to("cpu").contiguous().clone()
    meta = {"frames": str(counters["frames"]["ok"]), "aot": str(counters["aot_autograd"]["total"]),
            "params": str(len(params))}
    save_file(grads, path + ".part", metadata=meta)
    os.replace(path + ".part", path)


class _TorchWatcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself: once `torch` has been imported, registers the hook, then leaves."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_register(module: Any) -> None:
            exec_module(module)
            _register()

        loader.exec_module = exec_then_register
        return spec


__all__ = ["install", "ENV"]
