"""A 2-D mesh (data parallel x tensor parallel) merged in two levels.

On a mesh of two dims, a rank's first group collective is over its innermost group (tensor
parallelism's all-reduce in the forward); the data-parallel collectives (DDP's gradient
all-reduce) come later and span the other dim. `inner_groups` reads each rank's first group
collective: when they split the ranks into equal proper groups, each group is merged first
(`MergedSource`: tensor parallel, one logical rank per group, named by its first rank), and
those logical ranks are then merged as data parallel (`MergedSource` over them).
"""
from __future__ import annotations

from typing import Optional, Sequence

from ...store.source import DumpSource

_LOOK = 2000          # records read per rank for its first group collective


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


__all__ = ["inner_groups"]
