"""L1: every torch API call, through TorchFunctionMode (sees `from torch import relu` too)."""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from .. import ops
from ..store.schema import Kind, Phase, is_inductor, record_name
from . import collectives, naming
from .backward import hook_api_backward, in_backward, input_edges
from .callsite import api_caller, call_as, dispatched
from .compiled import provenance
from .guards import capturing_graph
from .randomness import draws, fingerprint
from .sink import PendingRecord


_GETTERS: dict = {}   # the attribute getters seen (never recorded): answered first, in one lookup


def _remember_getter(func) -> None:
    """Let a tensor attribute's getter through at once from now on (a method-wrapper hashes and
    compares by the descriptor it wraps, so each attribute is one entry)."""
    try:
        if len(_GETTERS) < 4096:
            _GETTERS[func] = True
    except TypeError:
        pass


class ApiCapture(TorchFunctionMode):
    """Records the outermost torch API call: inputs before it runs, outputs after."""

    def __init__(self, session):
        super().__init__()
        self.session = session

    # the layer's lifecycle (see debugger.LEVELS)
    def start(self, model=None) -> None:
        self.session.ops_advance_epoch = True
        self.__enter__()
        collectives.entered(self)

    def stop(self) -> None:
        collectives.left(self)
        self.__exit__(None, None, None)

    def end_step(self) -> None:
        pass

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if torch.compiler.is_compiling():
            # Dynamo traces modes: without this it would trace (and graph-break on) opdiff's own
            # Python for every op, and guard on _GETTERS (a recompile when it grows). Compiled
            # regions run uncaptured at L1 (use L2 for them).
            return func(*args, **(kwargs or {}))
        if func in _GETTERS:    # attribute reads (`.shape`, `.grad`): most of the calls a mode sees
            return func(*args) if not kwargs else func(*args, **kwargs)
        kwargs = kwargs or {}
        s = self.session
        func = dispatched(func)    # a library's wrapper of a torch function runs once, not twice
        op = naming.api_name(func)
        if op is None or s.own.active:
            # Attribute reads (`.shape`, `.grad`: most of the calls a mode sees) as cheaply as
            # possible, and opdiff's own work; other calls not recorded still warn from where
            # the user called them.
            if op is None and getattr(func, "__name__", None) == "__get__":
                _remember_getter(func)
                return func(*args, **kwargs)
            if op is not None:
                return func(*args, **kwargs)
            return call_as(api_caller(), func, args, kwargs)
        # (the collectives `collectives.record_ddp_allreduce`'s comm hook issues inside backward
        # are let through: DDP's bucket all-reduce runs in its C++ reducer, where no mode is active)
        if not s.recording or (in_backward() and not collectives.in_comm_hook(op)) or \
                capturing_graph():
            # (ops captured into a CUDA graph run on replay, not now: see guards.py)
            return call_as(api_caller(), func, args, kwargs)
        pending = self._begin(op, args, kwargs)
        if op.startswith("Distributed."):   # its group and per-group number (collectives.py)
            collectives.annotate(pending, func, args, kwargs, s)
        first_seq = torch._C._autograd._get_sequence_nr()
        out = call_as(api_caller(), func, args, kwargs)
        if pending is not None:
            self._finish(pending, args, out, first_seq)
        return out

    def _begin(self, op, args, kwargs) -> PendingRecord | None:
        """The call's pending record, its inputs described (None: not recorded)."""
        s = self.session
        pending = None
        try:
            op = naming.operator_name(op)
            index = s.next_index(op)
            name = record_name(op, Phase.FORWARD, index)
            mutating = ops.is_mutating(op, kwargs)
            if not s.selection.selected(name):
                if mutating:
                    s.forget((args, kwargs))
                return None
            pending = s.begin(name, op, Kind.API, Phase.FORWARD, index, s.stack_id(skip=3))
            record = pending.record
            compiled = provenance(2)    # an aten op of a torch.compile'd FX graph (compiled.py)
            if compiled is not None:
                record["compiled"] = compiled
                if is_inductor(record):   # (its buffers: see inductor.py)
                    s.follow_buffers()
            if draws(op, args, kwargs):     # before the call: what its generator held
                record["rng"] = fingerprint(args, kwargs)
            # Inputs are described now, before an in-place op can overwrite them.
            with s.own():
                record["inputs"], described_kwargs = s.describe_inputs(op, args, kwargs, name, record)
                if described_kwargs is not None:
                    record["kwargs"] = described_kwargs
            if mutating:  # what was described of its arguments may be overwritten by this op
                s.forget((args, kwargs))
                if s.overflow is not None:  # an in-place op creating inf overwrites its finite input
                    from .overflow import all_finite
                    pending.inputs_finite = all_finite((args, kwargs))
            # Gradient edges are taken before the call: an in-place op moves its input's edge.
            if s.selection.want_backward and torch.is_grad_enabled():
                pending.edges = input_edges((args, kwargs))
        except Exception as exc:  # keep the record, with what went wrong on it
            s.fail(pending, exc, op)
        return pending

    def _finish(self, pending: PendingRecord, args, out, first_seq: int) -> None:
        s = self.session
        result = out
        facts = None
        try:
            facts = ops.traits(pending.record["op"])
            if facts.collective and hasattr(out, "wait") and hasattr(out, "is_completed"):
                # async_op=True: the buffers are only meaningful once the collective is done.
                # Waiting here costs overlap while dumping, never numerics; the user's own
                # wait() is a no-op.
                out.wait()
            elif facts.collective and isinstance(out, torch.Tensor):
                out = collectives.waited(out)    # a functional collective's result (DTensor's)
            if args and (facts.returns_first_argument or
                         (facts.collective and not isinstance(out, torch.Tensor))):
                # These write into their first argument and return None (or a Work handle).
                result = args[0]
        except Exception as exc:
            s.fail(pending, exc)
        s.finish(pending, result, args, uninitialized=facts is not None and facts.uninitialized,
                 emit=s.selection.want_forward)
        if s.selection.want_backward and torch.is_grad_enabled():
            try:
                hook_api_backward(s, pending, result, first_seq)
            except Exception as exc:
                s.fail(pending, exc)
