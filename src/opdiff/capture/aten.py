"""L2: aten ops through TorchDispatchMode, including the ops autograd runs in backward.

Backward aten ops are recognised by the autograd node executing them and linked to the forward
op that created that node through its sequence number (as the profiler does).
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..ops import SKIPPED_ATEN
from ..store.schema import Kind, Phase, record_name
from .compiled import provenance
from .guards import capturing_graph
from .randomness import draws, fingerprint
from .sink import PendingRecord

if TYPE_CHECKING:
    from types import FrameType


_CHECKPOINT_FILE = os.path.join(os.path.dirname(torch.__file__), "utils", "checkpoint.py")


def _recomputing() -> bool:
    """True inside torch.utils.checkpoint's recomputation (backward ops run without grad mode,
    so this frame walk happens only for the rare grad-enabled op inside backward)."""
    f: FrameType | None = sys._getframe(2)
    while f is not None:
        if f.f_code.co_filename == _CHECKPOINT_FILE:
            return True
        f = f.f_back
    return False


class AtenCapture(TorchDispatchMode):
    """Records aten ops (views and bookkeeping skipped); sees forward and autograd's backward."""

    def __init__(self, session):
        super().__init__()
        self.session = session
        self.forward_names: dict[int, str] = {}   # autograd sequence nr -> forward record name
        self.compiled_names: dict[int, str] = {}  # a compiled graph node's seq_nr -> forward record

    # the layer's lifecycle (see debugger.LEVELS)
    def start(self, model=None) -> None:
        self.__enter__()

    def stop(self) -> None:
        self.__exit__(None, None, None)

    def end_step(self) -> None:
        self.forward_names.clear()
        self.compiled_names.clear()

    @classmethod
    def ignore_compile_internals(cls):
        # Without this, torch.compile silently runs the model eagerly while the mode is active.
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        s = self.session
        packet = func.overloadpacket.__name__
        if s.own.active or not s.recording or packet in SKIPPED_ATEN or func.is_view or capturing_graph():
            return func(*args, **kwargs)
        node = torch._C._current_autograd_node()
        if node is not None and torch.is_grad_enabled() and _recomputing():
            # Activation checkpointing re-runs the forward inside backward: already recorded.
            return func(*args, **kwargs)
        phase = Phase.BACKWARD if node is not None else Phase.FORWARD
        op = f"Aten.{packet}"
        pending = self._begin(op, phase, node, func, args, kwargs)
        if pending is not None and phase == Phase.FORWARD:
            # Autograd creates the node before dispatching here: its sequence nr is the last one.
            self.forward_names.setdefault(torch._C._autograd._get_sequence_nr() - 1,
                                          pending.record["name"])
        out = func(*args, **kwargs)
        if pending is not None:
            s.finish(pending, out, args)
        return out

    def _begin(self, op: str, phase: str, node, func, args, kwargs) -> PendingRecord | None:
        """The op's pending record, its inputs described (None: not recorded)."""
        s = self.session
        pending = None
        try:
            index = s.next_index(f"{op}.{phase}")
            name = record_name(op, phase, index, Kind.ATEN)
            sel = s.selection
            if not sel.selected(name) or not (sel.want_forward if phase == Phase.FORWARD else sel.want_backward):
                return None
            pending = s.begin(name, op, Kind.ATEN, phase, index,
                              s.stack_id(skip=4) if phase == Phase.FORWARD else None)
            record = pending.record
            if node is None and draws(op, args, kwargs):
                record["rng"] = fingerprint(args, kwargs)
            if node is not None:
                record["autograd_node"] = node.name()
                # (inside a compiled backward the node is the whole compiled function's: its
                # number names the first op its forward ran, not this op's; an FX graph's
                # node says below, Inductor's calls say none)
                record["forward"] = (None if record["autograd_node"] == "CompiledFunctionBackward"
                                     else self.forward_names.get(node._sequence_nr()))
            compiled = provenance(2)    # run by an FX graph of torch.compile (compiled.py)
            if compiled is not None:
                record["compiled"] = compiled
                seq = compiled.get("seq_nr")
                if seq is not None and phase == Phase.FORWARD:
                    self.compiled_names.setdefault(seq, name)
                elif seq is not None:
                    record["forward"] = self.compiled_names.get(seq)
            with s.own():
                try:
                    record["inputs"], described_kwargs = s.describe_inputs(op, args, kwargs, name, record)
                    if described_kwargs is not None:
                        record["kwargs"] = described_kwargs
                finally:
                    if func._schema.is_mutable:
                        s.forget((args, kwargs))
        except Exception as exc:  # keep the record, with what went wrong on it
            if pending is not None:
                pending.record.setdefault("inputs", [])
            s.fail(pending, exc, op)
        return pending
