"""One-sided regions: ops only one run executes, between paired tensors, judged as one.

What `regions.find_regions` and `regions.absorb` leave unpaired is a run of one side's ops
between two paired ones (one phase): GPT-2's SDPA path calls a `.contiguous()` that eager's
does not; a `.contiguous()` both runs call is a no-op on SDPA's side, so only eager records its
backward (a no-op makes no autograd node); under bf16 autocast the target's `.float()` of bf16
logits has a backward that the fp32 golden, where it is a no-op, never runs. Such a run is a
*one-sided region* when the target's dataflow proves its boundary, and is then judged like any
region (`blame.judge`): inputs and outputs agree, it passes and covers its ops; inputs agree
and outputs do not (a one-sided `x * 2`), it is a local error in this region, its sentence
saying that one side runs no op there (`region_verdict.region_reason`). Proven:

- a target-only forward run: every tensor its ops read from outside it is compared with golden
  (made by a paired op, or a paired parameter, buffer or input), and every op that reads what
  it made is paired, at least one (`region_boundaries.Boundaries.by_dataflow`);
- a backward run of one side, through the forward calls of its ops (`region_gradients.py`):
  the target's own calls, or, for golden's backward records, the target's calls paired with
  theirs (the forward op both runs ran, whose backward only golden recorded: `Region.twins`).

Not proven (no dataflow, a golden-only forward run, whose tensors the target's dataflow does not
see, an output read by an unpaired op or by none, a tensor the boundary needs that is not
compared): its ops stay unmatched, as before. The proof is made before any row is measured, on
the tensors that will be (paired records' tensors both sides hold, of one non-empty shape); a
region proven there whose measured boundary then falls short is "not judged", as any. Never at
a module call: the call may hold the other side's work elsewhere. Numbered after the regions
both runs execute ops in (their numbers do not move); never found in a compiled run (its
one-sided partitioner ops are `compiled.py`'s).
"""
from __future__ import annotations

from typing import Any, Optional

from ..store.records import iter_tensors
from ..store.schema import Kind, Phase
from . import region_cover as cover
from .region_boundaries import Boundaries, Entry
from .regions import Region, common_module, members

Pair = tuple[Optional[int], Optional[int]]
Record = dict[str, Any]


def one_sided(regions: list[Region], pairs: list[Pair], target: list[Record],
              golden: list[Record], dataflow: bool) -> list[Region]:
    """The one-sided regions of an alignment whose other regions are `regions` (see the module
    docstring), numbered after them; [] without the target's dataflow."""
    if not dataflow:
        return []
    runs = _runs(pairs, target, golden, regions)
    if not runs:
        return []
    paired = {ti for ti, gi in pairs if ti is not None and gi is not None}
    twin_of = {gi: ti for ti, gi in pairs if ti is not None and gi is not None}
    golden_at = {rec["name"]: j for j, rec in enumerate(golden)}
    readers = cover.readers(target)
    candidates: list[Region] = []
    for side, phase, position, indices in runs:
        region = Region(len(regions) + len(candidates), phase, indices if side == 0 else [],
                        [] if side == 0 else indices, position=position)
        if side == 1:
            twins = _twins([golden[j] for j in indices], golden_at, twin_of, target) \
                if phase == Phase.BACKWARD else None
            if twins is None:
                continue        # (golden-only forward: the target's dataflow cannot see it)
            region.twins = twins
        elif phase == Phase.FORWARD and not _read_by_paired(indices, readers, paired):
            continue
        candidates.append(region)
    bounds = Boundaries(target, True, _comparable(pairs, target, golden), {}, golden)
    consumers = bounds.consumers(candidates)
    found: list[Region] = []
    parents = {r["name"]: r["module"] for r in target if r["kind"] == Kind.MODULE}
    for region in candidates:
        if bounds.by_dataflow(region, consumers.get(region.number, {})) is None:
            continue
        region.number = len(regions) + len(found)
        region.unpaired_leaves = []     # (found again when it is judged)
        ops = region.target or region.twins
        region.module = common_module([target[i]["module"] for i in ops], parents)
        found.append(region)
    return found


def _runs(pairs: list[Pair], target: list[Record], golden: list[Record],
          regions: list[Region]) -> list[tuple[int, str, int, list[int]]]:
    """(side: 0 target, 1 golden; phase; position of its first op; its record indices) of each
    run of one side's unpaired ops between two paired ones that no region holds."""
    t_of, g_of = members(regions)
    runs: list[tuple[int, str, int, list[int]]] = []
    run: list[tuple[int, int, Record]] = []        # (side, index, record)
    start = 0

    def close() -> None:
        sides = {side for side, _, _ in run}
        if len(sides) == 1:
            runs.append((sides.pop(), run[0][2]["phase"], start, [i for _, i, _ in run]))
        run.clear()

    for position, (ti, gi) in enumerate(pairs):
        rec = target[ti] if ti is not None else golden[gi]  # type: ignore[index]
        if ti is not None and gi is not None:
            if rec["kind"] not in (Kind.LEAF, Kind.PARAM_GRAD):
                close()
            continue
        if rec["kind"] not in Kind.OPS:
            continue
        if run and rec["phase"] != run[0][2]["phase"]:
            close()
        side, index = (0, ti) if ti is not None else (1, gi)
        if index in (t_of if side == 0 else g_of):
            continue
        if not run:
            start = position
        run.append((side, index, rec))   # type: ignore[arg-type]
    close()
    return runs


def _read_by_paired(indices: list[int], readers: dict[int, list[int]], paired: set[int]) -> bool:
    """Does every op outside the run that reads what it made run on both sides (at least one)?"""
    inside = set(indices)
    outside = [k for i in indices for k in readers.get(i, ()) if k not in inside]
    return bool(outside) and all(k in paired for k in outside)


def _twins(backward: list[Record], golden_at: dict[str, int], twin_of: dict[int, int],
           target: list[Record]) -> Optional[list[int]]:
    """The target's forward calls paired with the forward calls of golden's `backward`
    records, one each (of the same op), or None where one has none."""
    out = []
    for b in backward:
        link = b.get("forward")
        j = golden_at.get(link) if isinstance(link, str) else None
        ti = twin_of.get(j) if j is not None else None
        if ti is None or target[ti]["phase"] != Phase.FORWARD or target[ti].get("op") != b.get("op"):
            return None
        out.append(ti)
    return out


def _comparable(pairs: list[Pair], target: list[Record], golden: list[Record]
                ) -> dict[str, Entry]:
    """The target tensors a compare will measure against golden, as far as the records tell
    (both sides of a paired record hold it, in one non-empty shape), each under an entry of
    its own: what the proof reads in place of the measured rows."""
    out: dict[str, Entry] = {}
    for ti, gi in pairs:
        if ti is None or gi is None:
            continue
        t, g = target[ti], golden[gi]
        held = {n[len(g["name"]):]: d for n, _, d in iter_tensors(g)}
        for name, _, desc in iter_tensors(t):
            other = held.get(name[len(t["name"]):])
            shape = desc.get("shape")
            if other is not None and isinstance(shape, list) and shape == other.get("shape") \
                    and all(isinstance(n, int) and n > 0 for n in shape):
                out[name] = (len(out), None, desc.get("dtype"), other.get("dtype"))
    return out


__all__ = ["one_sided"]
