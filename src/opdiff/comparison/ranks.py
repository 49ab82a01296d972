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
reduce-scatter) are recorded by `PrecisionDebugger.start(model)` on a DDP or FSDP2 model at L1
and mix (`capture.collectives.record_backward_collectives`). When they are not recorded (the
user's own comm hook, L0, a debugger started without the model), the difference is inferred
(`infer_gradient_collectives`): a rank whose own ops all agree with golden until an op reads a
tensor that differs (the gradients written by the all-reduce: the optimizer's update), while
another rank of the same step has an error of its own, received it through the gradient
collective: origin "collective", "received through DDP's all-reduce (inferred: not recorded)";
the next step on that rank starts from parameters carried over from it (origin "parameter",
`origins.across_steps`, run later by `runs.merge`).
Tensor parallelism's functional collectives (DTensor's all_reduce) are recorded as
`Distributed.*` like the others.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ..store.schema import Group, Record, RecordName, Role
from ..store.source import DumpSource
from .result import ERROR, WARNING, CompareResult, Divergence, Origin, TensorRow

Pair = tuple[DumpSource, DumpSource]


def _group_records(dump: DumpSource) -> dict[str, Record]:
    """name -> record for the dump's collectives that carry a group."""
    return {r["name"]: r for r in dump.records()
            if str(r["op"]).startswith("Distributed.") and r.get("group")}


def _input_differs(result: CompareResult, name: str) -> bool:
    return any(row.op_name == name and row.role == Role.INPUT and row.result in (ERROR, WARNING)
               for row in result.rows)


def attribute_collectives(results: list[CompareResult], pairs: list[Pair]) -> list[CompareResult]:
    """`results` (one per pair, in the order of `pairs`) with the first divergences that a rank
    received through a collective marked origin "collective" (see the module docstring)."""
    results = infer_gradient_collectives(results, pairs)
    suspects = [i for i, r in enumerate(results) if r.first_divergence is not None
                and r.first_divergence.op.startswith("Distributed.")]
    if not suspects:
        return results
    by_place = {(r.step, r.rank): i for i, r in enumerate(results)}
    groups: dict[int, dict[str, Record]] = {}

    def records(i: int) -> dict[str, Record]:
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
            fd, origin=Origin.COLLECTIVE, reason=_reason(fd.op, group, senders)))
    return out


def _same_collective(recs: dict[str, Record], group: Group) -> Optional[str]:
    for name, rec in recs.items():
        g = rec["group"]
        if g["ranks"] == group["ranks"] and g["seq"] == group["seq"] and \
                ("peer" in g) == ("peer" in group):
            return name
    return None


def _reason(op: str, group: Group, senders: list[int]) -> str:
    where = f"{op} #{group['seq']} (group of ranks {group['ranks']})"
    if senders:
        who = ", ".join(str(s) for s in senders)
        return (f"received through {where} from rank{'s' if len(senders) > 1 else ''} {who}: "
                f"this rank's inputs agree with golden, its output does not, and the input "
                f"{'they' if len(senders) > 1 else 'it'} gave differs — not a local error")
    return (f"received through {where}: this rank's inputs agree with golden, its output does "
            f"not, and no other rank's recorded input to it differs (opdiff cannot tell where "
            f"the difference came from)")


_GRADIENT_COLLECTIVES = ("Distributed.all_reduce", "Distributed.reduce_scatter")
INFERRED = "DDP's all-reduce (inferred: not recorded)"


def _records_gradient_collective(dump: DumpSource) -> bool:
    return any(str(r["op"]).startswith(_GRADIENT_COLLECTIVES) for r in dump.records())


def _received_row(result: CompareResult) -> Optional[TensorRow]:
    """The first differing row when it is an input (what a recorded op gave agrees, what
    arrived does not); None when the first differing row is an op's own output or none differs."""
    for row in result.rows:
        if row.result in (ERROR, WARNING):
            return row if row.role == Role.INPUT else None
    return None


def infer_gradient_collectives(results: list[CompareResult], pairs: list[Pair]) -> list[CompareResult]:
    """Mark what a rank received through an unrecorded gradient collective (module docstring)."""
    local = {r.step for r in results if r.first_divergence is not None
             and r.first_divergence.origin not in (Origin.COLLECTIVE, Origin.OPTIMIZER)}
    out = list(results)
    for i, r in sorted(enumerate(results), key=lambda e: (e[1].step or 0, e[1].rank or 0)):
        fd = r.first_divergence
        others = any(o.step == r.step and o.rank != r.rank and o.first_divergence is not None
                     and o.first_divergence.origin not in (Origin.COLLECTIVE, Origin.OPTIMIZER)
                     for o in results)
        if fd is None and others and r.step in local:
            row = _received_row(r)
            if row is None or _records_gradient_collective(pairs[i][0]):
                continue
            senders = sorted({o.rank for o in results if o.step == r.step and o.rank != r.rank
                              and o.first_divergence is not None and o.rank is not None})
            who = ", ".join(str(s) for s in senders)
            parsed = RecordName.parse(row.op_name)
            out[i] = replace(r, first_divergence=Divergence(
                name=row.op_name, op=parsed.op if parsed is not None else row.op_name, phase=row.phase,
                reason=(f"received through {INFERRED} from rank{'s' if len(senders) > 1 else ''} "
                        f"{who}: this rank's own ops agree with golden, the gradients it reads "
                        f"after the collective do not — not a local error"),
                location=row.stack[0] if row.stack else None, metrics=dict(row.metrics),
                tensor=row.target_name, module=row.module, step=r.step, rank=r.rank,
                origin=Origin.COLLECTIVE))
    return out


def received_from(fd: Optional[Divergence]) -> bool:
    """Whether a first divergence was received through a collective (not a local error)."""
    return fd is not None and getattr(fd, "origin", None) == Origin.COLLECTIVE


__all__ = ["attribute_collectives", "infer_gradient_collectives", "received_from"]
