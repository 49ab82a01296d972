"""Regions of eager against a compiled run: a forward region whose results only one later
region reads joins it.

Inductor under autocast computes the rotary embedding of k in a kernel of its own, between k's
and q's extern `mm`s, and hands its result to the next kernel only (the one that rotates q and
runs the attention's first `bmm`): the stretch between those `mm`s is a region
(`regions.find_regions`) whose every result enters another region, so none is compared, and it
could not be judged; neither could the region it feeds, whose input it made. Both are one
computation: the first joins the second (its ops and golden's), which is judged through the
tensors entering either and leaving the second (`region_boundaries`).

Needs the target's dataflow; backward readers do not count (the forward results a compiled
backward reads are compared where a forward op reads them, or judged with the backward regions).
"""
from __future__ import annotations


from ..store.schema import Kind, Phase, Record
from . import region_cover as cover
from .regions import Region, common_module



def joined(regions: list[Region], target: list[Record]) -> list[Region]:
    """`regions` with each forward region whose forward results only one later forward region
    reads merged into it (see the module docstring), renumbered in order."""
    owner = {i: r.number for r in regions for i in r.target}
    by_number = {r.number: r for r in regions}
    read_by = cover.readers(target)
    gone: set[int] = set()
    for region in sorted(regions, key=lambda r: r.number):
        if region.phase != Phase.FORWARD or not region.target:
            continue
        own = set(region.target)
        outside = {k for i in region.target for k in read_by.get(i, ())
                   if k not in own and target[k]["phase"] == Phase.FORWARD
                   and target[k]["kind"] in Kind.OPS}
        into = {owner.get(k) for k in outside}
        if len(into) != 1:
            continue
        number = into.pop()
        later = by_number.get(number) if number is not None else None
        if later is None or later.number <= region.number or later.phase != Phase.FORWARD:
            continue
        later.target = sorted({*later.target, *region.target})
        later.golden = sorted({*later.golden, *region.golden})
        later.position = min(later.position, region.position)
        owner.update((i, later.number) for i in region.target)
        gone.add(region.number)
    if not gone:
        return regions
    parents = {r["name"]: r["module"] for r in target if r["kind"] == Kind.MODULE}
    kept = [r for r in regions if r.number not in gone]
    for number, region in enumerate(kept):
        region.number = number
        region.module = common_module([target[i]["module"] for i in region.target], parents)
    return kept


__all__ = ["joined"]
