"""Plant a numerical fault in one op: the simulated "broken kernel" for testing a setup.

    with opdiff.testing.inject_fault(op="Tensor.__iadd__", call=3, phase="forward", scale=1 + 1e-4):
        train_one_step()      # the 4th `+=` of the run returns its result scaled by 1+1e-4

`op` uses the names opdiff records (`Functional.conv2d`, `Tensor.__iadd__`, `VF.lstm`, ...).
`call` counts calls of that op since the block was entered (None: every call). `phase` is
"forward" (the op's output is changed) or "backward" (its gradients w.r.t. its inputs are).
`scale` multiplies the values; `noise` adds Gaussian noise of that size relative to each value
(`noise=1e-3`: a kernel that is off by about 0.1% elementwise, which, unlike a pure scale, also
moves the cosine similarity). The noise comes from a private generator seeded by `seed`, so
the user's random streams are not advanced. A forward fault changes the output's values in
place without touching the autograd graph, as a wrong kernel would.
Enter the block *before* starting a PrecisionDebugger, so the debugger records the faulty
output as the op's own (the fault sits closer to the op than the recorder).
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from ..errors import ConfigError


class inject_fault(TorchFunctionMode):  # noqa: N801 - used like a function, as a context manager
    """Scale one op's forward output or backward gradient by `scale` (see module docstring)."""

    def __init__(self, op: str, call: int | None = 0, phase: str = "forward", scale: float = 1.01,
                 output: int = 0, noise: float = 0.0, seed: int = 0):
        super().__init__()
        if phase not in ("forward", "backward"):
            raise ConfigError(f"inject_fault: phase must be 'forward' or 'backward'; got {phase!r}")
        if not isinstance(op, str) or "." not in op:
            raise ConfigError(f"inject_fault: op must be a recorded name such as 'Functional.relu'; got {op!r}")
        from ..store.schema import legacy_to_dotted
        self.op = legacy_to_dotted(op)
        self.call = call
        self.phase = phase
        self.scale = scale
        self.output = output
        self.noise = noise
        self.seed = seed
        self.calls = 0
        self.hits = 0     # how many times the fault fired

    def __enter__(self):
        from ..capture import debugger
        if debugger._active is not None:
            raise ConfigError("enter inject_fault before dbg.start(): the fault must sit below the recorder")
        return super().__enter__()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        from ..capture import naming
        name = naming.api_name(func)
        if name is None or torch._C._current_autograd_node() is not None:
            return func(*args, **kwargs)
        name = naming.operator_name(name)
        if name != self.op:
            return func(*args, **kwargs)
        index = self.calls
        self.calls += 1
        out = func(*args, **kwargs)
        if self.call is not None and index != self.call:
            return out
        self.hits += 1
        return self._perturb(out, args)

    def _perturb(self, out, args):
        is_tuple = isinstance(out, (tuple, list))
        target = out[self.output] if is_tuple else out
        if target is None and args and isinstance(args[0], torch.Tensor):
            target = args[0]   # __setitem__ and friends return None and mutate their first argument
        if not isinstance(target, torch.Tensor) or not target.is_floating_point():
            return out
        if self.phase == "backward":
            node = target.grad_fn
            if node is not None:
                node.register_hook(lambda grad_inputs, grad_outputs: tuple(
                    self._faulty(g) if g is not None else None for g in grad_inputs))
            return out
        # Through .data: the values change, the version counter and the graph do not.
        with torch.no_grad():
            target.data.copy_(self._faulty(target.detach()))
        return out

    def _faulty(self, t: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            bad = t * self.scale
            if self.noise:
                gen = torch.Generator(device=t.device).manual_seed(self.seed + self.hits)
                rnd = torch.randn(t.shape, generator=gen, device=t.device, dtype=torch.float32)
                bad = bad + (t.float() * rnd * self.noise).to(t.dtype)
        return bad
