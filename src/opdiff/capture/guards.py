"""When capture must stand aside and let an op run untouched."""
from __future__ import annotations

import functools
import sys
import threading
from typing import Any, Callable, TypeVar

import torch


def capturing_graph() -> bool:
    """True while the current CUDA (or Ascend NPU) stream captures a graph.

    Captured ops do not run now but on each replay, when no Python runs: their tensors hold
    nothing yet, statistics kernels would be captured into the user's graph, and the host copy
    that fetches statistics would invalidate the capture.
    """
    if torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing():
        return True
    # torch.npu exists once torch_npu is imported (looking it up on torch otherwise costs a
    # failed module __getattr__, 2 us on every op)
    if "torch_npu" not in sys.modules:
        return False
    npu: Any = getattr(torch, "npu", None)
    capturing = getattr(npu, "is_current_stream_capturing", None)
    return bool(capturing is not None and npu.is_initialized() and capturing())


def tracing_or_capturing() -> bool:
    """True while dynamo traces (it would trace opdiff's own Python into the user's graph and
    break the graph on it) or a device graph is being captured (see capturing_graph)."""
    return torch.compiler.is_compiling() or capturing_graph()


Hook = TypeVar("Hook", bound=Callable[..., Any])


def never_compiled(hook: Hook) -> Hook:
    """`hook` made a no-op while dynamo traces it (a hook on a compiled module is traced into
    the user's graph: what it reads becomes a guard, what it writes a side effect dynamo
    replays, and an f-string of a dynamic int a graph break). Traced, the wrapper folds to
    `return None`: no guard, no graph break, no recompile.

        model.register_forward_pre_hook(never_compiled(self._root_call))
    """
    @functools.wraps(hook)
    def outside_compile(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return None
        return hook(*args, **kwargs)
    return outside_compile  # type: ignore[return-value]


class OwnWork:
    """Marks the threads where opdiff is doing its own tensor work, so that the interception
    layers let those ops through unrecorded.

        own = OwnWork()
        with own():            # no grad, no torch-function modes, `own.active` is True
            stats = t.sum()
    """

    __slots__ = ("_local",)

    def __init__(self):
        self._local = threading.local()

    @property
    def active(self) -> bool:
        """True inside `with own():` on this thread."""
        return getattr(self._local, "busy", False)

    def __call__(self) -> "_Internal":
        return _Internal(self._local)


class _Internal:
    """`with own():` no grad, no torch-function modes (opdiff's own reductions must not be
    recorded or traced), and the thread marked busy. A plain class: this is entered about four
    times per recorded op, where a generator-based context manager costs more than the work it
    guards."""

    __slots__ = ("local", "busy", "grad", "no_modes")

    def __init__(self, local):
        self.local = local

    def __enter__(self):
        self.busy = getattr(self.local, "busy", False)
        self.local.busy = True
        self.grad = torch.is_grad_enabled()
        # Modes off first: _set_grad_enabled itself goes through torch-function modes.
        self.no_modes = torch._C.DisableTorchFunction()
        self.no_modes.__enter__()
        torch._C._set_grad_enabled(False)
        return self

    def __exit__(self, *exc_info):
        torch._C._set_grad_enabled(self.grad)
        self.no_modes.__exit__(None, None, None)
        self.local.busy = self.busy
        return False
