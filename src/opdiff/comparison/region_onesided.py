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
  (made by a paired op, or a paired parameter, buffer or input), every op outside it that reads
  what it made is paired, and something compared reads it (`Boundaries.by_dataflow`);
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

from collections.abc import Iterator, Mapping
from typing import Optional

from ..store.records import iter_tensors
from ..store.schema import Kind, Phase, Record, Role
from .region_boundaries import Boundaries, Entry
from .regions import Region, common_module, members

Pair = tuple[Optional[int], Optional[int]]


def one_sided(regions: list[Region], pairs: list[Pair], target: list[Record],
              golden: list[Record], dataflow: bool) -> list[Region]:
    """The one-sided regions of an alignment whose other regions are `regions` (see the module
    docstring), numbered after them; [] without the target's dataflow."""
    if not dataflow:
        return []
    runs = _runs(pairs, target, golden, regions)
    if not runs:
        return []
    twin_of = {gi: ti for ti, gi in pairs if ti is not None and gi is not None}
    golden_at = {rec["name"]: j for j, rec in enumerate(golden)}
    forward: list[Region] = []
    backward: list[Region] = []
    for side, phase, position, indices in runs:
        region = Region(len(regions) + len(forward) + len(backward), phase,
                        indices if side == 0 else [], [] if side == 0 else indices,
                        position=position)
        if phase == Phase.FORWARD:
            if side == 0:       # (golden's: the target's dataflow cannot see them)
                forward.append(region)
            continue
        if side == 1:
            twins = _twins([golden[j] for j in indices], golden_at, twin_of, target)
            if twins is None:
                continue
            region.twins = twins
        backward.append(region)
    if not forward and not backward:
        return []
    bounds = Boundaries(target, True, Comparable(pairs, target, golden), {}, golden)
    consumers = bounds.consumers(backward)
    consumers.update(_read_by_paired(forward, target, set(twin_of.values())))
    found: list[Region] = []
    parents = {r["name"]: r["module"] for r in target if r["kind"] == Kind.MODULE}
    for region in sorted(forward + backward, key=lambda r: r.number):
        made = consumers.get(region.number)
        if made is None or bounds.by_dataflow(region, made) is None:
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


def _read_by_paired(forward: list[Region], target: list[Record], paired: set[int]
                    ) -> dict[int, dict[str, str]]:
    """{region number: {a reader's input: the region's tensor it reads}} of the forward
    target-only runs whose every reading op outside the run is paired (a module call, which
    only passes a tensor on, is no reading op; its input is measured like an op's):
    `Boundaries.consumers`'s map, for `Boundaries.by_dataflow`."""
    region_of = {target[i]["seq"]: r.number for r in forward for i in r.target}
    if not region_of:
        return {}
    # (the runs' members only, not the target's graph: a producer outside them is no key)
    by_seq = {target[i]["seq"]: target[i] for r in forward for i in r.target}
    out: dict[int, dict[str, str]] = {}
    refused: set[int] = set()
    for k, rec in enumerate(target):
        for name, role, desc in iter_tensors(rec):
            producer = desc.get("producer")
            if role != Role.INPUT or not producer:
                continue
            number = region_of.get(producer[0])
            if number is None or region_of.get(rec["seq"]) == number:
                continue
            if rec["kind"] != Kind.MODULE and k not in paired:
                refused.add(number)     # (what it made reaches an op it is not compared at)
            out.setdefault(number, {})[name] = f"{by_seq[producer[0]]['name']}.output.{producer[1]}"
    return {n: made for n, made in out.items() if n not in refused}


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


class Comparable(Mapping[str, Entry]):
    """The target tensors a compare will measure against golden, as far as the records tell
    (both sides of a paired record hold it, in one non-empty shape), each under an entry of its
    own: what the proof reads in place of the measured rows. Looked up by name, each record's
    worked out when first asked for (a big dump's proof reads a few)."""

    def __init__(self, pairs: list[Pair], target: list[Record], golden: list[Record]) -> None:
        self.target, self.golden = target, golden
        self.partner = {target[ti]["name"]: (ti, gi) for ti, gi in pairs
                        if ti is not None and gi is not None}
        self.found: dict[str, dict[str, Entry]] = {}
        self.count = 0

    def __getitem__(self, name: str) -> Entry:
        parts = name.split(".")
        for k in range(len(parts) - 1, 0, -1):      # (the record's name is a prefix of it)
            record = ".".join(parts[:k])
            if record in self.partner:
                entry = self._entries(record).get(name)
                if entry is not None:
                    return entry
        raise KeyError(name)

    def _entries(self, record: str) -> dict[str, Entry]:
        if record not in self.found:
            ti, gi = self.partner[record]
            t, g = self.target[ti], self.golden[gi]
            held = {n[len(g["name"]):]: d for n, _, d in iter_tensors(g)}
            out: dict[str, Entry] = {}
            for name, _, desc in iter_tensors(t):
                other = held.get(name[len(t["name"]):])
                shape = desc.get("shape")
                if other is not None and isinstance(shape, list) and \
                        shape == other.get("shape") and \
                        all(isinstance(n, int) and n > 0 for n in shape):
                    self.count += 1
                    out[name] = (self.count, None, desc.get("dtype"), other.get("dtype"))
            self.found[record] = out
        return self.found[record]

    def __iter__(self) -> Iterator[str]:
        for record in self.partner:
            yield from self._entries(record)

    def __len__(self) -> int:
        return sum(1 for _ in self)


__all__ = ["one_sided", "Comparable"]
