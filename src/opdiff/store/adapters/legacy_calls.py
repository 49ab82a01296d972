"""Legacy per-tensor lines -> opdiff op-call records: name parsing and call grouping.

ptdbg_ascend and torch_npu.hooks write one line per tensor, named with underscores
(`Functional_conv2d_0_forward_input.0`, `Module_Conv2d_forward_output`). `parse_ptdbg_name` and
`parse_hooks_name` split such a name into op, phase, call counter and position; `Calls` gathers
consecutive lines of one call into one record and gives calls a counter where the format has none.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .descriptors import place

_API_PREFIXES = {"Functional", "Tensor", "Torch", "VF", "NPU", "Aten", "Distributed"}
_PTDBG = re.compile(r"^(?P<head>.+?)_(?P<n>\d+)_(?P<phase>pre_forward|forward|backward)"
                    r"_(?P<role>input|output|stack_info)(?P<path>(?:\.\w+)*)$")
_HOOKS_V1 = re.compile(r"^(?P<phase>forward|backward)_(?P<cls>.+)_(?P<role>input|output)(?P<path>(?:\.\w+)*)$")
_HOOKS_V2 = re.compile(r"^(?P<head>.+?)_(?P<phase>forward|backward)_(?P<role>input|output|stack_info)"
                       r"(?P<path>(?:\.\w+)*)$")
_DOTTED = re.compile(r"^(?P<record>.+?\.(?:\d+\.(?:forward|backward)|(?:forward|backward)\.\d+))"
                     r"\.(?P<role>input|output|parameters)\.(?P<path>.+)$")
_DOTTED_GRAD = re.compile(r"^(?P<record>.+\.parameters_grad\.\d+)\.(?P<path>.+)$")
_DOTTED_RECORD = re.compile(r"^(?P<op>.+)\.(?:(?P<n1>\d+)\.(?P<p1>forward|backward)"
                            r"|(?P<p2>forward|backward)\.(?P<n2>\d+))$")


@dataclass(frozen=True)
class TensorName:
    """One line's name, split: which call it belongs to and where in that call."""
    op: str               # "Functional.conv2d", "Module.Conv2d"
    kind: str             # "api" | "module" | "aten" | "param_grad"
    phase: str            # "forward" | "backward"
    counter: int | None   # None: the format has none, one is assigned
    role: str             # "input" | "output" | "parameters" | "stack_info"
    path: tuple           # ("0",), ("3", "0"), ("weight",)
    record: str | None = None   # full record name when the line already gave it (dotted names)


def _op_of(head: str) -> tuple[str, str]:
    """(op, kind) for an underscore head like "Functional_conv2d" or "Module_Conv2d"."""
    prefix, _, rest = head.partition("_")
    if prefix == "Module" and rest:
        return f"Module.{rest}", "module"
    if prefix in _API_PREFIXES and rest:
        return f"{prefix}.{rest}", "aten" if prefix == "Aten" else "api"
    return f"Module.{head}", "module"   # ptdbg module_dump(module, "user_name")


def _dotted(name: str) -> TensorName | None:
    m = _DOTTED.match(name)
    if m:
        rec = m["record"]
        mm = _DOTTED_RECORD.match(rec)
        phase = mm["p1"] or mm["p2"]
        counter = int(mm["n1"] or mm["n2"])
        op = mm["op"]
        kind = "module" if mm["p2"] else ("aten" if op.startswith("Aten.") else "api")
        return TensorName(op, kind, phase, counter, m["role"], tuple(m["path"].split(".")), rec)
    m = _DOTTED_GRAD.match(name)
    if m:
        rec = m["record"]
        op, _, n = rec.rpartition(".")
        return TensorName(op, "param_grad", "backward", int(n), "parameters", tuple(m["path"].split(".")), rec)
    return None


def parse_ptdbg_name(name: str) -> TensorName | None:
    """A ptdbg_ascend tensor or stack name, or None if it is not one.

    Names without a call counter (`Tensor___iadd___forward_input.0`, as in some older scope
    settings) parse like torch_npu.hooks names: the counter is assigned in execution order.
    """
    m = _PTDBG.match(name)
    if not m:
        return _dotted(name) or parse_hooks_name(name)
    op, kind = _op_of(m["head"])
    phase = "forward" if m["phase"] == "pre_forward" else m["phase"]
    path = tuple(p for p in m["path"].split(".") if p)
    return TensorName(op, kind, phase, int(m["n"]), m["role"], path)


def parse_hooks_name(name: str) -> TensorName | None:
    """A torch_npu.hooks tensor name (no counter), or None if it is not one."""
    dotted = _dotted(name)
    if dotted:
        return dotted
    m = _HOOKS_V1.match(name)
    if m:
        op, kind = f"Module.{m['cls']}", "module"
        counter = None
    else:
        m = _HOOKS_V2.match(name)
        if not m:
            return None
        head, counter = m["head"], None
        numbered = re.match(r"^(.+)_(\d+)$", head)
        if numbered and numbered.group(1).partition("_")[0] in _API_PREFIXES:
            head, counter = numbered.group(1), int(numbered.group(2))
        op, kind = _op_of(head)
    path = tuple(p for p in m["path"].split(".") if p)
    return TensorName(op, kind, m["phase"], counter, m["role"], path)


def record_name(op: str, kind: str, phase: str, counter: int) -> str:
    if kind == "module":
        return f"{op}.{phase}.{counter}"
    if kind == "param_grad":
        return f"{op}.{counter}"
    return f"{op}.{counter}.{phase}"


class Calls:
    """Groups consecutive lines into op calls and emits opdiff records."""

    def __init__(self, swap_backward: bool):
        self.swap = swap_backward
        self.current: dict | None = None
        self.seen: set = set()
        self.last_role = ""
        self.head: tuple | None = None
        self.forward_count: dict = {}
        self.open_forwards: dict = {}   # op -> [counters of forward calls not yet matched]
        self.backward_count: dict = {}
        self.seq = 0

    def add(self, tn: TensorName, desc: dict | None = None, stack=None) -> dict | None:
        """Feed one line; returns the previous call's record when this line starts a new call."""
        head = (tn.record or tn.op, tn.phase, tn.counter)
        position = (tn.role, tn.path)
        new_call = (self.current is None or head != self.head
                    or (tn.role == "input" and self.last_role == "output")
                    or (tn.role != "stack_info" and position in self.seen))
        done = None
        if new_call:
            done = self.finish()
            self._start(tn, head)
        if tn.role == "stack_info":
            self.current["_stack"] = stack
        else:
            self.seen.add(position)
            self.last_role = tn.role
            self._put(tn, desc)
        return done

    def _start(self, tn: TensorName, head: tuple) -> None:
        counter = tn.counter
        if counter is None:
            if tn.phase == "forward":
                counter = self.forward_count.get(tn.op, 0)
                self.forward_count[tn.op] = counter + 1
                self.open_forwards.setdefault(tn.op, []).append(counter)
            elif self.open_forwards.get(tn.op):
                counter = self.open_forwards[tn.op].pop()
            else:
                counter = self.backward_count.get(tn.op, 0)
            if tn.phase == "backward":
                self.backward_count[tn.op] = counter + 1
        name = tn.record or record_name(tn.op, tn.kind, tn.phase, counter)
        record = {"seq": self.seq, "name": name, "op": tn.op, "kind": tn.kind, "phase": tn.phase,
                  "module": None, "inputs": [], "outputs": [], "stack": None}
        if tn.phase == "backward" and tn.kind != "param_grad":
            record["forward"] = (name.replace(".backward", ".forward", 1) if tn.record
                                 else record_name(tn.op, tn.kind, "forward", counter))
        self.seq += 1
        self.current, self.head = record, head
        self.seen, self.last_role = set(), ""

    def _put(self, tn: TensorName, desc: dict) -> None:
        role = tn.role
        if self.swap and tn.phase == "backward" and tn.record is None:
            role = {"input": "output", "output": "input"}[role]
        if role == "parameters":
            self.current.setdefault("parameters", {})[".".join(tn.path)] = desc
            return
        if role == "input" and tn.path and not tn.path[0].isdigit():  # a keyword argument
            self.current.setdefault("kwargs", {})[".".join(tn.path)] = desc
            return
        target = self.current["inputs" if role == "input" else "outputs"]
        place(target, list(tn.path) or ["0"], desc)

    def finish(self) -> dict | None:
        record, self.current = self.current, None
        return record
