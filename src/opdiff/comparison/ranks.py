"""Across ranks: a difference a rank received through a collective is not that rank's error.

    from opdiff.comparison.ranks import attribute_collectives
    results = attribute_collectives(results, pairs)      # before runs.merge

A pair whose first divergence is a collective (`Distributed.*`, recorded with its
`"group": {"ranks", "seq"}` by capture/collectives.py) whose own inputs agree with golden
while its output does not received the difference from the other ranks: its first divergence
becomes origin "collective" ("received through Distributed.all_reduce #k from rank 1"), naming
the ranks whose own input to the same collective (same group, same seq, same step) differs.
When no participating rank's input differs, opdiff cannot tell where the difference came from
and says so in the reason; the collective is still not called a local error.

Collectives issued inside backward hooks (DDP's bucketed gradient all-reduce, FSDP2's gradient
reduce-scatter) are recorded only when the user opts in (`capture.collectives`'s
`record_ddp_allreduce(ddp)`, `record_fsdp_reduce_scatter(model)`); without that, a gradient
difference they carry is not attributed here. Tensor parallelism's functional collectives
(DTensor's all_reduce) are recorded as `Distributed.*` like the others.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from ..store.schema import Role
from ..store.source import DumpSource
from .result import ERROR, WARNING, CompareResult

Pair = tuple[DumpSource, DumpSource]
COLLECTIVE = "collective"


def _group_records(dump: DumpSource) -> dict[str, dict[str, Any]]:
    """name -> record for the dump's collectives that carry a group."""
    return {r["name"]: r for r in dump.records()
            if str(r.get("op", "")).startswith("Distributed.") and r.get("group")}


def _input_differs(result: CompareResult, name: str) -> bool:
    return any(row.op_name == name and row.role == Role.INPUT and row.result in (ERROR, WARNING)
               for row in result.rows)


def attribute_collectives(results: list[CompareResult], pairs: list[Pair]) -> list[CompareResult]:
    """`results` (one per pair, in the order of `pairs`) with the first divergences that a rank
    received through a collective marked origin "collective" (see the module docstring)."""
    suspects = [i for i, r in enumerate(results) if r.first_divergence is not None
                and r.first_divergence.op.startswith("Distributed.")]
    if not suspects:
        return results
    by_place = {(r.step, r.rank): i for i, r in enumerate(results)}
    groups: dict[int, dict[str, dict[str, Any]]] = {}

    def records(i: int) -> dict[str, dict[str, Any]]:
        if i not in groups:
            groups[i] = _group_records(pairs[i][0])
        return groups[i]

    out = list(results)
    for i in suspects:
        r = results[i]
        fd = r.first_divergence
        assert fd is not None
        rec = records(i).get(fd.name)
        if rec is None:
            continue                         # recorded before groups were: leave it as it was
        group = rec["group"]
        senders = []
        for other in group["ranks"]:
            j = by_place.get((r.step, other))
            if other == r.rank or j is None:
                continue
            match = _same_collective(records(j), group)
            if match is not None and _input_differs(results[j], match):
                senders.append(other)
        out[i] = replace(r, first_divergence=replace(
            fd, origin=COLLECTIVE, reason=_reason(fd.op, group, senders)))
    return out


def _same_collective(recs: dict[str, dict[str, Any]], group: dict[str, Any]) -> Optional[str]:
    for name, rec in recs.items():
        g = rec["group"]
        if g["ranks"] == group["ranks"] and g["seq"] == group["seq"] and \
                ("peer" in g) == ("peer" in group):
            return name
    return None


def _reason(op: str, group: dict[str, Any], senders: list[int]) -> str:
    where = f"{op} #{group['seq']} (group of ranks {group['ranks']})"
    if senders:
        who = ", ".join(str(s) for s in senders)
        return (f"received through {where} from rank{'s' if len(senders) > 1 else ''} {who}: "
                f"this rank's inputs agree with golden, its output does not, and the input "
                f"{'they' if len(senders) > 1 else 'it'} gave differs — not a local error")
    return (f"received through {where}: this rank's inputs agree with golden, its output does "
            f"not, and no other rank's recorded input to it differs (opdiff cannot tell where "
            f"the difference came from)")


def received_from(fd: Any) -> bool:
    """Whether a first divergence was received through a collective (not a local error)."""
    return fd is not None and getattr(fd, "origin", None) == COLLECTIVE


__all__ = ["attribute_collectives", "received_from", "COLLECTIVE"]
