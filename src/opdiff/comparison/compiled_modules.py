"""Eager at level mix against compiled code: each module's call judged at its boundary.

At mix an eager run records torch calls and module calls; a compiled run records the aten ops
its forward graphs run (`compiled` provenance: the module each node came from) and no module
call (module hooks do not fire inside compiled code). Ops of the two sides never pair one to
one. But a module's call is a region whose members the compiler names: the compiled ops whose
`compiled.module` is the module's path or one inside it. Its boundary is found through the
dump's dataflow (`"producer": [seq, slot]`): the tensors its ops read that ops outside it
made, and the tensors its ops made that ops outside it read. Where these correspond one to one
with the eager module call's inputs and outputs (the same count and the same shapes, no two of
a shape), the target gets a module record of that call, with that name, made of those
descriptors, which pairs with the eager one by name and is judged as any module call (named
where its inputs agree and its outputs do not). A module called more than once, one whose ops
read a tensor whose maker is not recorded or draw random numbers (dropout in training), or
whose boundary does not correspond, gets none:
it is not judged, never guessed. Only forward graphs are recorded at mix: backward is judged
through the parameter gradients.
"""
from __future__ import annotations

from typing import Any, Optional

from .. import ops
from ..store.records import iter_tensors
from ..store.schema import Kind, Phase, Role, module_path

Record = dict[str, Any]
_RESHAPES = frozenset({"Torch.view.default", "Torch._unsafe_view.default",
                       "Torch.reshape.default"})


def _inside(path: str, module: str) -> bool:
    return path == "" or module == path or module.startswith(path + ".")


def _shape(desc: Any) -> Optional[tuple[int, ...]]:
    if not isinstance(desc, dict) or desc.get("type") != "tensor":
        return None
    return tuple(desc.get("shape") or ())


def _tensors(descs: Any) -> list[dict[str, Any]]:
    return [d for d in (descs if isinstance(descs, list) else []) if _shape(d) is not None]


def _matched(golden: list[dict[str, Any]], found: list[list[dict[str, Any]]]
             ) -> Optional[list[dict[str, Any]]]:
    """One descriptor of each `found` tensor (each has one or more spellings: itself, the
    reshape that alone reads it) in the order of `golden`'s descriptors, matched by shape; None
    unless each golden shape is unique and met by exactly one found tensor, and none is left."""
    if len(golden) != len(found) or not golden:
        return None
    out = []
    for g in golden:
        same = [d for ways in found for d in ways[:2] if _shape(d) == _shape(g)]
        if len(same) != 1 or sum(_shape(x) == _shape(g) for x in golden) != 1:
            return None
        out.append(same[0])
    return out


def module_calls(target: list[Record], golden: list[Record]) -> list[Record]:
    """`target` with a module record added after the compiled ops of each golden forward module
    call whose boundary corresponds (see the module docstring)."""
    compiled = [r for r in target if r["kind"] in Kind.REPLAYABLE and r["phase"] == Phase.FORWARD
                and isinstance((r.get("compiled") or {}).get("module"), str)]
    if not compiled:
        return target
    names = {r["name"] for r in target}
    by_seq = {r["seq"]: r for r in target if r["seq"] is not None}
    forward = [g for g in golden if g["kind"] == Kind.MODULE and g["phase"] == Phase.FORWARD]
    calls: dict[str, int] = {}
    for g in forward:
        calls[g["op"]] = calls.get(g["op"], 0) + 1
    after: dict[int, list[Record]] = {}
    for g in forward:
        if calls[g["op"]] != 1 or g["name"] in names:
            continue
        made = _module_call(g, compiled, target, by_seq)
        if made is not None:
            last, record = made
            after.setdefault(last, []).append(record)
    if not after:
        return target
    out: list[Record] = []
    for i, r in enumerate(target):
        out.append(r)
        # (inner modules end first, as eager records them)
        out += sorted(after.get(i, []), key=lambda m: -m["name"].count("."))
    return out


def _module_call(g: Record, compiled: list[Record], target: list[Record],
                 by_seq: dict[Any, Record]) -> Optional[tuple[int, Record]]:
    path = module_path(g["op"])
    members = [r for r in compiled if _inside(path, r["compiled"]["module"])]
    seqs = {r["seq"] for r in members}
    if not members or None in seqs or any(_random(r["op"]) for r in members):
        return None     # (a random draw, dropout in training: eager's and the graph's differ)
    reads: dict[Any, dict[str, Any]] = {}      # (seq, slot) made outside -> its descriptor
    for r in members:
        for _, role, d in iter_tensors(r):
            if role == Role.OUTPUT or d.get("leaf") in ("parameter", "buffer"):
                continue
            made = d.get("producer")
            if not made:
                return None     # a tensor whose maker is not recorded: the boundary is unknown
            if made[0] not in seqs:
                source = _output(by_seq.get(made[0]), made[1])
                if source is None:
                    return None
                reads.setdefault((made[0], made[1]), source)
    # a reshape of the module's input that another module reads too (the compiler shares one
    # `view` of `x` between gate_proj and up_proj) is that input, not an output
    passed = {r["seq"] for r in members if r["op"] in _RESHAPES and all(
        (d.get("producer") or [None])[0] not in seqs
        for _, role, d in iter_tensors(r) if role != Role.OUTPUT)}
    readers: dict[Any, list[Record]] = {}      # (seq, slot) made inside -> who outside reads it
    for r in target:
        # (AOT's runtime detaches the activations the backward graph saves, after the graph)
        if r["seq"] in seqs or (r["op"] == "Tensor.detach" and not r.get("compiled")):
            continue
        for _, role, d in iter_tensors(r):
            made = d.get("producer") if role != Role.OUTPUT else None
            if made and made[0] in seqs and made[0] not in passed:
                readers.setdefault((made[0], made[1]), []).append(r)
    escapes: list[list[dict[str, Any]]] = []
    for (seq, slot), who in readers.items():
        source = _output(by_seq.get(seq), slot)
        if source is None:
            return None
        # read only by one reshape outside (the compiler put a Linear's `view` back to the
        # batch shape in the parent module): the module's output is that reshape's, the same
        # elements in the shape the eager module returned
        reshaped = _output(who[0], 0) if len(who) == 1 and who[0]["op"] in _RESHAPES else None
        escapes.append([source] + ([reshaped] if reshaped is not None else []))
    inputs = _matched(_tensors(g.get("inputs")), [[d] for d in reads.values()])
    outputs = _matched(_tensors(g.get("outputs")), escapes)
    if inputs is None or outputs is None:
        return None
    last = max(i for i, r in enumerate(target) if r["seq"] in seqs)
    first = next(r for r in target if r["seq"] in seqs)
    record = {**{k: v for k, v in g.items() if k not in ("inputs", "outputs", "kwargs", "seq",
                                                             "stack", "parameters")},
              "inputs": [_strip(d) for d in inputs], "outputs": [_strip(d) for d in outputs],
              "kwargs": {}, "parameters": {}, "seq": None, "stack": first.get("stack"),
              # (where the call's compiled ops begin: its first node, the user's line)
              "compiled": {**first["compiled"], "module": path}}
    return last, record


def _random(op: str) -> bool:
    """Whether a compiled op draws random numbers (`Torch.native_dropout.default` is the aten
    op `Aten.native_dropout.default`)."""
    return ops.traits("Aten." + op.split(".", 1)[1] if op.startswith("Torch.") else op).random


def _output(record: Optional[Record], slot: Any) -> Optional[dict[str, Any]]:
    outs = (record or {}).get("outputs")
    if not isinstance(outs, list) or not isinstance(slot, int) or not 0 <= slot < len(outs):
        return None
    d = outs[slot]
    return d if _shape(d) is not None else None


def _strip(desc: dict[str, Any]) -> dict[str, Any]:
    """A boundary descriptor as the module call's own (its maker is not one of the module's)."""
    return {k: v for k, v in desc.items() if k != "producer"}


__all__ = ["module_calls"]
