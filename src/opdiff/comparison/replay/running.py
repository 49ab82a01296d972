"""How the replay runs a call: on a set number of threads, with the CPU generator guarded, under
CPU autocast or not, out of sight of the user's TorchFunctionModes, and differentiated without
autograd.grad's output-gradient check (which imports sympy).

    from opdiff.comparison.replay.running import rng_guard, vjp
    with rng_guard() as rng:
        out = call()
    rng["consumed"]      # True: the call drew random numbers (the generator is restored)
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Optional

import torch

from .calls import NotReplayable


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """Run the block on `n` intra-op CPU threads, restoring the caller's setting after."""
    before = torch.get_num_threads()
    if before == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# One guarded call at a time: the CPU generator is the process's, so a call on another replay
# thread (`Replayer.prefetch`) must not draw between this one's before and after.
_RNG_LOCK = threading.RLock()


@contextlib.contextmanager
def rng_guard() -> Iterator[dict[str, bool]]:
    """Detect (and undo) any draw from the CPU generator: such an op cannot be replayed. The
    block holds a process-wide lock (see `_RNG_LOCK`): replay threads run their guarded calls
    one at a time, everything else (reading, measuring, direct kernels) side by side."""
    with _RNG_LOCK:
        before = torch.get_rng_state()
        state = {"consumed": False}
        try:
            yield state
        finally:
            after = torch.get_rng_state()
            if not torch.equal(before, after):
                state["consumed"] = True
                torch.set_rng_state(before)


def autocast_to(dtype: Optional[torch.dtype], device: str = "cpu") -> torch.autocast:
    """Autocast to `dtype` on the device's type, or autocast off (None)."""
    kind = torch.device(device).type
    if dtype is None:
        return torch.autocast(kind, enabled=False)
    return torch.autocast(kind, dtype=dtype)


def shielded() -> Any:
    """No user TorchFunctionMode (a planted fault, a recorder) sees the reference runs."""
    return torch._C.DisableTorchFunction()


def vjp(pairs: list[tuple[torch.Tensor, torch.Tensor]], leaves: list[torch.Tensor]
        ) -> tuple[Optional[torch.Tensor], ...]:
    """The gradients of `leaves` for output gradients `pairs` [(output, its gradient)], as
    `torch.autograd.grad(outputs, leaves, grads, allow_unused=True)` gives them, bit for bit.

    Differentiated through the scalar sum(output * gradient) instead: the gradient reaching
    each output is then exactly its given gradient (1 * g), and autograd.grad with explicit
    output gradients imports sympy (torch's symbolic shapes) on first use, about a second,
    which was the first backward replay's largest cost. A shape mismatch is NotReplayable,
    as autograd.grad's own check would have refused it."""
    if any(o.is_complex() for o, _ in pairs):     # (the scalar's gradient would be conj(g))
        return torch.autograd.grad([o for o, _ in pairs], leaves,
                                   [g.to(o.dtype) for o, g in pairs], allow_unused=True)
    total = None
    with torch.enable_grad():
        for o, g in pairs:
            if tuple(o.shape) != tuple(g.shape):
                raise NotReplayable(f"a recorded output gradient has shape {list(g.shape)}, "
                                    f"the replayed output {list(o.shape)}")
            term = (o * g.to(o.dtype)).sum()
            total = term if total is None else total + term
    assert total is not None
    return torch.autograd.grad(total, leaves, allow_unused=True)
