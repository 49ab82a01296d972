"""Runs laid out differently over ranks, compared as the one-device runs they split.

A tensor-parallel run writes one dump per rank, each holding a shard, a partial sum or a copy of
every tensor; its reference often ran on one device. `logical_pairs` turns each side laid out
over several ranks into one logical `DumpSource` per step (`merged.MergedSource`: shards
joined along their dim, partial sums added, replicas checked against each other), so the usual
comparison pairs the logical runs; `name_ranks` then says which rank's piece of the culprit's
output differs. The one entry point the driver calls (`comparison/runs.py`, marked there):

    found = logical_pairs(targets, goldens)     # None: the sides are laid out alike
    if found is not None:
        pairs, notes = found                    # [(target, golden)] with merged sides
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional, Sequence

from ...store.source import DumpSource
from ..result import CompareResult, Note
from .attribute import name_ranks, named_ranks
from .chain import ChainedSource
from .declared import (Declared, DeclaredSource, LayoutError, LayoutFile, Unlaid, unclaimed,
                       unused)
from .experts import routed
from .facts import LayoutFacts, Replica
from .merged import MergedSource
from .mesh import inner_groups
from .placement import Unsupported

Pair = tuple[DumpSource, DumpSource]

_last: dict[tuple[int, ...], Optional[tuple[list[Pair], list[str]]]] = {}
_unlaid: set[int] = set()       # ids of the dumps of a side `_side` found no layout for
_facts: dict[int, LayoutFacts] = {}     # id of a side `_side` made or kept -> what it did


def _by_step(dumps: Sequence[DumpSource]) -> dict[int, list[DumpSource]]:
    out: dict[int, list[DumpSource]] = {}
    for d in dumps:
        out.setdefault(d.step if d.step is not None else -1, []).append(d)
    return out


def _world(dumps: Sequence[DumpSource]) -> Optional[int]:
    """The world size capture recorded (meta.json `parallel`), or None (an older dump)."""
    for d in dumps:
        parallel = d.meta.get("parallel") if isinstance(d.meta, dict) else None
        if isinstance(parallel, dict) and isinstance(parallel.get("world_size"), int):
            return int(parallel["world_size"])
    return None


def _laid_out_unlike(targets: Sequence[DumpSource], goldens: Sequence[DumpSource],
                     t_steps: dict[int, list[DumpSource]], g_steps: dict[int, list[DumpSource]]
                     ) -> bool:
    """The two runs ran over different numbers of ranks: by the world sizes capture recorded;
    for older dumps, one side has one rank a step and the other more (a side merely missing
    a rank's directory is not another layout)."""
    t_world, g_world = _world(targets), _world(goldens)
    if t_world is not None and g_world is not None:
        return t_world != g_world
    counts = [(len(t_steps.get(s, ())), len(g_steps.get(s, ()))) for s in {*t_steps, *g_steps}]
    return any(a != b and min(a, b) == 1 for a, b in counts)


def _kinds(plan: Any) -> list[str]:
    """How one group's ranks were laid out, from what pass one found (`plan.GroupPlan`)."""
    kinds = ["fsdp" if plan.gathers else "ddp" if plan.mode == "data" else "tp"]
    return kinds + (["sequence"] if plan.moves else [])


def _facts_of(step: int, side: str, dumps: Sequence[DumpSource], merged: Any,
              inner: Sequence[Any] = (), declared: bool = False) -> LayoutFacts:
    """The facts of a side merged by `MergedSource` (its groups `inner` first, on a mesh)."""
    plans = [m.plan for m in (*inner, merged)]
    kinds = (["mesh"] if inner else []) + [k for p in plans for k in _kinds(p)]
    return LayoutFacts(
        side, step, tuple(dict.fromkeys(kinds + (["declared"] if declared else []))),
        _world(dumps) or len(dumps), tuple(int(d.rank if d.rank is not None else i)
                                           for i, d in enumerate(dumps)),
        mesh=(len(inner), len(dumps) // len(inner)) if inner else (),
        counts={k: n for k, n in merged.plan.merged.items() if n},
        left_out=sum(len(p.dropped) for p in plans), unknown=merged.plan.unknown,
        replicas=tuple(Replica(*r) for p in plans for r in p.differing))


def _side(step: int, dumps: list[DumpSource], side: str,
          notes: list[str], layout: Optional[LayoutFile] = None) -> Optional[DumpSource]:
    if len(dumps) == 1:
        if layout is not None:
            notes.append(unused(layout, side, f"step {step} of the {side} is one rank's"))
        rank = dumps[0].rank
        _facts[id(dumps[0])] = LayoutFacts(side, step, ("none",), _world(dumps) or 1,
                                           (rank,) if rank is not None else (), "one rank")
        return dumps[0]
    if layout is not None:          # the user's layout file says what the dump does not
        declared = Declared.bind(layout, dumps, side)
        if declared.order is not None:
            return _staged(step, dumps, declared.order, side, notes)
        dumps = [declared.wrap(d) for d in dumps]
    world = _world(dumps)
    if world is not None and world != len(dumps):
        notes.append(Note(f"step {step}: the {side} holds {len(dumps)} of its {world} ranks' "
                          f"dumps: not merged into one run; compared rank by rank",
                          Note.SHARDING))
        return None
    why = routed(dumps)
    if why is not None:           # expert parallel (`experts.py`): not merged, not compared
        notes.append(Note(f"step {step}: inconclusive: the {side}'s ranks route tokens between "
                          f"them ({why}): an expert-parallel layout (all_to_all) is not merged "
                          f"into one run; not compared", Note.INCONCLUSIVE))
        return None
    groups = inner_groups(dumps)
    if groups is not None:
        return _two_level(step, groups, side, notes)
    try:
        merged = MergedSource(dumps)
    except Unsupported as exc:
        try:
            chained = ChainedSource(dumps)
        except Unsupported as why:
            notes.append(Note(f"step {step}: the {side}'s {len(dumps)} ranks were not merged "
                              f"into one run (not tensor parallel: {exc}; not a pipeline: {why}); "
                              f"compared rank by rank", Note.SHARDING))
            if layout is None:      # what is a shard nothing says: no culprit is claimed
                _unlaid.update(id(d) for d in dumps)
            return None
        notes.append(Note(f"step {step}: the {side}'s ranks {chained.ranks} were chained into "
                          f"one run as pipeline stages ({chained.kept} records; sends, receives "
                          f"and their buffers left out)", Note.SHARDING))
        _facts[id(chained)] = _chained_facts(step, side, dumps, chained, layout is not None)
        return chained
    plan = merged.plan
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(plan.merged.items()) if n)
    notes.append(Note(f"step {step}: the {side}'s ranks {plan.ranks} were merged into one run "
                      f"({kinds} tensors; {len(plan.dropped)} layout records left out)",
                      Note.SHARDING))
    if plan.unknown:
        notes.append(Note(f"step {step}: {plan.unknown} of the {side}'s tensors have a layout "
                          f"nothing records (not judged)", Note.SHARDING))
    for finding in plan.replicas[:5]:
        notes.append(Note(f"step {step}: the {side}: {finding}", Note.RANKS))
    _facts[id(merged)] = _facts_of(step, side, dumps, merged, declared=layout is not None)
    return merged


def _chained_facts(step: int, side: str, dumps: Sequence[DumpSource], chained: ChainedSource,
                   declared: bool) -> LayoutFacts:
    left = sum(len(d) for d in chained.dropped)
    return LayoutFacts(side, step, ("pipeline", "declared") if declared else ("pipeline",),
                       _world(dumps) or len(dumps), tuple(chained.ranks), "chained",
                       left_out=left)


def _staged(step: int, dumps: list[DumpSource], order: list[int], side: str,
            notes: list[str]) -> Optional[DumpSource]:
    """Pipeline stages in the order a layout file's `stage` lines give."""
    by_rank = {int(d.rank if d.rank is not None else i): d for i, d in enumerate(dumps)}
    try:
        chained = ChainedSource([by_rank[r] for r in order], ordered=True)
    except Unsupported as why:
        notes.append(Note(f"step {step}: the {side}'s ranks {order} were not chained as the "
                          f"layout file's pipeline stages ({why}); compared rank by rank",
                          Note.SHARDING))
        return None
    notes.append(Note(f"step {step}: the {side}'s ranks {order} were chained into one run as "
                      f"pipeline stages 0 to {len(order) - 1}, as the layout file says "
                      f"({chained.kept} records; sends, receives and their buffers left out)",
                      Note.SHARDING))
    _facts[id(chained)] = _chained_facts(step, side, dumps, chained, True)
    return chained


def _two_level(step: int, groups: list[list[DumpSource]], side: str,
               notes: list[str]) -> Optional[DumpSource]:
    """A 2-D mesh: each inner group merged (tensor parallel), then the groups (`mesh.py`)."""
    shown = ", ".join(str([d.rank for d in g]) for g in groups)
    try:
        inner = [MergedSource(g) for g in groups]
        merged = MergedSource(inner)
    except Unsupported as exc:
        notes.append(Note(f"step {step}: the {side}'s ranks, a mesh of groups {shown}, were not "
                          f"merged into one run ({exc}); compared rank by rank", Note.SHARDING))
        return None
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(merged.plan.merged.items()) if n)
    notes.append(Note(f"step {step}: the {side}'s ranks were merged into one run as a "
                      f"{len(groups)} x {len(groups[0])} mesh: each of the groups {shown} "
                      f"first, then those as {merged.plan.mode} parallel ({kinds} tensors)",
                      Note.SHARDING))
    unknown = merged.plan.unknown     # (an inner group's unknowns reach it, or were left out)
    if unknown:
        notes.append(Note(f"step {step}: {unknown} of the {side}'s tensors have a layout "
                          f"nothing records (not judged)", Note.SHARDING))
    for finding in [f for m in (*inner, merged) for f in m.plan.replicas][:5]:
        notes.append(Note(f"step {step}: the {side}: {finding}", Note.RANKS))
    _facts[id(merged)] = _facts_of(step, side, [d for g in groups for d in g], merged, inner)
    return merged


def logical_pairs(targets: Sequence[DumpSource], goldens: Sequence[DumpSource],
                  layouts: tuple[Optional[LayoutFile], Optional[LayoutFile]] = (None, None)
                  ) -> Optional[tuple[list[Pair], list[str]]]:
    """[(target, golden)] per step with each side laid out over several ranks merged, and notes
    saying what was merged; None when both sides have as many ranks in every step (compared
    rank by rank, as before); no pairs, and a note why, when a side cannot be merged (an
    "inconclusive" note among them: nothing is compared).
    layouts: each side's layout file (`declared.py`), for ranks that split modules by hand;
    a line the dumps contradict raises `LayoutError`."""
    key = (*(id(d) for d in (*targets, *goldens)), *map(id, layouts))
    if key in _last:
        return _last[key]
    _last.clear()
    _unlaid.clear()
    _facts.clear()
    _last[key] = found = _logical_pairs(targets, goldens, layouts)
    return found


def _logical_pairs(targets: Sequence[DumpSource], goldens: Sequence[DumpSource],
                   layouts: tuple[Optional[LayoutFile], Optional[LayoutFile]]
                   ) -> Optional[tuple[list[Pair], list[str]]]:
    t_steps, g_steps = _by_step(targets), _by_step(goldens)
    if not _laid_out_unlike(targets, goldens, t_steps, g_steps):
        said: list[str] = [unused(f, side, "both runs have as many ranks (compared rank by "
                                  "rank)") for f, side in zip(layouts, ("target", "golden"))
                           if f is not None]
        return ([], said) if said else None       # (no pairs: rank by rank, as before)
    pairs: list[Pair] = []
    notes: list[str] = []
    for step in sorted(set(t_steps) & set(g_steps)):
        t = _side(step, t_steps[step], "target", notes, layouts[0])
        g = _side(step, g_steps[step], "golden", notes, layouts[1])
        if t is None or g is None:
            return [], notes            # compared rank by rank, with the note saying why
        pairs.append((t, g))
    return pairs, notes


def unlaid(sources: list[DumpSource]) -> list[DumpSource]:
    """`sources` after `logical_pairs` could not merge them: each rank of a side laid out in a
    way nothing records is `Unlaid` (its pairs' culprits are not claimed: `judged`)."""
    return [Unlaid(s) if id(s) in _unlaid else s for s in sources]


def judged(result: CompareResult, target: DumpSource, golden: DumpSource) -> CompareResult:
    """A judged pair of sides this package made: the culprit's rank named (`name_ranks`), or,
    for an `Unlaid` side, no culprit claimed; with what was merged of each side and how
    (`CompareResult.layouts`, `facts.LayoutFacts`)."""
    for source, side in ((target, "target"), (golden, "golden")):
        if isinstance(source, Unlaid) and not isinstance(source, DeclaredSource):
            return unclaimed(result, side)
    result, culprits = named_ranks(result, target, golden)
    facts = [f for f in (_facts.get(id(target)), _facts.get(id(golden))) if f is not None]
    if facts and facts[0].side == "target" and culprits:
        facts[0] = facts[0].named(culprits)
    return replace(result, layouts=[*result.layouts, *facts])


def is_logical(source: Any) -> bool:
    """A merged side: compared in this process (a worker cannot open it again by its path)."""
    return isinstance(source, (MergedSource, ChainedSource, Unlaid))


__all__ = ["logical_pairs", "name_ranks", "judged", "unlaid", "is_logical", "MergedSource", "ChainedSource",
           "Unsupported", "LayoutFile", "LayoutError", "LayoutFacts"]
