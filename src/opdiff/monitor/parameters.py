"""The Monitor's batched parameter reductions: per parameter, after optimizer.step(), its norm,
its gradient's norm, the norm of what the step changed, and the norms of the optimizer's state
(Adam's exp_avg and exp_avg_sq, SGD's momentum_buffer).

    probe = ParameterProbe(model, optimizer, update_norm=True)
    probe.recording = True
    ...loss.backward(); optimizer.step()...
    tensors = probe.pending()                 # a few torch._foreach_norm calls, on the device
    values = probe.finish(host_values)        # {column: float}

The update norm needs the parameters as they were before the step: a step pre-hook on the
optimizer copies them into one preallocated buffer (`torch._foreach_copy_`), and after the step
`torch._foreach_sub_` turns that copy into minus the update in place. It costs one copy of the
parameters in memory and three passes over them per recorded step; `update_norm=False` saves both.
"""
from __future__ import annotations

import logging
import math
from typing import Callable, Optional, cast

import torch

from .stream import column


def foreach_norms(tensors: list) -> list:
    """L2 norms of `tensors` as float32 0-d tensors, in as few kernels as the dtypes allow."""
    if not tensors:
        return []
    groups: dict = {}
    if all(t.is_cpu for t in tensors):      # t.device makes a Python object per call
        for i, t in enumerate(tensors):
            groups.setdefault(t.dtype, []).append(i)
    else:
        for i, t in enumerate(tensors):
            groups.setdefault((t.device, t.dtype), []).append(i)
    out: list = [None] * len(tensors)
    for key, idxs in groups.items():
        dtype = key if isinstance(key, torch.dtype) else key[1]
        chunk = [tensors[i] for i in idxs]
        if dtype in (torch.float32, torch.float64):
            norms = torch._foreach_norm(chunk)
        else:       # bf16/fp16: accumulate and return in float32
            norms = torch._foreach_norm(chunk, 2, dtype=torch.float32)
        for i, n in zip(idxs, norms):
            out[i] = n if n.dtype == torch.float32 else n.float()
    return out


class ParameterProbe:
    """Norms of parameters, gradients, updates and optimizer state, batched per step."""

    def __init__(self, model: torch.nn.Module, optimizer=None, *, update_norm: bool = True,
                 on_error: Callable[[str, BaseException], None] = lambda where, exc: None):
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.optimizer = optimizer
        self.on_error = on_error
        self.recording = False
        # The parameters the optimizer updates, in model order.
        owned: set[int] = set()
        if optimizer is not None:
            for group in optimizer.param_groups:
                owned.update(id(p) for p in group["params"])
        self.updated = [i for i, p in enumerate(self.params) if id(p) in owned]
        self.update_norm = bool(update_norm) and bool(self.updated)
        self._before: Optional[list] = None      # the copy taken before the step
        self._copied = False
        self._handle = None
        self._layout: list = []                   # [(column, position in pending)] this step
        self._grad_columns: list = []
        self._column_names: dict = {}             # quantity -> column per parameter, made once
        self._state_cache: Optional[tuple] = None
        self._sources: list = []                  # the tensors of the last pending(), in order
        if optimizer is not None and self.update_norm:
            try:
                self._handle = optimizer.register_step_pre_hook(self._before_step)
            except Exception as exc:    # (an optimizer without torch's hooks: no update norms)
                self.update_norm = False
                logging.getLogger("opdiff").warning(
                    "opdiff: Monitor records no update norms: %s cannot take a step pre-hook "
                    "(%s: %s)", type(optimizer).__name__, type(exc).__name__, exc)

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._before = None

    def _before_step(self, optimizer, args, kwargs) -> None:
        if not self.recording:
            return
        try:
            with torch.no_grad():
                params: list[torch.Tensor] = [self.params[i] for i in self.updated]
                if self._before is None:
                    self._before = [torch.empty_like(p) for p in params]
                torch._foreach_copy_(self._before, params)
            self._copied = True
        except Exception as exc:
            self.update_norm = False
            self.on_error("the optimizer step pre-hook", exc)

    def clear(self) -> None:
        self._copied = False
        self._layout = []

    def _columns(self, quantity: str, idxs) -> list:
        names = self._column_names.get(quantity)
        if names is None:
            names = self._column_names[quantity] = [column(n, quantity) for n in self.names]
        return [names[i] for i in idxs]

    def pending(self) -> list:
        """Norms of this step as 0-d device tensors; `finish` maps their host values to columns."""
        layout: list = []
        tensors: list = []

        sources: list = []

        def add(of, columns):
            layout.extend(zip(columns, range(len(tensors), len(tensors) + len(of))))
            tensors.extend(foreach_norms(of))
            sources.extend(of)

        every = range(len(self.params))
        with torch.no_grad():
            add(self.params, self._columns("norm", every))
            with_grad = [i for i, p in enumerate(self.params) if p.grad is not None]
            grad_columns = self._columns("grad_norm", with_grad)
            add([self.params[i].grad for i in with_grad], grad_columns)
            if self.update_norm and self._copied:
                params: list[torch.Tensor] = [self.params[i] for i in self.updated]
                before = cast(list, self._before)   # _copied: the pre-hook filled it
                torch._foreach_sub_(before, params)     # now minus the update
                add(before, self._columns("update_norm", self.updated))
            for key, idxs, states in self._state_tensors():
                add(states, self._columns(f"{key}_norm", idxs))
        self._layout = layout
        self._grad_columns = grad_columns
        self._sources = sources
        return tensors

    def _state_tensors(self):
        """(key, parameter indices, state tensors) per state key shaped like its parameter.
        Found once and then checked by identity (optimizers update their state in place): a
        new state dict (load_state_dict) or a replaced tensor makes it look again."""
        if self.optimizer is None:
            return []
        state = self.optimizer.state
        cached = self._state_cache
        if cached is not None and cached[0] is state and cached[1] == len(state) and \
                all(state.get(p) is d and d.get(key) is t for p, d, key, t in cached[2]):
            return cached[3]
        by_key: dict = {}
        checks = []
        for i in self.updated:
            p = self.params[i]
            s = state.get(p)
            if not s:
                continue
            for key, value in s.items():
                if isinstance(value, torch.Tensor) and value.shape == p.shape and \
                        value.is_floating_point():
                    idxs, tensors = by_key.setdefault(key, ([], []))
                    idxs.append(i)
                    tensors.append(value)
                    checks.append((p, s, key, value))
        found = [(key, idxs, tensors) for key, (idxs, tensors) in by_key.items()]
        self._state_cache = (state, len(state), checks, found)
        return found

    @property
    def columns(self) -> list:
        """The columns of the last `pending()`, in order."""
        return [col for col, _ in self._layout]

    def finish(self, host: list) -> tuple[dict, Optional[float]]:
        """({column: value}, global gradient norm or None) from the host copies of `pending()`."""
        out = {col: host[pos] for col, pos in self._layout}
        if math.inf in host:
            # A float32 norm that overflowed, maybe on finite values (Adam's exp_avg_sq of large
            # gradients): the float64 norm says which (the tensors are as pending() saw them).
            for col, pos in self._layout:
                if host[pos] == math.inf:
                    out[col] = torch.linalg.vector_norm(self._sources[pos], dtype=torch.float64).item()
        self._sources = []
        sq = [out[c] ** 2 for c in self._grad_columns]
        grad_norm = math.sqrt(math.fsum(sq)) if sq else None
        return out, grad_norm
