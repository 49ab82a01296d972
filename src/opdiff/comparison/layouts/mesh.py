"""A 2-D mesh (data parallel x tensor parallel) merged in two levels.

On a mesh of two dims, a rank's first group collective is over its innermost group (tensor
parallelism's all-reduce in the forward); the data-parallel collectives (DDP's gradient
all-reduce) come later and span the other dim. `inner_groups` reads each rank's first group
collective: when they split the ranks into equal proper groups, each group is merged first
(`MergedSource`: tensor parallel, one logical rank per group, named by its first rank), and
those logical ranks are then merged as data parallel (`MergedSource` over them).

FSDP2 x TP is the other way round: FSDP2's parameter all-gather over the data-parallel group
comes first, so each data-parallel group (ranks holding the same tensor-parallel shard) is
merged first, as data parallel, and the logical ranks then as tensor parallel. Within a group,
`project` reads every DTensor placement as its ranks see it: the mesh dim along which the
group's coordinates differ is the group's own (FSDP2's `_StridedShard` on it joins to the
tensor-parallel shard: a shard along that dim), and the other dims' placements are carried
(`OUTER`) to the merged tensor for the next level; a placement on none of the group's dims (a
tensor-parallel DTensor, alike on every rank of the group) is carried whole.
"""
from __future__ import annotations

import re
from typing import Final, Optional, Sequence

from ...store.schema import Descriptor
from ...store.source import DumpSource

_LOOK = 2000          # records read per rank for its first group collective
OUTER: Final = "outer_placement"    # a descriptor's placement over the mesh dims its group is not on
_STRIDED = re.compile(r"^_S(?:tridedShard)?\((?:dim=)?(-?\d+)")
_SHARDED = re.compile(r"^(?:_S|S|Shard|_StridedShard)\((?:dim=)?(-?\d+)")


def _first_group(source: DumpSource) -> Optional[tuple[int, ...]]:
    for i, rec in enumerate(source.records()):
        group = rec.get("group")
        if isinstance(group, dict) and "peer" not in group and \
                str(rec.get("op")).startswith("Distributed.") and group.get("ranks"):
            return tuple(sorted(int(r) for r in group["ranks"]))
        if i > _LOOK:
            break
    return None


def inner_groups(dumps: Sequence[DumpSource]) -> Optional[list[list[DumpSource]]]:
    """The ranks split by their first group collective's group, in rank order; None unless
    those groups are equal, proper (more than one, fewer than all) and cover every rank."""
    by_rank = {int(d.rank): d for d in dumps if d.rank is not None}
    if len(by_rank) != len(dumps) or len(dumps) < 4:
        return None
    groups: dict[tuple[int, ...], list[DumpSource]] = {}
    for rank, d in sorted(by_rank.items()):
        group = _first_group(d)
        if group is None or rank not in group:
            return None
        groups.setdefault(group, []).append(d)
    sizes = {len(g) for g in groups}
    if len(groups) < 2 or len(sizes) != 1 or sizes == {len(dumps)} or \
            any(sorted(int(d.rank) for d in members) != list(g)       # type: ignore[arg-type]
                for g, members in groups.items()):
        return None
    return [groups[g] for g in sorted(groups)]


def _coordinates(descs: Sequence[Descriptor]) -> Optional[list[list[int]]]:
    found = []
    for d in descs:
        placed = d.get("placement")
        if not isinstance(placed, dict):
            return None
        placements, coordinate = placed.get("placements"), placed.get("coordinate")
        if not isinstance(placements, list) or not isinstance(coordinate, list) or \
                len(coordinate) != len(placements):
            return None
        found.append(coordinate)
    return found if found and all(len(c) == len(found[0]) for c in found) else None


def project(descs: list[Descriptor]) -> list[Descriptor]:
    """The group's ranks' descriptors of one tensor with their placements read as the group
    sees them (see the module docstring); the same list when nothing is to be read again."""
    coords = _coordinates(descs)
    if coords is None or len(descs) < 2:
        return descs
    names = [str(p) for p in descs[0]["placement"]["placements"]]
    varying = [j for j in range(len(names)) if len({str(c[j]) for c in coords}) > 1]
    if len(names) == 1 and varying:
        return descs                      # a one-dim mesh over the group: as it is
    if len(varying) > 1 or (not varying and len(names) > 1):
        return descs                      # not one dim of the mesh: left to fail as before
    k = varying[0] if varying else -1
    if k >= 0 and not _nested_last(names, k):
        return descs
    out = []
    for d, c in zip(descs, coords):
        placed = d["placement"]
        rest = [j for j in range(len(names)) if j != k]
        new = d.copy()
        new.pop("placement", None)
        new[OUTER] = {**placed, "placements": [placed["placements"][j] for j in rest],
                      "coordinate": [c[j] for j in rest]}
        if k >= 0:
            own = names[k]
            m = _STRIDED.match(own)
            new["placement"] = {"placements": [f"S({m.group(1)})" if m else own],
                                "coordinate": [c[k]], "global_shape": None,
                                "whole": placed.get("whole")}
        out.append(new)
    return out


def _nested_last(names: list[str], k: int) -> bool:
    """Whether joining the pieces along mesh dim `k` alone gives one contiguous block of what
    the other dims split: dim k's shard is the finest of the tensor dim it splits (a
    `_StridedShard`, or a plain shard after every other dim's shard of that tensor dim)."""
    m = _SHARDED.match(names[k])
    if m is None or _STRIDED.match(names[k]):
        return True
    for j, name in enumerate(names):
        other = _SHARDED.match(name)
        if j > k and other is not None and other.group(1) == m.group(1):
            return False
    return True


def carried(desc: Descriptor, merged: Descriptor) -> None:
    """The merged descriptor of a group's tensor takes the placement its pieces carried over
    the other mesh dims (`project`), for the next level's merge."""
    outer = desc.get(OUTER)
    merged.pop(OUTER, None)
    if isinstance(outer, dict) and outer.get("placements"):
        merged["placement"] = outer


__all__ = ["inner_groups", "project", "carried", "OUTER"]
