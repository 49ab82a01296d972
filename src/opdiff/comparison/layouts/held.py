"""Tensors a DTensor is made of (`DTensor.from_local`), and the layouts they take from it.

`from_local` is a view capture records as `Tensor.view_as` (left out of the logical run); the
op that then reads the DTensor gets it with a placement and no producer. The plain tensor it
was made of is that op's input on every rank, so it takes the DTensor's placement when nothing
else said its layout: the model's input under sequence parallelism (each rank's part of the
sequence), the parameters under DDP x TP (DDP's TP hook turns every parameter into a local
tensor and back with `from_local` before the forward). A leaf read first by such a view is
moved to just before the op that reads the DTensor (where the one-device run records it).

`read`: an input naming a parameter (`fqn`) takes its leaf's layout; an in-place update of a
parameter (the optimizer's `add_`) reads its gradient and states laid out like it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ...store.records import producer_of
from ...store.schema import Kind, Record, Descriptor
from .placement import UNKNOWN, UNKNOWN_LAYOUT, Layout
from .statistics import Signature, signature

if TYPE_CHECKING:
    from .plan import GroupPlan, Slot


def _key(descs: list[Descriptor]) -> tuple[Signature, ...]:
    return tuple(signature(d) for d in descs)


def leaf(plan: "GroupPlan", pos: int, slot: "Slot", rec: Record,
         descs: list[Descriptor]) -> None:
    """Remember a leaf record's output: for the DTensor made of it, and for its readers."""
    if descs[0].get("stats") is None:
        return
    what, fqn = str(rec.get("leaf", "")), str(rec.get("tensor", ""))
    plan.leaf_slots.setdefault(_key(descs), []).append((pos, slot, what, fqn))
    if what in ("parameter", "buffer"):
        plan.fqn_slot.setdefault(fqn, slot)


def _set(plan: "GroupPlan", at: int, slot: "Slot", layout: Layout,
         out_layout: dict["Slot", Layout]) -> None:
    was = out_layout.get(slot)
    if was is not None and was.kind != UNKNOWN:
        return
    out_layout[slot] = layout
    plan.layouts[(at, "output", slot[1])] = layout
    plan.merged[UNKNOWN] = plan.merged.get(UNKNOWN, 0) - 1
    plan.merged[layout.kind] = plan.merged.get(layout.kind, 0) + 1


def from_local(plan: "GroupPlan", descs: list[Descriptor], layout: Layout,
               out_layout: dict["Slot", Layout], recent: list[tuple[tuple[Signature, ...], "Slot"]],
               pos: int, path: str,
               reader: Record) -> None:
    """A DTensor input (placed, no producer): the leaf or recent output it was made of takes
    its placement where nothing said its layout; a leaf whose first reader was left out moves
    to just before this reader."""
    key = _key(descs)
    alike = plan.leaf_slots.get(key)           # leaves of equal values: in their order
    if alike:
        at, slot, what, fqn = alike.pop(0)
        _set(plan, at, slot, layout, out_layout)
        if plan.leaf_reader.get(at) in plan.dropped_names and at not in plan.deferred:
            name = str(reader.get("name"))
            plan.deferred[at] = pos
            plan.reader_of[at] = plan.renamed.get(name, name)
            plan.tags.setdefault(pos, []).append((path, what, fqn))
        return
    for earlier, slot in reversed(recent):
        if earlier == key and out_layout.get(slot, UNKNOWN_LAYOUT).kind == UNKNOWN:
            where = plan.outputs.get(slot)
            if where is not None:
                _set(plan, where, slot, layout, out_layout)
            return


def read(plan: "GroupPlan", descs: list[Descriptor], rec: Record,
         mine: dict[tuple[str, str], Layout], out_layout: dict["Slot", Layout]
         ) -> Optional[Layout]:
    """The layout of a plain input with no producer, from the parameter it names or updates."""
    fqn = descs[0].get("fqn")
    if isinstance(fqn, str) and descs[0].get("leaf") in ("parameter", "buffer"):
        slot = plan.fqn_slot.get(fqn)
        found = out_layout.get(slot) if slot is not None else None
        return found if found is not None and found.kind != UNKNOWN else None
    if rec["kind"] == Kind.LEAF or not str(rec["op"]).endswith("_"):
        return None
    first = rec["inputs"][0] if rec["inputs"] else None
    if not isinstance(first, dict) or first.get("leaf") != "parameter" or \
            producer_of(descs[0]) is not None or first.get("shape") != descs[0].get("shape"):
        return None
    found = mine.get(("input", "0"))
    return found if found is not None and found.kind != UNKNOWN else None


__all__ = ["leaf", "from_local", "read"]
