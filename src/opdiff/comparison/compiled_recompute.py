"""Code Inductor recomputes where it is used: module code made of parameters, buffers and
constants only.

A Llama computes its rotary embedding's cos/sin (`model.rotary_emb`) and its causal mask (the
model's own code) once, from a buffer (`inv_freq`) and `arange`s; Inductor does not keep them:
it inlines that cheap pointwise code into each consumer's kernel, so every layer's attention
kernels name `model` and `model.rotary_emb` beside the attention. Such a kernel straddles no
data: what it recomputes is the same function of the same parameters and buffers wherever it
runs. A module whose own code in the eager run is all *constant* (each of its torch calls reads
only parameters, buffers and tensors such calls made, none draws random numbers; the model's
inputs are not constants) is `recomputed` code for compiled_spans.py: a kernel naming it is
closed over the other modules it names, and the span's eager side drops the constant tensors it
reads from that code (compiled_spans.py pairs what is left; a constant tensor the compiled side
reads as a tensor pairs like any other).

Dropped tensors are not compared, and need not be: the compiled side recomputes them inside the
span's own kernels from parameters and buffers alone (anything else it read would enter the
span and find no partner), and parameters and buffers are compared as leaf records, before any
op reads them. A difference the recomputation makes is the span's own.

    constants = constant_code(golden)
    constants.modules   # {"model", "model.rotary_emb"}
"""
from __future__ import annotations

from typing import NamedTuple

from .. import ops
from ..store.records import iter_tensors
from ..store.schema import Descriptor, Kind, Phase, Record, Role, module_path



class Constants(NamedTuple):
    """What an eager run computes from parameters, buffers and constants alone."""
    modules: frozenset[str]     # module paths (each called once) whose own code is all constant
    tensors: frozenset[tuple[int, int]]     # (seq, slot) of each constant tensor a torch call made


def constant_code(golden: list[Record]) -> Constants:
    """The modules whose own torch calls (those whose innermost module call is theirs) are all
    constant, and the constant tensors of `golden` (see the module docstring)."""
    calls: dict[str, int] = {}
    where: dict[str, str] = {}
    for g in golden:
        if g["kind"] == Kind.MODULE and g["phase"] == Phase.FORWARD:
            path = module_path(g["op"])
            calls[path] = calls.get(path, 0) + 1
            where[g["name"]] = path
    made: set[tuple[int, int]] = set()
    code: dict[str, bool] = {}      # module path -> all its own calls constant so far
    for g in golden:
        if g["kind"] not in Kind.OPS or g["phase"] != Phase.FORWARD or g["seq"] is None:
            continue
        constant = not ops.traits(g["op"]).random and all(
            _constant(d, made) for _, role, d in iter_tensors(g) if role != Role.OUTPUT)
        if constant:
            made.update((g["seq"], i) for i in range(len(g["outputs"])))
        owner = where.get(g.get("module") or "")
        if owner is not None:
            code[owner] = code.get(owner, True) and constant
    return Constants(frozenset(p for p, all_constant in code.items()
                               if all_constant and calls.get(p) == 1), frozenset(made))


def _constant(d: Descriptor, made: set[tuple[int, int]]) -> bool:
    if d.get("leaf"):
        return d["leaf"] in ("parameter", "buffer")     # (the model's inputs are data)
    found = d.get("producer")
    return isinstance(found, list) and len(found) == 2 and (found[0], found[1]) in made


__all__ = ["Constants", "constant_code"]
