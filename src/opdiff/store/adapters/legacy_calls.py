"""Legacy per-tensor lines -> opdiff op-call records: name parsing and call grouping.

ptdbg_ascend and torch_npu.hooks write one line per tensor, named with underscores
(`Functional_conv2d_0_forward_input.0`, `Module_Conv2d_forward_output`). `parse_ptdbg_name` and
`parse_hooks_name` split such a name into op, phase, call counter and position; `Calls` gathers
consecutive lines of one call into one record and gives calls a counter where the format has none.

The line grammar (a role suffix `_input.0`, `_stack_info` lines, `pre_forward`, counter-less
module names) is these formats' own and stays here; dotted msprobe names, the names of the
records built and the forward name of a backward call come from `opdiff.store.schema`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from ..schema import (API_PREFIXES, Kind, Phase, RecordName, Role, module_op, record_name,
                      split_tensor_name)
from .descriptors import place

_STACK_INFO = "stack_info"
_SWAPPED = {Role.INPUT: Role.OUTPUT, Role.OUTPUT: Role.INPUT}
_PTDBG = re.compile(r"^(?P<head>.+?)_(?P<n>\d+)_(?P<phase>pre_forward|forward|backward)"
                    r"_(?P<role>input|output|stack_info)(?P<path>(?:\.\w+)*)$")
_HOOKS_V1 = re.compile(r"^(?P<phase>forward|backward)_(?P<cls>.+)_(?P<role>input|output)(?P<path>(?:\.\w+)*)$")
_HOOKS_V2 = re.compile(r"^(?P<head>.+?)_(?P<phase>forward|backward)_(?P<role>input|output|stack_info)"
                       r"(?P<path>(?:\.\w+)*)$")


@dataclass(frozen=True)
class TensorName:
    """One line's name, split: which call it belongs to and where in that call."""
    op: str               # "Functional.conv2d", "Module.Conv2d"
    kind: str             # "api" | "module" | "aten" | "param_grad"
    phase: str            # "forward" | "backward"
    counter: int | None   # None: the format has none, one is assigned
    role: str             # "input" | "output" | "parameters" | "stack_info"
    path: tuple[str, ...]           # ("0",), ("3", "0"), ("weight",)
    record: str | None = None   # full record name when the line already gave it (dotted names)


def _op_of(head: str) -> tuple[str, str]:
    """(op, kind) for an underscore head like "Functional_conv2d" or "Module_Conv2d"."""
    prefix, _, rest = head.partition("_")
    if prefix == "Module" and rest:
        return module_op("", rest), Kind.MODULE
    if prefix in API_PREFIXES and rest:     # the legacy form's `_` after the namespace is a `.`
        return f"{prefix}.{rest}", Kind.ATEN if prefix == "Aten" else Kind.API
    return module_op("", head), Kind.MODULE   # ptdbg module_dump(module, "user_name")


def _dotted(name: str) -> TensorName | None:
    """A tensor name already in msprobe's dotted form, or None."""
    record, role, slot = split_tensor_name(name)
    if role is None or slot is None:
        return None
    parsed = RecordName.parse(record)
    if parsed is None or parsed.text != record:     # not a dotted record name
        return None
    return TensorName(parsed.record_op, parsed.kind, parsed.phase, parsed.index, role,
                      tuple(slot.split(".")), record)


def parse_ptdbg_name(name: str) -> TensorName | None:
    """A ptdbg_ascend tensor or stack name, or None if it is not one.

    Names without a call counter (`Tensor___iadd___forward_input.0`, as in some older scope
    settings) parse like torch_npu.hooks names: the counter is assigned in execution order.
    """
    m = _PTDBG.match(name)
    if not m:
        return _dotted(name) or parse_hooks_name(name)
    op, kind = _op_of(m["head"])
    phase = Phase.FORWARD if m["phase"] == "pre_forward" else m["phase"]
    path = tuple(p for p in m["path"].split(".") if p)
    return TensorName(op, kind, phase, int(m["n"]), m["role"], path)


def parse_hooks_name(name: str) -> TensorName | None:
    """A torch_npu.hooks tensor name (no counter), or None if it is not one."""
    dotted = _dotted(name)
    if dotted:
        return dotted
    m = _HOOKS_V1.match(name)
    if m:
        op, kind = module_op("", m["cls"]), Kind.MODULE
        counter = None
    else:
        m = _HOOKS_V2.match(name)
        if not m:
            return None
        head, counter = m["head"], None
        numbered = re.match(r"^(.+)_(\d+)$", head)
        if numbered and numbered.group(1).partition("_")[0] in API_PREFIXES:
            head, counter = numbered.group(1), int(numbered.group(2))
        op, kind = _op_of(head)
    path = tuple(p for p in m["path"].split(".") if p)
    return TensorName(op, kind, m["phase"], counter, m["role"], path)


class Calls:
    """Groups consecutive lines into op calls and emits opdiff records."""

    def __init__(self, swap_backward: bool):
        self.swap = swap_backward
        self.current: dict[str, Any] | None = None
        self.seen: set[tuple[str, tuple[str, ...]]] = set()
        self.last_role = ""
        self.head: tuple[Any, ...] | None = None
        self.forward_count: dict[str, int] = {}
        self.open_forwards: dict[str, list[int]] = {}   # op -> [counters of forward calls not yet matched]
        self.backward_count: dict[str, int] = {}
        self.seq = 0

    def add(self, tn: TensorName, desc: Optional[dict[str, Any]] = None,
            stack: Optional[int] = None) -> Optional[dict[str, Any]]:
        """Feed one line; returns the previous call's record when this line starts a new call."""
        head = (tn.record or tn.op, tn.phase, tn.counter)
        position = (tn.role, tn.path)
        new_call = (self.current is None or head != self.head
                    or (tn.role == Role.INPUT and self.last_role == Role.OUTPUT)
                    or (tn.role != _STACK_INFO and position in self.seen))
        done, current = None, self.current
        if new_call or current is None:
            done = self.finish()
            current = self._start(tn, head)
        if tn.role == _STACK_INFO:
            current["_stack"] = stack
        else:
            self.seen.add(position)
            self.last_role = tn.role
            self._put(current, tn, desc or {"type": "none"})
        return done

    @property
    def current_name(self) -> str:
        """The name of the call in progress ("" before the first line)."""
        return self.current["name"] if self.current is not None else ""

    def _start(self, tn: TensorName, head: tuple[Any, ...]) -> dict[str, Any]:
        counter = tn.counter
        if counter is None:
            if tn.phase == Phase.FORWARD:
                counter = self.forward_count.get(tn.op, 0)
                self.forward_count[tn.op] = counter + 1
                self.open_forwards.setdefault(tn.op, []).append(counter)
            elif self.open_forwards.get(tn.op):
                counter = self.open_forwards[tn.op].pop()
            else:
                counter = self.backward_count.get(tn.op, 0)
            if tn.phase == Phase.BACKWARD:
                self.backward_count[tn.op] = counter + 1
        # Only dotted names are parameter-gradient records, and they carry their own name.
        name = tn.record or record_name(tn.op, tn.phase, counter, tn.kind)
        record = {"seq": self.seq, "name": name, "op": tn.op, "kind": tn.kind, "phase": tn.phase,
                  "module": None, "inputs": [], "outputs": [], "stack": None}
        if tn.phase == Phase.BACKWARD and tn.kind != Kind.PARAM_GRAD:
            record["forward"] = RecordName(tn.op, Phase.FORWARD, counter, tn.kind).text
        self.seq += 1
        self.current, self.head = record, head
        self.seen, self.last_role = set(), ""
        return record

    def _put(self, current: dict[str, Any], tn: TensorName, desc: dict[str, Any]) -> None:
        role = self.role_of(tn)
        if role == Role.PARAMETERS:
            current.setdefault("parameters", {})[".".join(tn.path)] = desc
            return
        if role == Role.INPUT and tn.path and not tn.path[0].isdigit():  # a keyword argument
            current.setdefault("kwargs", {})[".".join(tn.path)] = desc
            return
        target = current["inputs" if role == Role.INPUT else "outputs"]
        place(target, list(tn.path) or ["0"], desc)

    def role_of(self, tn: TensorName) -> str:
        """The line's role in opdiff's sense: torch_npu.hooks' backward lines are swapped
        (its `backward_input` holds the gradients w.r.t. the forward inputs: outputs)."""
        if self.swap and tn.phase == Phase.BACKWARD and tn.record is None:
            return _SWAPPED[tn.role]
        return tn.role

    def finish(self) -> dict[str, Any] | None:
        """The call in progress as a record (None when there is none)."""
        record, self.current = self.current, None
        return record
