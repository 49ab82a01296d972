"""L1: every torch API call, through TorchFunctionMode (sees `from torch import relu` too)."""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from . import naming
from .backward import hook_api_backward, in_backward, input_edges
from .guards import capturing_graph

class ApiCapture(TorchFunctionMode):
    """Records the outermost torch API call: inputs before it runs, outputs after."""

    def __init__(self, session):
        super().__init__()
        self.session = session

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():
            # Dynamo traces modes: without this it would trace (and graph-break on) opdiff's own
            # Python for every op. Compiled regions run uncaptured at L1 (use L2 for them).
            return func(*args, **kwargs)
        s = self.session
        op = naming.api_name(func)
        if op is None or s.busy or s.writer is None or in_backward() or capturing_graph():
            # (ops captured into a CUDA graph run on replay, not now: see guards.py)
            return func(*args, **kwargs)
        ctx = None
        try:
            ctx = self._before(op, args, kwargs)
        except Exception as exc:
            s.failed(op, exc)
        first_seq = torch._C._autograd._get_sequence_nr()
        out = func(*args, **kwargs)
        if ctx is not None:
            try:
                self._after(ctx, args, out, first_seq)
            except Exception as exc:
                s.failed(op, exc, ctx[1])
        return out

    def _before(self, op, args, kwargs):
        s = self.session
        op = naming.operator_name(op)
        index = s.next_index(op)
        name = f"{op}.{index}.forward"
        mutating = naming.is_mutating(op, kwargs)
        if not s.selected(name):
            if mutating:
                s.describer.forget((args, kwargs))
            return None
        stack_ = getattr(s.local, "modules", None)
        module = stack_[-1] if stack_ else None
        record = {"name": name, "op": op, "kind": "api", "phase": "forward", "module": module,
                  "stack": s.stack_id(skip=3)}
        edges = []
        try:
            # Inputs are described now, before an in-place op can overwrite them.
            with s.internal():
                record["inputs"], described_kwargs = s.describe_inputs(op, args, kwargs, name)
                if described_kwargs is not None:
                    record["kwargs"] = described_kwargs
            if mutating:  # what was described of its arguments may be overwritten by this op
                s.describer.forget((args, kwargs))
                if s.overflow is not None:  # an in-place op creating inf overwrites its finite input
                    from .overflow import all_finite
                    record["_inputs_finite"] = all_finite((args, kwargs))
            # Gradient edges are taken before the call: an in-place op moves its input's edge.
            if s.want_backward and torch.is_grad_enabled():
                edges = input_edges((args, kwargs))
        except Exception as exc:  # keep the record, with what went wrong on it
            s.failed(name, exc, record)
        return (op, record, index, edges)

    def _after(self, ctx, args, out, first_seq):
        s = self.session
        op, record, index, edges = ctx
        result = out
        if op.startswith("Distributed.") and hasattr(out, "wait") and hasattr(out, "is_completed"):
            # async_op=True: the buffers are only meaningful once the collective is done. Waiting
            # here costs overlap while dumping, never numerics; the user's own wait() is a no-op.
            out.wait()
        if args and (op == "Tensor.__setitem__" or
                     (op.startswith("Distributed.") and not isinstance(out, torch.Tensor))):
            # These write into their first argument and return None (or a Work handle).
            result = args[0]
        with s.internal():
            try:
                if naming.makes_uninitialized(op):
                    record["outputs"] = [s.describer.unread(result, f"{record['name']}.output.0",
                                                            "uninitialized")]
                else:
                    record["outputs"] = s.describe_all([result], record["name"], "output") \
                        if not isinstance(result, (tuple, list)) else s.describe_all(result, record["name"], "output")
            except Exception as exc:  # keep the record and say what failed
                record.setdefault("outputs", [])
                s.failed(op, exc, record)
        if s.want_forward:
            s.emit(record)
        s.check_overflow(record, args, result)
        if s.want_backward and torch.is_grad_enabled():
            hook_api_backward(s, record["name"], op, index, record["module"], record["stack"], result,
                              edges, first_seq)
