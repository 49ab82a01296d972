"""Leaves: tensors that enter the recorded ops without a recorded op making them.

A model's parameters and buffers, and the tensors given to the root module's call, are what two
runs must start from alike. Each is recorded once per step, as its own record of kind
`Kind.LEAF`, just before the first recorded op that reads it, so that the comparison checks it
before any op (and names it, not the op that reads it, when it differs):

    {"name": "Parameter.layer1.0.conv1.weight.0.forward", "op": "Parameter.layer1.0.conv1.weight",
     "kind": "leaf", "phase": "forward", "leaf": "parameter", "tensor": "layer1.0.conv1.weight",
     "reader": "Functional.conv2d.0.forward", "outputs": [descriptor], "stack": ...}

The reading op's input descriptor carries `"leaf"` and `"fqn"` too. Parameters and buffers are
matched by identity (one dict lookup per tensor argument); the table holds weak references and is
built once per `start()`. A DTensor made of a parameter (`from_local`) in an earlier step and
read again in this one (DDP's hook for tensor-parallel modules keeps them) is a read of that
parameter: its leaf record is written there, the DTensor's descriptor left untagged.
"""
from __future__ import annotations

import weakref
from typing import Any, Optional

import torch

from ..store.schema import Kind, Phase, Role, module_path, record_name
from .guards import never_compiled

PARAMETER, BUFFER, INPUT = "parameter", "buffer", "input"
_PREFIX = {PARAMETER: "Parameter", BUFFER: "Buffer", INPUT: "Input"}


class Leaves:
    """id(tensor) -> (weakref, what, fqn) for the followed model(s), plus this step's inputs."""

    def __init__(self) -> None:
        self.table: dict[int, tuple[Any, str, str]] = {}
        self._inputs: dict[int, tuple[Any, str, str]] = {}
        self._seen: set[int] = set()           # leaves recorded this step
        self._models: list[Any] = []           # weak references
        self._handles: list[Any] = []
        self._calls = 0
        # storage address -> the one parameter or buffer on it: Inductor hands its kernels
        # views made without autograd (`reinterpret_tensor`, no `_base`); built on demand
        self._by_storage: Optional[dict[int, int]] = None

    def follow_storage(self) -> None:
        """Find a leaf by its storage too (`find`), for compiled code's views of it."""
        if self._by_storage is None:
            self._by_storage = {}
            shared: set[int] = set()
            for key, (ref, _, _) in self.table.items():
                t = ref()
                if t is None:
                    continue
                address = t.untyped_storage().data_ptr()
                if address in self._by_storage:
                    shared.add(address)      # (flat parameters: which one is not known)
                self._by_storage[address] = key
            for address in shared:
                del self._by_storage[address]

    def follow(self, models: Any) -> None:
        """Build the table of `models`' parameters and buffers (kept when the models are the same)."""
        models = list(models) if isinstance(models, (list, tuple)) else [models]
        models = [m for m in models if isinstance(m, torch.nn.Module)]
        if len(models) == len(self._models) and all(r() is m for r, m in zip(self._models, models)):
            return
        self._models = [weakref.ref(m) for m in models]
        table: dict[int, tuple[Any, str, str]] = {}
        for i, model in enumerate(models):
            prefix = f"{i}." if len(models) > 1 else ""
            for what, named in ((BUFFER, model.named_buffers()), (PARAMETER, model.named_parameters())):
                for fqn, t in named:
                    try:
                        table[id(t)] = (weakref.ref(t), what, prefix + fqn)
                    except TypeError:
                        continue
        self.table = table
        if self._by_storage is not None:
            self._by_storage = None
            self.follow_storage()

    def hook_inputs(self) -> None:
        """Tag the tensors of each root module call as inputs (until `unhook`).

        Not when the root is `torch.compile`d: its hooks run inside the compiled frame, where
        tagging would guard on each input's identity and on the call count (a recompile at each
        new input or call); a compiled root's inputs are not leaves."""
        for ref in self._models:
            model = ref()
            if model is not None:
                self._handles.append(model.register_forward_pre_hook(
                    never_compiled(self._root_call), with_kwargs=True))

    def unhook(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _root_call(self, module: Any, args: tuple, kwargs: dict) -> None:
        call = self._calls
        self._calls += 1
        suffix = f".call{call}" if call else ""
        for slot, value in list(enumerate(args)) + list(kwargs.items()):
            if isinstance(value, torch.Tensor) and id(value) not in self.table:
                try:
                    self._inputs[id(value)] = (weakref.ref(value), INPUT, f"{slot}{suffix}")
                except TypeError:
                    continue
        return None

    def scope_inputs(self, module_label: str, args: tuple) -> None:
        """Tag the tensors a module call that opens a dump's `scope` reads as inputs: made
        before the dump, they are what the scope starts from (`scope_input_fqn`)."""
        path = module_path(module_label)
        if not path:
            return          # (the root call's are inputs already)
        for slot, value in enumerate(args):
            if isinstance(value, torch.Tensor) and id(value) not in self.table \
                    and id(value) not in self._inputs:
                try:
                    self._inputs[id(value)] = (weakref.ref(value), INPUT,
                                               scope_input_fqn(path, slot))
                except TypeError:
                    continue

    @property
    def has_inputs(self) -> bool:
        """Whether root-call inputs are known this step."""
        return bool(self._inputs)

    def end_step(self) -> None:
        """The step closed: every leaf is recorded again in the next one."""
        self._seen.clear()
        self._inputs.clear()
        self._calls = 0

    def find(self, t: torch.Tensor) -> Optional[tuple[str, str, torch.Tensor]]:
        """(what, fqn, the leaf) when t is a followed leaf or a view of one (aten ops get a
        linear's weight transposed), else None."""
        key = id(t)
        entry = self.table.get(key) or self._inputs.get(key)
        if entry is None:
            base = t._base
            if base is None:
                if self._by_storage is None or not t.numel():
                    return None
                found = self._by_storage.get(t.untyped_storage().data_ptr())
                entry = self.table.get(found) if found is not None else None
                if entry is None or entry[0]() is None:
                    return None
                return entry[1], entry[2], entry[0]()
            t, key = base, id(base)
            entry = self.table.get(key) or self._inputs.get(key)
            if entry is None:
                return None
        if entry[0]() is not t:
            return None
        return entry[1], entry[2], t

    def made_of(self, t: torch.Tensor) -> Optional[tuple[str, str, torch.Tensor]]:
        """(what, fqn, the leaf) when t is a DTensor whose local tensor is a followed leaf or a
        view of one (`DTensor.from_local` of a parameter), else None."""
        if type(t) is torch.Tensor:
            return None          # (the common case, without an attribute lookup)
        local = getattr(t, "_local_tensor", None)
        return self.find(local) if isinstance(local, torch.Tensor) else None

    def first_use(self, t: torch.Tensor) -> bool:
        """True the first time this step a leaf is read (its record is then due)."""
        key = id(t)
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


def scope_input_fqn(path: str, slot: int) -> str:
    """The FQN of a scope's input: `blocks.1.input0` (a root call's input is its slot)."""
    return f"{path}.{SCOPE_INPUT}{slot}"


SCOPE_INPUT = "input"


def leaf_record(what: str, fqn: str, desc: dict, reader: dict) -> dict:
    """The record of one leaf read first by the record `reader` (see module docstring)."""
    op = f"{_PREFIX[what]}.{fqn}"
    return {"name": record_name(op, Phase.FORWARD, 0), "op": op, "kind": Kind.LEAF,
            "phase": Phase.FORWARD, "leaf": what, "tensor": fqn, "reader": reader["name"],
            "module": reader.get("module"), "stack": reader.get("stack"), "outputs": [desc]}


def tag_leaves(session: Any, values: Any, reader: dict) -> None:
    """Tag the descriptors of leaf tensors among `values`, (tensor, its descriptor) pairs, and
    emit the record of each leaf read for the first time this step (a list argument such as an
    LSTM's weights is looked into once)."""
    leaves: Leaves = session.leaves
    for value, desc in values:
        if isinstance(value, torch.Tensor):
            _tag_one(session, leaves, value, desc, reader)
        elif isinstance(value, (list, tuple)) and isinstance(desc, dict) and "items" in desc:
            for v, d in zip(value, desc["items"]):
                if isinstance(v, torch.Tensor):
                    _tag_one(session, leaves, v, d, reader)


def _tag_one(session: Any, leaves: Leaves, t: torch.Tensor, desc: dict, reader: dict) -> None:
    found = leaves.find(t)
    if found is None:
        # A DTensor made of a parameter in an earlier step and kept (DDP's hook for
        # tensor-parallel modules puts its `from_local` DTensors in the module after the first
        # forward, and reads them from then on): the parameter is read here, untagged as in the
        # step that made it (its record, then a reader of a DTensor made of it).
        made = leaves.made_of(t)
        if made is not None and leaves.first_use(made[2]) and session.selection.want_forward:
            _emit(session, *made, reader)
        return
    what, fqn, t = found
    desc["leaf"] = what
    desc["fqn"] = fqn
    if desc.get("overwritten"):
        return        # written without being read (an initialiser): its first read comes later
    if not leaves.first_use(t) or not session.selection.want_forward:
        return
    _emit(session, what, fqn, t, reader)


def _emit(session: Any, what: str, fqn: str, t: torch.Tensor, reader: dict) -> None:
    # (described again under its own name: statistics shared, a saved tensor referenced)
    own = session.describe(t, record_name(f"{_PREFIX[what]}.{fqn}", Phase.FORWARD, 0), Role.OUTPUT, 0)
    own.pop("leaf", None)
    session.emit(leaf_record(what, fqn, own, reader))


__all__ = ["Leaves", "leaf_record", "scope_input_fqn", "tag_leaves", "PARAMETER", "BUFFER", "INPUT"]
