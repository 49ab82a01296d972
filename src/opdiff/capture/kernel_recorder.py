"""One call of a kernel Inductor generated, recorded from its `KernelInfo`, whatever its backend.

A kernel record is `Inductor.<kernel>.<n>.<phase>` of kind `kernel`: its `in_ptr`/`in_out_ptr`
arguments described before the call, its `out_ptr`/`in_out_ptr` ones after it, and the
`compiled` field the comparison reads: `{"graph": <wrapper file>, "node": <kernel>, "backend":
"inductor", "modules": [...], "source": [file, line]}` (`kernel_catalog.KernelInfo`); at mix
`from_parameters` lists the outputs the kernel computes from parameters and buffers alone
(autocast's weight casts, from its program); a tensor dump's record carries the `program`,
which `opdiff check` replays. A kernel's arguments are only read: the compiled step stays
bitwise the same.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from ..store.schema import INDUCTOR, Kind, Phase, Role, record_name
from .kernel_catalog import IN, IN_OUT, OUT, KernelInfo
from .kernel_programs import inputs_of_outputs, inputs_read
from .leaves import tag_leaves

KERNEL_PREFIX = "Inductor"


class KernelRecorder:
    """Records the calls of the kernels its sources hand it (`call`)."""

    def __init__(self, session: Any):
        self.session = session

    def prepare(self, info: KernelInfo) -> "KernelCalls":
        """What a kernel's calls share, worked out once per kernel."""
        return KernelCalls(self.session, info)


class KernelCalls:
    """The calls of one kernel: `call(line, args, run)` runs it (`run()`), recording it when
    the session records and selects it; `line` is the wrapper line that calls it."""

    def __init__(self, s: Any, info: KernelInfo):
        self.s, self.info = s, info
        self.op = f"{KERNEL_PREFIX}.{info.name}"
        self.roles = info.roles
        program = info.program
        self.derived = inputs_of_outputs(program) if "steps" in program else {}
        # (only a tensor dump can replay it: a statistics dump is not made larger by programs)
        self.program = program if s.config.task == "tensor" else {}
        self.reads = inputs_read(self.program)
        # at mix, as the API layer: forward calls only (backward is judged through the
        # parameter gradients)
        self.forward_only = s.config.level != "L2"

    def call(self, line: int, args: Sequence[Any], run: Callable[[], Any]) -> Any:
        s = self.s
        if s.own.active or not s.recording:
            return run()
        phase = Phase.BACKWARD if torch._C._current_graph_task_id() != -1 else Phase.FORWARD
        if self.forward_only and phase == Phase.BACKWARD:
            return run()
        roles, op = self.roles, self.op
        pending = ins = None
        try:
            index = s.next_index(f"{op}.{phase}")
            name = record_name(op, phase, index, Kind.KERNEL)
            sel = s.selection
            if sel.selected(name) and (sel.want_forward if phase == Phase.FORWARD
                                       else sel.want_backward):
                # its outputs are written through raw pointers and read through fresh
                # views: dataflow by data address from here on (describe.py)
                s.follow_buffers()
                pending = s.begin(name, op, Kind.KERNEL, phase, index, None)
                pending.record["compiled"] = provenance(self.info, line)
                if self.program:
                    pending.record["program"] = self.program
                ins = [a for a, r in zip(args, roles) if r in (IN, IN_OUT)]
                written = _storages([a for a, r in zip(args, roles) if r == OUT])
                with s.own():
                    pending.record["inputs"] = _inputs(s, ins, roles, pending.record,
                                                       self.reads, written)
                made = from_parameters(self.derived, pending.record["inputs"])
                if made:
                    pending.record["compiled"]["from_parameters"] = made
        except Exception as exc:
            s.fail(pending, exc, op)
            if pending is not None:
                pending.record.setdefault("inputs", [])
        out = run()
        outs = [a for a, r in zip(args, roles) if r in (OUT, IN_OUT)]
        # written through raw pointers, unseen by version counters: what capture knows
        # of these buffers is stale (else a later read looks like a write outside torch)
        s.forget(outs)
        if pending is not None:
            s.finish(pending, outs, ins)
        return out


def provenance(info: KernelInfo, line: int) -> dict[str, Any]:
    """The `compiled` field of a kernel call at this wrapper line."""
    out: dict[str, Any] = {"graph": info.wrapper.rsplit("/", 1)[-1], "node": info.name,
                           "backend": INDUCTOR}
    modules = info.modules_at(line)
    if modules is not None:
        out["modules"] = modules
    source = info.source_at(line)
    if source is not None:
        out["source"] = source
    return out


def _inputs(s: Any, ins: list[Any], roles: Sequence[str], record: dict[str, Any], reads: set[int],
            written: set[int]) -> list[dict[str, Any]]:
    """A kernel's inputs: its `in_ptr` arguments, and its `in_out_ptr` ones where a recorded op
    made them or its program reads them (`reads`; otherwise Inductor may have handed the kernel
    a fresh buffer it writes before reading: shape and dtype only, as an `out=` tensor). An
    `in_ptr` argument no recorded op made whose memory the kernel is also handed to write
    (`written`: a `cat`'s buffer, written through aliases of its halves and read whole in the
    same kernel) is such a buffer too, unless its program reads it. Parameters, buffers and
    the root call's inputs are tagged as leaves (leaves.py)."""
    name = record["name"]
    described = s.describe_all(ins, name, Role.INPUT)
    tag_leaves(s, zip(ins, described), record)
    kinds = [r for r in roles if r in (IN, IN_OUT)]
    for i, (kind, desc) in enumerate(zip(kinds, described)):
        if not isinstance(desc, dict) or "producer" in desc or i in reads:
            continue
        if kind == IN_OUT or (not desc.get("leaf") and _storages([ins[i]]) & written):
            described[i] = s.unread(ins[i], name, Role.INPUT, i)
    return described


def from_parameters(derived: dict[int, set[int]], inputs: list[Any]) -> list[list[Any]]:
    """[output index, [parameter fqns]] for each output a kernel computes from parameters and
    buffers alone (`derived`: the inputs each output is computed from, by its program), such as
    autocast's bf16 cast of a Linear's weight that Inductor fuses into another module's kernel:
    the comparison reads it as that parameter's, not as data handed between modules."""
    out = []
    for slot, read in sorted(derived.items()):
        descs = [inputs[i] if 0 <= i < len(inputs) else None for i in sorted(read)]
        fqns = [str(d["fqn"]) for d in descs if isinstance(d, dict)
                and d.get("leaf") in ("parameter", "buffer") and isinstance(d.get("fqn"), str)]
        if read and len(fqns) == len(read):
            out.append([slot, sorted(set(fqns))])
    return out


def _storages(tensors: list[Any]) -> set[int]:
    """The addresses of the storages of `tensors` (a view shares its base's)."""
    return {t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor)}


__all__ = ["KERNEL_PREFIX", "KernelRecorder", "KernelCalls", "provenance", "from_parameters"]
