"""The Monitor's module hooks: per module and step, the forward output's L2 norm, max |x| and
NaN/inf counts, and the L2 norm of the gradient flowing back into that output.

    probe = ModuleProbe(model, patterns=None)     # every submodule that is called
    probe.install(); probe.recording = True
    loss = model(x).sum(); loss.backward()
    tensors = probe.pending()                     # 0-d tensors still on an accelerator (CPU: none)
    values = probe.finish(host_values, loss_scale=1.0)   # {column: float}

The reductions run as each module returns: an output can be overwritten in place right after
(BatchNorm then ReLU(inplace=True)), and the tensor is still in the cache. Two passes forward
(norm, aminmax; on CPU the inf-norm costs twenty times aminmax), one backward (norm). On CPU
the values are read at once (a scalar read there is free; keeping 0-d tensors and stacking them
cost more) and NaN/inf are counted only when a norm is not finite; on an accelerator, where
reading would sync, the counts are taken on the device too and everything stays there as 0-d
tensors until the Monitor's one transfer per step.

Gradients are taken with a pre-hook on the autograd node that made each output, never a module
backward hook (those change how autograd accumulates and break with in-place ops). The node is
taken as the module returns (an in-place op after it gives the tensor another one), but inside
the watched model's forward the pre-hooks are registered together when that forward returns:
one at a time between the model's kernels, with Python's data cold in the cache, each cost
17 to 34 us on CPU; together, 6. Calls outside the model's forward, or during a backward (a
checkpointed region recomputed), register at once. A non-reentrant checkpoint's recomputation
(in a backward, under saved-tensor hooks) is not recorded again: its forward was. Hooks hold the
Monitor, and the nodes only until the model's forward returns, never a tensor; a failure inside
one is reported to `on_error`.
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
    """What one direction (forward or backward) recorded this step, per module index in the order
    the modules first returned: `acc[idx] = [sum of squares, max |x|, nan, inf]` as host numbers
    for CPU tensors (read at once: on CPU a scalar read is free and the tensor is warm in the
    cache), and 0-d tensors in `device` for the others, moved with the step's single transfer."""

    __slots__ = ("with_max", "acc", "device", "_last_ref", "_last_version", "_last", "_device_last")

    def __init__(self, with_max: bool):
        self.with_max = with_max
        self.acc: dict = {}
        self.device: list = []          # (idx, norm, min, max, nan, inf), min/max None without max
        self._last_ref: Optional[weakref.ref] = None    # the last tensor reduced ...
        self._last_version = -1
        self._last: Optional[tuple] = None              # ... and what it gave
        self._device_last: tuple = ()

    @property
    def order(self) -> list:
        """Module indices in the order they first returned (forward) or got a gradient."""
        return list(self.acc)

    def clear(self) -> None:
        self.acc.clear()
        self.device.clear()
        self._last_ref = self._last = None

    def add(self, idx: int, t: torch.Tensor) -> bool:
        """Reduce `t`; returns False when it holds NaN or inf (known at once on CPU only)."""
        ref = self._last_ref
        if ref is not None and ref() is t and self._last_version == t._version:
            # A container returning its last child's output (Sequential, a block ending in
            # that child): the very same values, reduced once.
            last = self._last
        elif t.is_cpu:          # read at once; the reduction inline (a call costs, module doc)
            n: float = norm2(t).item()
            if self.with_max:
                lo_t, hi_t = extremes(t)
                lo, hi = lo_t.item(), hi_t.item()
                peak = max(-lo, hi) if (lo == lo and hi == hi) else math.nan
            else:
                peak = 0.0
            last = (n * n, peak, 0, 0) if n - n == 0.0 else self._count(t, n, peak)
            self._last_ref, self._last_version, self._last = weakref.ref(t), t._version, last
        else:
            self._device(t)
            last = None
            self._last_ref, self._last_version, self._last = weakref.ref(t), t._version, None
        entry = self.acc.get(idx)
        if entry is None:
            entry = self.acc[idx] = [0.0, 0.0, 0, 0]
        if last is None:            # on an accelerator: stays there until the step's transfer
            self.device.append((idx, *self._device_last))
            return True
        sq, peak, nan, inf = last
        entry[0] += sq
        prev = entry[1]
        entry[1] = math.nan if (peak != peak or prev != prev) else max(prev, peak)
        if nan or inf:
            entry[2] += nan
            entry[3] += inf
            return False
        return True

    def _device(self, t: torch.Tensor) -> None:
        """The 0-d tensors of a tensor on an accelerator, into `_device_last`."""
        lo, hi = extremes(t) if self.with_max else (None, None)
        self._device_last = (norm2(t), lo, hi, torch.isnan(t).sum(), torch.isinf(t).sum())

    @staticmethod
    def _count(t: torch.Tensor, n: float, peak: float) -> tuple:
        """(sum of squares, max |x|, nan, inf) of a CPU tensor whose float32 norm `n` is not
        finite. Counting costs ten times a norm on CPU: only when the norm says something is off."""
        nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
        if not (nan or inf):        # finite values whose float32 norm overflows
            n = torch.linalg.vector_norm(t, dtype=torch.float64).item()
        return n * n, peak, nan, inf

    def pending(self) -> list:
        out: list = []
        for _, n, lo, hi, nan, inf in self.device:
            out.append(n)
            if lo is not None:
                out.append(lo)
                out.append(hi)
            out.append(nan)
            out.append(inf)
        return out

    def merge(self, host: list) -> None:
        """Add the host copies of `pending()` into `acc`."""
        k = 0
        for idx, _, lo, _, _, _ in self.device:
            entry = self.acc[idx]
            n = host[k]
            entry[0] += n * n
            k += 1
            if lo is not None:
                lo_v, hi_v = host[k], host[k + 1]
                k += 2
                prev = entry[1]
                entry[1] = math.nan if (lo_v != lo_v or hi_v != hi_v or prev != prev) else \
                    max(prev, -lo_v, hi_v)
            entry[2] += int(host[k])
            entry[3] += int(host[k + 1])
            k += 2


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
        self._root = weakref.ref(model)
        self._handles: list = []
        self._depth = 0                 # how deep in the watched model's forward we are
        self._deferred: list = []       # (node, hook) to register when that forward returns
        # Made once: the hooks are bound partials, nothing is allocated per call but the
        # rare hook of a second output.
        self._grad_hooks = [partial(self._after_backward, i, 0) for i in range(len(self.names))]
        self._fwd_columns = [tuple(column(n, q) for q in ("fwd_norm", "fwd_max", "fwd_nan",
                                                          "fwd_inf")) for n in self.names]
        self._bwd_columns = [tuple(column(n, q) for q in ("bwd_norm", "bwd_nan", "bwd_inf"))
                             for n in self.names]

    # -- hooks ---------------------------------------------------------------------------------
    def install(self) -> None:
        for idx, ref in enumerate(self._modules):
            module = ref()
            if module is not None:
                self._handles.append(module.register_forward_hook(partial(self._after_forward, idx)))
        root = self._root()
        if root is not None:
            self._handles.append(root.register_forward_pre_hook(self._enter_root))
            self._handles.append(root.register_forward_hook(self._leave_root, always_call=True))

    def _enter_root(self, module, args) -> None:
        self._depth += 1

    def _leave_root(self, module, args, output) -> None:
        self._depth -= 1
        if self._depth <= 0:
            self._depth = 0
            self.register_deferred()

    def register_deferred(self) -> None:
        """Register the gradient pre-hooks the forward hooks put off (see the module doc)."""
        deferred = self._deferred
        if deferred:
            self._deferred = []
            try:
                for node, hook in deferred:
                    node.register_prehook(hook)
            except Exception as exc:
                self.on_error("registering the gradient hooks", exc)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._deferred = []
        self._depth = 0

    def _after_forward(self, idx: int, module, args, output) -> None:
        # Evaluation passes (no_grad / inference_mode) between training steps are not the step.
        if not self.recording or not torch.is_grad_enabled():
            return
        in_backward = torch._C._current_graph_task_id() != -1
        if in_backward and torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
            return      # a non-reentrant checkpoint recomputing what its forward recorded
        try:
            if type(output) is torch.Tensor:        # the common case, without the walk
                if not output.is_floating_point() or not output.numel():
                    return
                tensors: Sequence[torch.Tensor] = (output,)
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
            defer = self._depth > 0 and not in_backward
            for t in tensors:
                node = t.grad_fn
                if node is not None:
                    # A pre-hook on the node that made the output sees the gradient flowing
                    # into it, even if an in-place op overwrites the output afterwards (cheaper
                    # than Tensor.register_hook, which is Python through and through).
                    nr = t.output_nr
                    hook = self._grad_hooks[idx] if nr == 0 else \
                        partial(self._after_backward, idx, nr)
                    if defer:
                        self._deferred.append((node, hook))
                    else:
                        node.register_prehook(hook)
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
            if torch.is_grad_enabled() or torch._C._is_torch_function_mode_enabled():
                with quiet():   # create_graph=True, or an opdiff debugger alongside
                    finite = self.backward.add(idx, grad)
            else:               # as autograd runs hooks: no gradients, no modes
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
        if not calls.device or calls.device[-1][0] != idx:
            return True
        nan, inf = calls.device[-1][4:]
        return int(nan) + int(inf) == 0

    def _nan_message(self, idx: int, what: str) -> str:
        return (f"opdiff monitor: inf/NaN in the {what} of {self.names[idx]} "
                f"({self.types[idx]}) at step {self.step}, the first module to show it")

    # -- the step's values -----------------------------------------------------------------------
    def clear(self) -> None:
        self.forward.clear()
        self.backward.clear()
        self._deferred = []     # a forward that never returned (it raised): nothing to watch
        self._depth = 0

    def pending(self) -> list:
        """The 0-d tensors this step left on an accelerator, for the Monitor's single transfer
        to the host (none on CPU)."""
        return self.forward.pending() + self.backward.pending()

    def finish(self, host: list, loss_scale: Optional[float] = None) -> dict:
        """{column: value} from the host copies of `pending()`; gradients divided by the loss scale."""
        fwd, bwd = self.forward, self.backward
        n_fwd = len(fwd.pending()) if fwd.device else 0
        if fwd.device:
            fwd.merge(host[:n_fwd])
        if bwd.device:
            bwd.merge(host[n_fwd:])
        out: dict = {}
        columns = self._fwd_columns
        for idx, (sq, peak, nan, inf) in fwd.acc.items():
            c_norm, c_max, c_nan, c_inf = columns[idx]
            out[c_norm] = math.sqrt(sq)
            out[c_max] = peak
            out[c_nan] = nan
            out[c_inf] = inf
        scale = loss_scale if loss_scale and math.isfinite(loss_scale) else 1.0
        columns = self._bwd_columns
        for idx, (sq, _, nan, inf) in bwd.acc.items():
            c_norm, c_nan, c_inf = columns[idx]
            out[c_norm] = math.sqrt(sq) / scale
            out[c_nan] = nan
            out[c_inf] = inf
        return out
