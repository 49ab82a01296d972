"""A judged module call of compiled code whose input unjudged compiled code made, seen through
statistics: never named.

At level mix a compiled target's module calls are judged at their boundaries
(compiled_modules.py, compiled_spans.py); the compiled calls that no judged call holds
(Inductor's kernels that straddle module calls) are not judged (`compiled_backward.
unjudged_calls`). A module call is named when its output differs an order of magnitude more
than its inputs do. With statistics alone that comparison is a lower bound on the input's side:
a norm or a mean hides most of an element-wise error, and a module that mixes its input (a
norm, silu * mul, a projection) turns an input off by 1e-3 here and there into an output whose
statistics differ far more than the input's did (a wrong softmax inside a straddled attention
named the next layer's `down_proj`). So where a judged forward call's input already differs
beyond its tolerance in statistics, and unjudged compiled calls ran before it, the call is not
named (`late`): what differs may be theirs. Its output rows say so; where nothing else is named,
`compiled_backward.unexplained` says "inconclusive: ..." with the first judged call whose input
already differs and the unjudged calls before it. A call whose inputs agree (the first to show
a fault Inductor made inside it), whole tensors compared element by element, and eager runs are
judged as ever.
"""
from __future__ import annotations


from ..store.schema import Kind, Phase, Record, Role
from .compiled_backward import unjudged_calls
from .result import ERROR, WARNING, TensorRow

LATE = ("not named: its input already differs in statistics, which understate an element-wise "
        "error, and compiled code that no judged module call holds ran before it and may have "
        "made the difference")


def exposed(target: list[Record]) -> set[str]:
    """The judged forward module calls of a compiled target that unjudged compiled calls ran
    before (`compiled_backward.unjudged_calls`): those whose input may carry their difference."""
    loose = {id(r) for r in unjudged_calls(target)}
    first = next((i for i, r in enumerate(target) if id(r) in loose), None)
    if first is None:
        return set()
    return {r["name"] for r in target[first + 1:] if r["kind"] == Kind.MODULE
            and r.get("compiled") and r["phase"] == Phase.FORWARD}


def late(rows: list[TensorRow], calls: set[str]) -> dict[str, str]:
    """Record name -> why it is not named (`LATE`), for each of the `exposed` calls with an
    input compared from statistics beyond its tolerance (its row as measured, before blame
    rewrites it: `error` or `warning`)."""
    return {r.op_name: LATE for r in rows if r.op_name in calls and r.role == Role.INPUT
            and r.mode == "statistics" and r.result in (ERROR, WARNING)}


__all__ = ["LATE", "exposed", "late"]
