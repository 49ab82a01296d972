"""A compiled run whose backward is not recorded: what its parameter gradients can tell.

At level mix a compiled target records the calls its forward graphs run (module calls are
judged at their boundaries from them: compiled_modules.py, compiled_spans.py) and, of its
backward, only the parameter gradients the compiled backward hands over at its end: no module
backward hook fires inside compiled code, and the backward graphs are not recorded. A
parameter gradient is dW = f(the module's forward input, the gradient of its output), and that
gradient is made by the compiled backward from everything the forward computed after the
module, through the loss. A gradient that differs while its module's forward call agrees says
only that something after the module differs: forward code that is not judged (Inductor's
kernels that straddle module calls, the model's own code), or the backward itself. It is never
named (`withheld`); where nothing else is, the pair is "inconclusive: ..." (`unexplained`), naming
the compiled calls that no judged module call or span holds and the modules whose code they
compute, and the first judged call whose input already differs.
"""
from __future__ import annotations

from typing import Optional

from ..store.records import iter_tensors
from ..store.schema import (Kind, Phase, Record, RecordName, Role, compiled_facts, module_path,
                            param_grad_links)
from .compiled import INCONCLUSIVE
from .compiled_modules import boundary, inside, modules_of
from .graph import RunGraph
from .reasons import made_earlier
from .result import ERROR, WARNING, TensorRow
from .verdicts import Policy, run_precision

WITHHELD = ("not named: the compiled backward that made it is not recorded at this level, and "
            "the gradient it was computed from depends on every forward computation after its "
            "module, not all of which is judged")


def backward_unrecorded(target: list[Record]) -> bool:
    """Whether the target ran compiled code whose backward graphs are not recorded (level mix:
    its compiled records are all forward)."""
    ran = [r for r in target if r["kind"] in Kind.OPS and r.get("compiled")]
    return bool(ran) and all(r["phase"] == Phase.FORWARD for r in ran)


def withheld(target: list[Record]) -> dict[str, str]:
    """Record name -> why it is not named, for each parameter gradient of a compiled target
    whose backward is not recorded and whose module's backward call is not recorded either
    (a module run eagerly, past a graph break, has its own: it is judged as ever)."""
    if not backward_unrecorded(target):
        return {}
    names = {r["name"] for r in target}
    return {r["name"]: WITHHELD for r in target if r["kind"] == Kind.PARAM_GRAD
            and not any(link in names for link in param_grad_links(r["name"])[1:])}


def judged_paths(target: list[Record]) -> list[tuple[set[str], set[str]]]:
    """Of each judged module call or span of compiled code in the target: the module paths
    whose whole call it holds, and those whose own code it holds (a span's calls, each its own
    code: compiled_spans.py, with the code its kernels recompute)."""
    out: list[tuple[set[str], set[str]]] = []
    for r in target:
        facts = compiled_facts(r)
        if r["kind"] != Kind.MODULE or not facts:
            continue
        calls = [c for c in facts.get("span") or () if isinstance(c, str)]
        parsed = [RecordName.parse(c) for c in calls]
        if calls and all(p is not None for p in parsed):
            again = {m for m in facts.get("recomputes") or () if isinstance(m, str)}
            out.append((set(), {module_path(p.op) for p in parsed if p is not None} | again))
        elif isinstance(facts.get("module"), str):
            out.append(({facts["module"]}, set()))
    return out


def unjudged_calls(target: list[Record]) -> list[Record]:
    """The compiled forward calls (Inductor's kernels, extern kernels, graph ops) that no judged
    module call or span holds: all their modules inside it."""
    judged = judged_paths(target)
    out = []
    for r in target:
        mods = modules_of(r) if r["kind"] in Kind.OPS and r.get("compiled") and \
            r["phase"] == Phase.FORWARD else None
        if mods is None:
            continue
        if not any(all(m in own or any(inside(p, m) for p in whole) for m in mods)
                   for whole, own in judged):
            out.append(r)
    return out


def _listed(items: list[str], most: int = 4) -> str:
    shown = ", ".join(items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


def unexplained(rows: list[TensorRow], target: list[Record], held: dict[str, str],
                policy: Policy) -> Optional[str]:
    """Where module calls of compiled code were judged and none is named: the "inconclusive:
    ..." note when a tensor still differs (an error row, or a `held` gradient beyond its
    tolerance) beyond what the run's precision allows, else None. Under bf16 autocast the
    float32 parameter gradients a compiled backward makes are bf16 products widened, and the
    float32 residual stream is fed by bf16 matmuls: they differ from eager's by bf16's
    rounding, which is no evidence (`Policy.beyond_run_tolerance`)."""
    judged = sum(1 for r in target if r["kind"] == Kind.MODULE and r.get("compiled"))
    run = run_precision(rows)
    differ = list(dict.fromkeys(
        r.target_name or r.golden_name or r.op_name for r in rows if (r.result == ERROR or (
            r.result == WARNING and r.op_name in held and r.reason.endswith(held[r.op_name])))
        and policy.beyond_run_tolerance(r, run)))
    if not judged or not differ:
        return None
    said = (f"{INCONCLUSIVE}: the target ran torch.compile'd code recorded at level mix; "
            f"{judged} module calls were judged at their boundaries and none makes a difference "
            f"of its own, but "
            f"{len(differ)} tensors do ({_listed(differ, 3)})")
    if any(r.op_name in held and r.kind == Kind.PARAM_GRAD for r in rows
           if (r.target_name or r.golden_name) in differ):
        said += ("; a parameter gradient is made by the compiled backward, which is not "
                 "recorded, from every forward computation after its module")
    late = _first_late_input(rows, target)
    loose = unjudged_calls(target)
    if late is not None:
        path, at = late
        said += (f"; the input of `{path}` already differs where that judged module call reads "
                 f"it: it was made in forward code that is not judged")
        # (what ran after the call did not make its input; of what ran before, the calls its
        # input was made by, back to tensors judged calls agree on)
        ran = {id(r) for r in target[:at]}
        loose = [r for r in loose if id(r) in ran]
        loose = _made_it(path, loose, target) or loose
    if loose:
        kernels = list(dict.fromkeys(
            f"`{(r.get('compiled') or {}).get('node') or r['op']}`" for r in loose))
        code = list(dict.fromkeys(
            f"`{m}`" if m else "the model's own code" for r in loose for m in modules_of(r) or ()))
        said += (f"; not judged{' before it' if late is not None else ''}: {len(kernels)} "
                 f"compiled calls that no judged module call holds ({_listed(kernels, 3)}), "
                 f"computing code of {_listed(code, 12)}")
    return (said + "; the difference comes from that code or from the compiled backward; "
            "record both runs with level=\"L2\" (and backend=\"aot_eager\" for Inductor) to "
            "compare the compiled graphs op by op")


def _made_it(path: str, loose: list[Record], target: list[Record]) -> list[Record]:
    """Of the unjudged compiled calls `loose`, those the judged module call at `path` reads
    from, directly or through other calls of `loose`: where its input was made. The walk stops
    at every other maker (a member of a judged call before it, whose inputs and outputs agree;
    a parameter; the model's input), so the difference was made in these calls. [] where the
    call's members or boundary are not found."""
    forward = [r for r in target if r["kind"] in Kind.OPS and r.get("compiled")
               and r["phase"] == Phase.FORWARD and modules_of(r) is not None]
    members = [r for r in forward if all(inside(path, m) for m in modules_of(r) or ())]
    by_seq = RunGraph(target).by_seq
    found = boundary(members, target, by_seq)
    if found is None:
        return []
    wanted = {r["seq"] for r in loose}
    seen: set[Optional[int]] = set()
    todo = [seq for seq in found.made_by if seq in wanted]
    while todo:
        seq = todo.pop()
        if seq in seen:
            continue
        seen.add(seq)
        for _, role, d in iter_tensors(by_seq[seq]):
            made = d.get("producer") if role != Role.OUTPUT else None
            if made and made[0] in wanted:
                todo.append(made[0])
    return [r for r in loose if r["seq"] in seen]


def _first_late_input(rows: list[TensorRow], target: list[Record]
                      ) -> Optional[tuple[str, int]]:
    """The first judged forward module call of compiled code whose input differs beyond its
    tolerance (its row: an error made earlier): its module path and its record's index in
    `target` (it follows its compiled calls)."""
    judged = {r["name"]: i for i, r in enumerate(target) if r["kind"] == Kind.MODULE
              and r.get("compiled") and r["phase"] == Phase.FORWARD}
    for row in rows:
        at = judged.get(row.op_name)
        if at is not None and row.role == Role.INPUT and row.result == WARNING and \
                row.reason.endswith(made_earlier("")):
            parsed = RecordName.parse(row.op_name)
            return (module_path(parsed.op) if parsed else row.op_name), at
    return None


__all__ = ["WITHHELD", "backward_unrecorded", "withheld", "judged_paths", "unjudged_calls",
           "unexplained"]
