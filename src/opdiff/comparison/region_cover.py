"""What a region covers beyond the unpaired ops between two paired ones (`regions.py`).

- ops only one run executes that only feed a region, or whose results nothing reads, join it
  (`regions.absorb` walks them with `readers` and `join_runs`);
- tensors that only one side of a paired module call holds (eager attention's mask passed in,
  its attention weights passed out, their gradients), where a region does that side's work, are
  the region's (`covered_tensors`): counted as covered by it, never unmatched.

"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ..store.records import iter_tensors
from ..store.schema import Kind, Phase, Record, RecordName, Role
from .graph import RunGraph, readers_of

Pair = tuple[Optional[int], Optional[int]]

if TYPE_CHECKING:
    from .regions import Region     # (regions.py imports this module)



def readers(records: list[Record]) -> dict[int, list[int]]:
    """record index -> the indices of the ops that read one of its outputs (dataflow)."""
    return readers_of(records)


def join_runs(dead: set[int], region_of: dict[int, int], pairs: list[Pair], side: int) -> None:
    """Each run of one side's unpaired records (consecutive in the alignment) whose ops joined
    a region takes its dead ops into the first such region."""
    run: list[int] = []

    def close() -> None:
        joined = [region_of[i] for i in run if i in region_of]
        if joined:
            for i in run:
                if i in dead:
                    region_of[i] = min(joined)
        run.clear()

    for pair in pairs:
        i = pair[side]
        if i is None or pair[1 - side] is not None:
            close()
        else:
            run.append(i)
    close()


def covered_tensors(regions: list[Region], pairs: list[Pair], target: list[Record],
                    golden: list[Record], graph: Optional[RunGraph] = None
                    ) -> dict[int, dict[str, Region]]:
    """{alignment position: {tensor suffix: region}} for the tensors that only one side of a
    paired module call holds, where a region does that side's work: eager attention's mask
    passed into the attention and decoder-layer calls and the attention weights it returns
    (and their gradient), which SDPA's side never makes. Such a tensor is covered by the
    region its module call holds (the first of that phase, its ops inside the call), or, for an
    input made by a region's op (dataflow), by that region; otherwise it stays unmatched."""
    if not regions:
        return {}
    parents = (graph or RunGraph(target)).parents       # (`graph`: the target's)
    made_by: tuple[dict[Optional[int], Region], ...] = tuple(
        {recs[i]["seq"]: r for r in regions for i in (r.target if side == 0 else r.golden)}
        for side, recs in ((0, target), (1, golden)))
    holders = _holders(regions, parents)
    out: dict[int, dict[str, Region]] = {}
    for position, (ti, gi) in enumerate(pairs):
        if ti is None or gi is None or target[ti]["kind"] != Kind.MODULE:
            continue
        t, g = target[ti], golden[gi]
        tensors = ({n[len(t["name"]):]: (role, d) for n, role, d in iter_tensors(t)},
                   {n[len(g["name"]):]: (role, d) for n, role, d in iter_tensors(g)})
        one_sided = [(side, k) for side in (0, 1) for k in tensors[side]
                     if k not in tensors[1 - side]]
        if not one_sided:
            continue
        held = holders.get((_forward_name(t), t["phase"]), [])
        for side, suffix in one_sided:
            role, desc = tensors[side][suffix]
            producer = desc.get("producer") if role == Role.INPUT else None
            maker = made_by[side].get(producer[0]) if producer else None
            region = held[0] if held else maker
            if region is not None:
                out.setdefault(position, {})[suffix] = region
    return out


def _holders(regions: list[Region], parents: dict[str, Optional[str]]
             ) -> dict[tuple[str, str], list[Region]]:
    """{(forward module call name, phase): the regions of that phase whose ops run inside that
    call}, in region order (a backward region's module is its forward call)."""
    out: dict[tuple[str, str], list[Region]] = {}
    for region in regions:
        m, seen = region.module, 0
        while m and seen < 256:         # (a malformed dump's loop ends)
            out.setdefault((m, region.phase), []).append(region)
            m, seen = parents.get(m), seen + 1
    return out


def _forward_name(call: Record) -> str:
    """The forward call's name of a module record (itself in forward)."""
    if call["phase"] == Phase.FORWARD:
        return str(call["name"])
    parsed = RecordName.parse(call["name"])
    return parsed.with_phase(Phase.FORWARD).text if parsed is not None else str(call["name"])


__all__ = ["readers", "join_runs", "covered_tensors"]
