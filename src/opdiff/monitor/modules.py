"""The Monitor's module hooks: per module and step, the forward output's L2 norm, max |x| and
NaN/inf counts, and the L2 norm of the gradient flowing back into that output.

    probe = ModuleProbe(model, patterns=None)     # every submodule that is called
    probe.install(); probe.recording = True
    loss = model(x).sum(); loss.backward()
    tensors = probe.pending()                     # 0-d tensors, still on the device
    values = probe.finish(host_values, loss_scale=1.0)   # {column: float}

The reductions run as each module returns (an output can be overwritten in place right after)
and stay on the device as 0-d tensors; the Monitor moves them to the host in one transfer per
step. Gradients are taken with a pre-hook on the autograd node that made each output, never a
module backward hook (those change how autograd accumulates and break with in-place ops). Hooks hold the
Monitor, never the graph or a tensor, and a failure inside one is reported to `on_error`.
"""
from __future__ import annotations

import fnmatch
import math
import weakref
from functools import partial
from typing import Callable, Optional, Sequence

import torch

from ..errors import OverflowDetected
from .stream import column

_NO_DTYPE = (torch.float32,)        # reduce these without a dtype argument


class quiet:
    """Gradients off, and torch-function modes off when one is active (an opdiff debugger
    running alongside must not record the monitor's own reductions). A plain class with
    nothing to do in the common case: it is entered once per module call."""

    __slots__ = ("grad", "modes")

    def __enter__(self):
        self.grad = torch.is_grad_enabled()
        if self.grad:
            torch._C._set_grad_enabled(False)
        self.modes = None
        if torch._C._is_torch_function_mode_enabled():
            self.modes = torch._C.DisableTorchFunction()
            self.modes.__enter__()
        return self

    def __exit__(self, *exc_info):
        if self.modes is not None:
            self.modes.__exit__(*exc_info)
        if self.grad:
            torch._C._set_grad_enabled(True)
        return False


def norm2(t: torch.Tensor) -> torch.Tensor:
    """L2 norm accumulated in float32 or wider, as a float32 0-d tensor."""
    if t.dtype in _NO_DTYPE:
        return torch.linalg.vector_norm(t)
    if t.dtype == torch.float64:
        return torch.linalg.vector_norm(t).float()
    return torch.linalg.vector_norm(t, dtype=torch.float32)


def extremes(t: torch.Tensor) -> tuple:
    """(min, max) as 0-d tensors, one pass; max |x| is taken from them on the host. (The
    inf-norm would say it directly but costs twenty times more on CPU.)"""
    return torch.aminmax(t)


def floating_tensors(value, out: list) -> list:
    """Every floating-point tensor in a module's output (tuples, lists, dicts, nested)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.numel() and value.layout == torch.strided:
            out.append(value)
    elif isinstance(value, (tuple, list)):
        for v in value:
            floating_tensors(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            floating_tensors(v, out)
    return out


# Modules whose output is their input rearranged, selected or clipped, exactly in any dtype on
# any device: they cannot be where two runs part or where inf/NaN is born, and in a CNN the
# ReLUs alone are a third of the activations. modules=["*"] watches them too.
EXACT_MODULES = (torch.nn.Identity, torch.nn.Flatten, torch.nn.Unflatten, torch.nn.ReLU,
                 torch.nn.ReLU6, torch.nn.MaxPool1d, torch.nn.MaxPool2d, torch.nn.MaxPool3d)


def select_modules(model: torch.nn.Module, patterns) -> list:
    """[(name, module)] the monitor hooks: every submodule that computes (not the
    EXACT_MODULES), or those whose qualified name matches one of `patterns` (exact names or
    fnmatch globs such as "blocks.*.mlp"; "*" is every submodule)."""
    named = [(n, m) for n, m in model.named_modules() if n]
    if patterns is None:
        return [(n, m) for n, m in named if type(m) not in EXACT_MODULES]
    if isinstance(patterns, str):
        patterns = [patterns]
    return [(n, m) for n, m in named
            if any(n == p or fnmatch.fnmatchcase(n, p) for p in patterns)]


class _Calls:
    """What one direction (forward or backward) recorded this step: a 0-d norm (and min, max) per
    output tensor on the device, the module index of each, and NaN/inf counts."""

    def __init__(self, with_max: bool):
        self.with_max = with_max
        self.tensors: list = []         # norm[, min, max] per output tensor, in call order
        self.index: list = []           # module index per output tensor
        self.host_counts: dict = {}     # index -> [nan, inf], CPU tensors counted on the host
        self.device_counts: list = []   # (index, nan 0-d, inf 0-d), other devices
        self.order: list = []           # module indices in the order they first returned
        self.seen: set = set()
        self._last: Optional[tuple] = None   # the last tensor reduced, and what it gave

    def clear(self) -> None:
        self.tensors.clear()
        self.index.clear()
        self.host_counts.clear()
        self.device_counts.clear()
        self.order.clear()
        self.seen.clear()
        self._last = None

    def add(self, idx: int, t: torch.Tensor) -> bool:
        """Reduce `t`; returns False when it holds NaN or inf (known at once on CPU only)."""
        if idx not in self.seen:
            self.seen.add(idx)
            self.order.append(idx)
        last = self._last
        if last is not None and last[0]() is t and last[1] == t._version:
            # A container returning its last child's output (Sequential, a block ending in
            # that child): the very same values, reduced once.
            _, _, reduced, finite, host_counts, device_counts = last
        else:
            n = norm2(t)
            reduced = (n, *extremes(t)) if self.with_max else (n,)
            finite, host_counts, device_counts = True, None, None
            if t.device.type == "cpu":
                # On CPU, isnan/isinf cost ten times a norm while reading a scalar is free:
                # count only when the norm says something is not finite. Elsewhere the reverse.
                if not math.isfinite(n.item()):
                    finite = False
                    host_counts = (int(torch.isnan(t).sum()), int(torch.isinf(t).sum()))
            else:
                device_counts = (torch.isnan(t).sum(), torch.isinf(t).sum())
            self._last = (weakref.ref(t), t._version, reduced, finite, host_counts, device_counts)
        self.tensors.extend(reduced)
        self.index.append(idx)
        if host_counts is not None:
            counts = self.host_counts.setdefault(idx, [0, 0])
            counts[0] += host_counts[0]
            counts[1] += host_counts[1]
        if device_counts is not None:
            self.device_counts.append((idx, *device_counts))
        return finite

    def pending(self) -> list:
        out = list(self.tensors)
        for _, nan, inf in self.device_counts:
            out.append(nan)
            out.append(inf)
        return out


class ModuleProbe:
    """Forward and gradient hooks on the selected modules of one model."""

    def __init__(self, model: torch.nn.Module, patterns=None, *, raise_on_nan: bool = False,
                 on_error: Callable[[str, BaseException], None] = lambda where, exc: None):
        chosen = select_modules(model, patterns)
        self.names = [n for n, _ in chosen]
        self.types = [type(m).__name__ for _, m in chosen]
        self._modules = [weakref.ref(m) for _, m in chosen]
        self.raise_on_nan = raise_on_nan
        self.on_error = on_error
        self.recording = False
        self.step = 0
        self.forward = _Calls(with_max=True)
        self.backward = _Calls(with_max=False)
        self.dtypes: dict = {}          # index -> dtype of its first output
        self.on_first_backward: Optional[Callable[[], None]] = None
        self._handles: list = []
        self._grad_hooks = [partial(self._after_backward, i, 0) for i in range(len(self.names))]

    # -- hooks ---------------------------------------------------------------------------------
    def install(self) -> None:
        for idx, ref in enumerate(self._modules):
            module = ref()
            if module is not None:
                self._handles.append(module.register_forward_hook(partial(self._after_forward, idx)))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _after_forward(self, idx: int, module, args, output) -> None:
        # Evaluation passes (no_grad / inference_mode) between training steps are not the step.
        if not self.recording or not torch.is_grad_enabled():
            return
        try:
            if type(output) is torch.Tensor:        # the common case, without the walk
                tensors: Sequence[torch.Tensor] = \
                    (output,) if output.is_floating_point() and output.numel() else ()
            else:
                tensors = floating_tensors(output, [])
            if not tensors:
                return
            finite = True
            with quiet():
                for t in tensors:
                    finite = self.forward.add(idx, t) and finite
                if idx not in self.dtypes:
                    self.dtypes[idx] = str(tensors[0].dtype).replace("torch.", "")
                if self.raise_on_nan and not (finite and self._finite_now(self.forward, idx)):
                    raise OverflowDetected(self._nan_message(idx, "forward output"))
            for t in tensors:
                node = t.grad_fn
                if node is not None:
                    # A pre-hook on the node that made the output sees the gradient flowing
                    # into it, even if an in-place op overwrites the output afterwards; it is a
                    # C++ call, where Tensor.register_hook costs tens of microseconds in Python.
                    nr = t.output_nr
                    node.register_prehook(self._grad_hooks[idx] if nr == 0 else
                                          partial(self._after_backward, idx, nr))
        except OverflowDetected:
            raise
        except Exception as exc:  # never break the user's forward
            self.on_error(f"forward hook of {self.names[idx]}", exc)

    def _after_backward(self, idx: int, output_nr: int, grad_outputs) -> None:
        if not self.recording:
            return None
        try:
            grad = grad_outputs[output_nr]
            if grad is None or not grad.is_floating_point() or not grad.numel() or \
                    grad.layout != torch.strided:
                return None
            if self.on_first_backward is not None:
                first, self.on_first_backward = self.on_first_backward, None
                first()
            with quiet():       # autograd runs hooks without gradients; modes may be on
                finite = self.backward.add(idx, grad)
                if self.raise_on_nan and not (finite and self._finite_now(self.backward, idx)):
                    raise OverflowDetected(self._nan_message(idx, "output gradient"))
        except OverflowDetected:
            raise
        except Exception as exc:
            self.on_error(f"gradient hook of {self.names[idx]}", exc)
        return None     # the gradient is left exactly as autograd computed it

    def _finite_now(self, calls: _Calls, idx: int) -> bool:
        """raise_on_nan on an accelerator: one device sync per module call (documented cost)."""
        if not calls.device_counts or calls.device_counts[-1][0] != idx:
            return True
        _, nan, inf = calls.device_counts[-1]
        return int(nan) + int(inf) == 0

    def _nan_message(self, idx: int, what: str) -> str:
        return (f"opdiff monitor: inf/NaN in the {what} of {self.names[idx]} "
                f"({self.types[idx]}) at step {self.step}, the first module to show it")

    # -- the step's values -----------------------------------------------------------------------
    def clear(self) -> None:
        self.forward.clear()
        self.backward.clear()

    def pending(self) -> list:
        """The 0-d tensors this step produced, for the Monitor's single transfer to the host."""
        return self.forward.pending() + self.backward.pending()

    def finish(self, host: list, loss_scale: Optional[float] = None) -> dict:
        """{column: value} from the host copies of `pending()`; gradients divided by the loss scale."""
        fwd, bwd = self.forward, self.backward
        n_fwd = len(fwd.tensors)
        n_fwd_counts = 2 * len(fwd.device_counts)
        out: dict = {}
        sumsq: dict = {}
        peak: dict = {}
        for k, idx in enumerate(fwd.index):
            n, lo, hi = host[3 * k:3 * k + 3]
            sumsq[idx] = sumsq.get(idx, 0.0) + n * n
            m = max(-lo, hi)
            prev = peak.get(idx, 0.0)
            peak[idx] = math.nan if (m != m or prev != prev or lo != lo) else max(prev, m)
        counts = _counts(fwd, host[n_fwd:n_fwd + n_fwd_counts])
        for idx, s in sumsq.items():
            name = self.names[idx]
            out[column(name, "fwd_norm")] = math.sqrt(s)
            out[column(name, "fwd_max")] = peak[idx]
            nan, inf = counts.get(idx, (0, 0))
            out[column(name, "fwd_nan")] = nan
            out[column(name, "fwd_inf")] = inf
        start = n_fwd + n_fwd_counts
        n_bwd = len(bwd.tensors)
        scale = loss_scale if loss_scale and math.isfinite(loss_scale) else 1.0
        bsq: dict = {}
        for k, idx in enumerate(bwd.index):
            n = host[start + k]
            bsq[idx] = bsq.get(idx, 0.0) + n * n
        counts = _counts(bwd, host[start + n_bwd:])
        for idx, s in bsq.items():
            name = self.names[idx]
            out[column(name, "bwd_norm")] = math.sqrt(s) / scale
            nan, inf = counts.get(idx, (0, 0))
            out[column(name, "bwd_nan")] = nan
            out[column(name, "bwd_inf")] = inf
        return out


def _counts(calls: _Calls, host: list) -> dict:
    counts = {idx: tuple(c) for idx, c in calls.host_counts.items()}
    for k, (idx, _, _) in enumerate(calls.device_counts):
        nan, inf = counts.get(idx, (0, 0))
        counts[idx] = (nan + host[2 * k], inf + host[2 * k + 1])
    return counts
