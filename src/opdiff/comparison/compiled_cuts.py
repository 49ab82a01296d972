"""A span whose dataflow leaves it and comes back, cut where it comes back.

A span of module calls' own code (compiled_spans.py) may hold code on both sides of a module
call outside it: a decoder layer's residual add and its post-attention norm, fused by Inductor,
and the layer's second residual add with the final norm, fused too, with the MLP between them
reading the norm's output and handing its own back to the second add. Judged as one call, such
a span reads a tensor made from its own output: where the first half goes wrong, that input
already differs and the span is never named, though it holds the fault.

`cut` splits such a span in two by dataflow: the *late* part is every call of the span that
reads, directly or through other calls of the span, a tensor that calls outside made from the
span's outputs; the *early* part is the rest. Each part is judged as a span of its own where
neither reads what the other's outside readers made (no part leaves and comes back). Both sides
of a compare are cut alike, each through its own dataflow (`"producer"`); the parts pair in
order, and each is judged only where its boundary corresponds (compiled_spans.py).

    cut({2, 3, 7}, records)     # [{2, 3}, {7}]: 7 reads what 5 made of 3's output
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

from ..store.records import iter_tensors
from ..store.schema import Kind, Phase, Record, Role

Seq = Optional[int]      # a record's seq


def cut(seqs: set[Seq], records: list[Record]) -> Optional[list[set[Seq]]]:
    """[seqs] where the calls `seqs` (seq numbers in `records`) never read what calls outside
    made from their outputs; else [early, late] (see the module docstring) where each part is
    such a span itself; else None."""
    made_from = _inputs_made_by(records)
    late = _late(seqs, made_from)
    if not late:
        return [set(seqs)]
    early = set(seqs) - late
    if not early or _late(early, made_from) or _late(late, made_from):
        return None
    return [early, late]


def _inputs_made_by(records: list[Record]) -> dict[Seq, set[Seq]]:
    """Seq of each forward call -> the seqs of the calls that made the tensors it reads."""
    out: dict[Seq, set[Seq]] = {}
    for r in records:
        if r["kind"] not in Kind.OPS or r["phase"] != Phase.FORWARD or r["seq"] is None:
            continue
        out[r["seq"]] = {d["producer"][0] for _, role, d in iter_tensors(r)
                         if role != Role.OUTPUT and isinstance(d.get("producer"), list)
                         and len(d["producer"]) == 2}
    return out


def _late(seqs: Iterable[Seq], made_from: dict[Seq, set[Seq]]) -> set[Seq]:
    """The calls of `seqs` that read, directly or through calls of `seqs`, a tensor made by a
    call outside `seqs` from their outputs."""
    inside = set(seqs)
    readers: dict[Seq, set[Seq]] = {}
    for seq, makers in made_from.items():
        for m in makers:
            readers.setdefault(m, set()).add(seq)
    # calls outside made, through calls outside, from the span's outputs
    outside = _reach({s for m in inside for s in readers.get(m, ()) if s not in inside},
                     readers, lambda s: s not in inside)
    back = {s for s in inside if made_from.get(s, set()) & outside}
    return _reach(back, readers, lambda s: s in inside)


def _reach(start: set[Seq], readers: dict[Seq, set[Seq]], allowed: Callable[[Seq], bool]) -> set[Seq]:
    found, todo = set(start), list(start)
    while todo:
        for s in readers.get(todo.pop(), ()):
            if s not in found and allowed(s):
                found.add(s)
                todo.append(s)
    return found


__all__ = ["cut"]
