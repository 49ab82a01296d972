"""Eager at level mix against Inductor: module calls judged together where a kernel straddles them.

Inductor fuses across module boundaries: the embedding's gather with the first layer's RMSNorm,
a residual add with the next norm, a rotary embedding's cos/sin with the attention that uses
them. Such a kernel leaves every module call it touches unjudged on its own
(`compiled_modules.py`): the module's own outputs are never written. A *span* is the smallest
set of eager module calls, each standing for its own code (the torch calls made in its
`forward`, not in the module calls inside it, which are judged on their own), that closes it:
start from the modules a straddling kernel computes code of, add the modules of every compiled
call that computes code of one of them, and again, until the set stops growing. Where it
reaches code outside every recorded module call (the root, a module outside the model's tree),
nothing closes and nothing is judged. Code a kernel only *recomputes* (module code made from
parameters, buffers and constants alone, such as the rotary embedding's cos/sin and the causal
mask, which Inductor inlines into each attention's kernels) joins no span:
compiled_recompute.py. A span whose dataflow leaves it and comes back (the MLP between a
layer's two residual adds) is cut there: compiled_cuts.py.

A closed span of module calls each called once, of two or more calls or recomputing code, is
judged as one call: on the eager side its ops are its torch calls, on the compiled side the
compiled calls that compute only its code (and code they recompute). The boundary of each is
found by dataflow (`"producer"`): the tensors read from outside (parameters left out; a
compiled tensor whose maker is not recorded, the graph's input, enters where eager's tensor of
its shape is the model's input: the token ids) and the tensors read outside.
They must correspond one to one: entering tensors by shape and by the modules that made them
(layer 0's `k_proj` and `v_proj` outputs, both [2, 8, 16]), eager's constants of code the span
recomputes left over; leaving ones by shape and by who reads them (a tensor the first layer's
q/k/v projections read, another the residual add of `model.layers.0` reads: two [2, 8, 32]
tensors told apart by their readers, the same modules on both sides, each pairing with exactly
one). Then both sides get a module record of the span, `Module.<first>..<last>.Span.forward.0`,
which pairs by name and is judged as a module call: named where its inputs agree and its
outputs do not. Its `compiled` facts list the span's module calls (`span`), the code its
kernels recompute (`recomputes`) and kernels; `compiled.annotate` names the first and last call
with their lines.
"""
from __future__ import annotations

import os
from typing import Iterable, NamedTuple, Optional, TYPE_CHECKING, Union, cast

from ..store.records import iter_tensors
from ..store.schema import (CompiledFacts, Descriptor, Kind, Location, Phase, Record, RecordName, Role, compiled_facts,
                            locations_from_frames, module_op, module_path, record_name,
                            split_tensor_name)
from .compiled_modules import (Boundary, boundary, compiled_record, flattened, inside,
                               modules_of)
from .compiled_cuts import cut
from .graph import RunGraph
from .compiled_recompute import Constants, constant_code

if TYPE_CHECKING:
    from ..store.source import DumpSource

SPAN_CLASS = "Span"
Made = tuple[tuple[int, Record], tuple[int, Record]]    # (index, record) on each side


class _Entering(NamedTuple):
    """A tensor the eager span reads from outside it."""
    desc: Descriptor
    maker: Optional[str]        # the module path of the torch call that made it (None: input)
    constant: bool              # made from parameters, buffers and constants alone


def span_calls(target: list[Record], golden: list[Record], graph: Optional[RunGraph] = None
               ) -> tuple[list[Record], list[Record]]:
    """`target` and `golden`, each with a module record of every span that closes and whose
    boundary corresponds (see the module docstring) added after the span's last call."""
    compiled = [r for r in target if r["kind"] in Kind.OPS and r["phase"] == Phase.FORWARD
                and r.get("compiled") and modules_of(r) is not None]
    if not compiled or any(r["kind"] == Kind.MODULE and r.get("compiled", {}).get("span")
                           for r in target):
        return target, golden
    calls = _once_called(golden)
    constants = constant_code(golden)
    # module calls judged on their own (compiled_modules.py): a span inside one adds nothing
    judged = [module_path(r["op"]) for r in target
              if r["kind"] == Kind.MODULE and (r.get("compiled") or {}).get("module") is not None]
    tried: set[frozenset[str]] = set()
    names: dict[str, Optional[Made]] = {}
    t_after: dict[int, list[Record]] = {}
    g_after: dict[int, list[Record]] = {}
    graphs = (graph or RunGraph(target), RunGraph(golden))     # (`graph`: the target's)
    for r in compiled:
        units = _closure(_own(r, constants.modules), compiled, constants.modules)
        if not units or frozenset(units) in tried:
            continue
        tried.add(frozenset(units))
        if not all(u in calls for u in units) or \
                any(all(inside(p, u) for u in units) for p in judged):
            continue        # (the root's own code, a module outside the model's tree)
        for (ti, t_record), (gi, g_record) in _spans(units, calls, compiled, target, golden,
                                                      graphs, constants):
            if g_record["name"] not in names:   # (two spans of one name: neither is judged)
                names[g_record["name"]] = (ti, t_record), (gi, g_record)
            else:
                names[g_record["name"]] = None
    for made in names.values():
        if made is not None:
            (ti, t_record), (gi, g_record) = made
            t_after.setdefault(ti, []).append(t_record)
            g_after.setdefault(gi, []).append(g_record)
    return _inserted(target, t_after), _inserted(golden, g_after)


def _own(r: Record, recomputed: frozenset[str]) -> set[str]:
    """The modules whose own code a compiled call computes, less the code it recomputes."""
    return {m for m in modules_of(r) or () if m not in recomputed}


def _once_called(golden: list[Record]) -> dict[str, tuple[int, Record]]:
    """Module path -> (index, record) of each eager forward module call made once."""
    count: dict[str, int] = {}
    found: dict[str, tuple[int, Record]] = {}
    for i, g in enumerate(golden):
        if g["kind"] == Kind.MODULE and g["phase"] == Phase.FORWARD:
            path = module_path(g["op"])
            count[path] = count.get(path, 0) + 1
            found[path] = (i, g)
    return {p: found[p] for p, n in count.items() if n == 1}


def _closure(start: set[str], compiled: list[Record], recomputed: frozenset[str]
             ) -> Optional[set[str]]:
    """The smallest set of module paths (each standing for its own code) holding `start` and
    closed under "a compiled call computing code of one of them": all the other code that call
    computes joins, but code it recomputes (compiled_recompute.py); None where the root's
    code joins."""
    units = set(start)
    while units:
        reached = set(units)
        for r in compiled:
            mods = _own(r, recomputed)
            if mods & units:
                reached |= mods
        if "" in reached:
            return None     # (the root: every call; judged as a module if at all)
        if reached == units:
            return units
        units = reached
    return None


def _spans(units: set[str], calls: dict[str, tuple[int, Record]], compiled: list[Record],
           target: list[Record], golden: list[Record], graphs: tuple[RunGraph, RunGraph],
           constants: Constants) -> list[Made]:
    """The records of the span of `units` (each its own code): where its dataflow leaves it
    and comes back, of each part that corresponds (compiled_cuts.py), and of the whole where
    not both do; else of the whole."""
    members = [r for r in compiled
               if _own(r, constants.modules) and _own(r, constants.modules) <= units]
    if len(units) < 2 and not any(set(modules_of(r) or ()) & constants.modules
                                  for r in members):
        return []       # (one module call straddling nothing: compiled_modules.py's)
    where = {g["name"]: module_path(g["op"]) for g in golden if g["kind"] == Kind.MODULE}
    unit_of: dict[Optional[int], str] = {}        # seq of a torch call inside the span -> its unit
    for g in golden:
        path = where.get(g.get("module") or "")
        if g["kind"] in Kind.OPS and g["phase"] == Phase.FORWARD and path in units:
            unit_of[g["seq"]] = path
    whole = _span(unit_of, members, calls, target, golden, graphs, constants)
    g_parts = cut(set(unit_of), golden)
    t_parts = cut({r["seq"] for r in members}, target)
    if g_parts is None or t_parts is None or len(g_parts) != 2 or len(t_parts) != 2:
        return [whole] if whole is not None else []
    parts = [_span({s: unit_of[s] for s in g}, [r for r in members if r["seq"] in t],
                   calls, target, golden, graphs, constants, frozenset(units))
             for g, t in zip(g_parts, t_parts)]
    made = [m for m in parts if m is not None]
    return made if len(made) == 2 or whole is None else made + [whole]


def _span(unit_of: dict[Optional[int], str], members: list[Record], calls: dict[str, tuple[int, Record]],
          target: list[Record], golden: list[Record], graphs: tuple[RunGraph, RunGraph],
          constants: Constants, spare: frozenset[str] = frozenset()) -> Optional[Made]:
    """The records of the span made of the eager torch calls `unit_of` (seq -> its module
    call) and the compiled calls `members`, where their boundaries correspond. `spare`: for
    a part of a cut span, the whole span's units, whose code may recompute what the part
    hands on (`_leaving`)."""
    units = sorted(set(unit_of.values()), key=lambda u: calls[u][0])
    recomputes = sorted({m for r in members for m in modules_of(r) or ()
                         if m in constants.modules})
    by_seq = graphs[0].by_seq
    t_side = boundary(members, target, by_seq, unmade=True)
    eager = _eager_boundary(unit_of, golden, graphs[1].by_seq, constants)
    if not units or t_side is None or eager is None:
        return None
    g_entering, g_side, made_in = eager
    inputs = _entering(g_entering, t_side, by_seq, set(recomputes))
    outputs = _leaving(g_side, t_side, spare)
    if inputs is None or outputs is None:
        return None
    first = calls[units[0]][1]
    op = module_op(f"{units[0]}..{units[-1]}", SPAN_CLASS)
    g_record: Record = {
        "name": record_name(op, Phase.FORWARD, 0, Kind.MODULE), "op": op, "kind": Kind.MODULE,
        "phase": Phase.FORWARD, "module": first.get("module"), "stack": first.get("stack"),
        "seq": None, "inputs": [d for d, _ in inputs], "outputs": [d for d, _ in outputs],
        "kwargs": {}, "parameters": {}}
    span: CompiledFacts = {
        "span": [calls[u][1]["name"] for u in units],
        # (which module call of the span made each output: the verdict's line)
        "outputs_of": [calls[made_in[id(d)]][1]["name"] for d, _ in outputs]}
    if recomputes:
        span["recomputes"] = recomputes
    ti, t_record = compiled_record(g_record, members, target, [t for _, t in inputs],
                                   [t for _, t in outputs], span)
    t_record["compiled"].pop("module", None)
    return (ti, t_record), (max(calls[u][0] for u in units), g_record)


def _eager_boundary(unit_of: dict[Optional[int], str], golden: list[Record],
                    golden_by_seq: dict[int, Record], constants: Constants
                    ) -> Optional[tuple[list[_Entering], Boundary, dict[int, str]]]:
    """The eager span's boundary: the tensors its torch calls (`unit_of`: seq -> its module
    call) read that calls outside made (or that are the model's inputs), and those they made
    that torch calls outside read, with the modules of those readers; and which module call
    of the span made each leaving tensor (by `id`)."""
    where = {g["name"]: module_path(g["op"]) for g in golden if g["kind"] == Kind.MODULE}
    ops = [g for g in golden if g["kind"] in Kind.OPS and g["phase"] == Phase.FORWARD]
    if not unit_of or None in unit_of:
        return None
    by_seq = cast("dict[Optional[int], Record]", golden_by_seq)     # (golden's graph's)
    reads: dict[tuple[Union[int, str], Union[int, str]], _Entering] = {}   # as `boundary` keys them
    for seq in unit_of:
        for _, role, d in iter_tensors(by_seq[seq]):
            if role == Role.OUTPUT or d.get("leaf") in ("parameter", "buffer"):
                continue
            made = d.get("producer")
            if d.get("leaf") == "input" and d.get("fqn"):
                reads.setdefault(("input", d["fqn"]), _Entering(d, None, False))
            elif not made:
                return None     # (a tensor from nowhere recorded: the boundary is unknown)
            elif made[0] not in unit_of:
                maker = by_seq.get(made[0])
                source = _output(maker, made[1])
                if source is None or maker is None:
                    return None
                reads.setdefault((made[0], made[1]), _Entering(
                    source, where.get(maker.get("module") or ""),
                    (made[0], made[1]) in constants.tensors))
    # who reads each torch call's outputs (a call reading one tensor, `[:, -n:]` in the
    # model's own code, is read through: the compiled graph folds it into its readers)
    read_by: dict[Optional[int], set[str]] = {}
    for g in ops:
        for _, role, d in iter_tensors(g):
            made = d.get("producer") if role != Role.OUTPUT else None
            if made:
                read_by.setdefault(made[0], set()).add(where.get(g.get("module") or "", ""))
    readers: dict[tuple[int, int], set[str]] = {}
    for g in ops:
        if g["seq"] in unit_of:
            continue
        ins = [d for _, role, d in iter_tensors(g) if role != Role.OUTPUT]
        for d in ins:
            made = d.get("producer")
            if made and made[0] in unit_of:
                who = readers.setdefault((made[0], made[1]), set())
                who.add(where.get(g.get("module") or "", ""))
                if len(ins) == 1:
                    who |= read_by.get(g["seq"], set())
    leaving, made_in = [], {}
    for (seq, slot), who in readers.items():
        source = _output(by_seq.get(seq), slot)
        if source is None:
            return None
        leaving.append(([source], who))
        made_in[id(source)] = unit_of[seq]
    return list(reads.values()), Boundary([e.desc for e in reads.values()], leaving), made_in


def _output(record: Optional[Record], slot: Union[int, str]) -> Optional[Descriptor]:
    outs = record.get("outputs") if record is not None else None
    if not isinstance(outs, list) or not isinstance(slot, int) or not 0 <= slot < len(outs):
        return None
    d = outs[slot]
    return d if isinstance(d, dict) and d.get("type") == "tensor" else None


def _shape(d: Descriptor) -> tuple[int, ...]:
    return tuple(d.get("shape") or ())


def _entering(golden: list[_Entering], target: Boundary, by_seq: dict[int, Record],
              recomputes: set[str]) -> Optional[list[tuple[Descriptor, Descriptor]]]:
    """Each golden entering tensor with the one target tensor it corresponds to, else None:
    each target tensor pairs with the one golden tensor of its shape (or that shape regrouped)
    whose maker's module made the target's too (where both makers are known); a target
    tensor whose maker is not recorded only with the model's input; no golden tensor twice.
    Golden tensors left over must be constants of code the span recomputes
    (compiled_recompute.py): none else is left out."""
    paired: dict[int, Descriptor] = {}
    for i, t in enumerate(target.entering):
        seq = target.made_by[i] if i < len(target.made_by) else None
        mods = set(modules_of(by_seq[seq]) or ()) if seq in by_seq else set()
        fits = [j for j, g in enumerate(golden) if _shape(t) == _shape(g.desc)] or \
            [j for j, g in enumerate(golden) if flattened(_shape(t), _shape(g.desc))]
        fits = [j for j in fits if (golden[j].desc.get("leaf") == "input" or
                                    i not in target.unmade) and
                (not mods or golden[j].maker is None or golden[j].maker in mods)]
        if len(fits) != 1 or fits[0] in paired:
            return None
        paired[fits[0]] = t
    if any(j not in paired and not (g.constant and g.maker in recomputes)
           for j, g in enumerate(golden)):
        return None
    return [(golden[j].desc, _as_golden(paired[j], golden[j].desc)) for j in sorted(paired)]


def _leaving(golden: Boundary, target: Boundary, spare: frozenset[str] = frozenset()
             ) -> Optional[list[tuple[Descriptor, Descriptor]]]:
    """Each golden leaving tensor with the one target tensor of its shape read by a module
    that reads it in eager too (one to one, none left over), else None. A golden tensor read
    only by code of `spare` (the other part of a cut span) that no target tensor fits is left
    out: Inductor recomputes it there from the part's own inputs (a decoder layer's first
    residual add, computed again in the kernel of the second), and what the part is judged on
    (its other outputs, from all its inputs) is unchanged."""
    if not golden.leaving or not target.leaving:
        return None
    out, used = [], set()
    for ways, who in golden.leaving:
        g = ways[0]
        fits = [(i, t) for i, (spellings, readers) in enumerate(target.leaving)
                if readers & who for t in spellings[:2]
                if _shape(t) == _shape(g) or flattened(_shape(t), _shape(g))]
        if not fits and who and who <= spare:
            continue
        exact = [f for f in fits if _shape(f[1]) == _shape(g)] or fits
        if len({i for i, _ in exact}) != 1 or exact[0][0] in used:
            return None
        used.add(exact[0][0])
        out.append((g, _as_golden(exact[0][1], g)))
    return out if len(used) == len(target.leaving) else None


def _as_golden(t: Descriptor, g: Descriptor) -> Descriptor:
    """A target descriptor in the golden shape (saying the one it was saved in)."""
    if _shape(t) == _shape(g):
        return t
    shaped = t.copy()
    shaped["shape"], shaped["saved_shape"] = list(_shape(g)), t.get("shape")
    return shaped


def span_said(record: Optional[Record], dumps: Iterable[tuple[DumpSource, list[Record]]],
              tensor: Optional[str]) -> tuple[str, Optional[Location]]:
    """What a verdict at a span's record adds: its first and last module call with their
    call lines (from the eager dump's stacks), the call that made the output `tensor` (the one
    that differs most), and that call's line as the verdict's location ("", None for a record
    that is no span)."""
    facts = compiled_facts(record)
    calls = [c for c in facts.get("span") or () if isinstance(c, str)]
    if not calls:
        return "", None
    lines: dict[str, Location] = {}
    paths: set[str] = set()
    for dump, records in dumps:
        for r in records:
            if r["kind"] == Kind.MODULE and not r.get("compiled"):
                paths.add(module_path(r["op"]))
            if r["name"] in calls and r["name"] not in lines and r["kind"] == Kind.MODULE \
                    and not r.get("compiled") and r["stack"] is not None:
                try:
                    found = locations_from_frames(dump.stack(r["stack"]))
                except Exception:       # an unreadable stack is only a missing line
                    continue
                if found:
                    lines[r["name"]] = found[0]

    def path(name: str) -> str:
        parsed = RecordName.parse(name)
        return f"`{module_path(parsed.op)}`" if parsed else f"`{name}`"

    def call(name: str) -> str:
        at = lines.get(name)
        return f"{path(name)} ({os.path.basename(at.file)}:{at.line})" if at else path(name)
    said = (f"; judged as one span of {len(calls)} module calls that Inductor fused across, "
            f"from {call(calls[0])} to {call(calls[-1])}" if len(calls) > 1 else
            f"; judged as one span, the module call {call(calls[0])}")
    parents = [path(c) for c in calls if (p := RecordName.parse(c)) is not None and any(
        q.startswith(module_path(p.op) + ".") for q in paths)]
    if parents:
        said += (f" (of {', '.join(parents)} its own code: the module calls inside it are "
                 f"judged on their own)")
    again = [m for m in facts.get("recomputes") or () if isinstance(m, str)]
    if again:
        said += (f"; its kernels also recompute the code of "
                 f"{', '.join(f'`{m}`' for m in again)}, made once in eager from parameters, "
                 f"buffers and constants alone")
    made = facts.get("outputs_of") or []
    parts = split_tensor_name(tensor) if tensor else None
    slot = parts[2] if parts and parts[1] == Role.OUTPUT else None
    maker = made[int(slot)] if slot is not None and str(slot).isdigit() and \
        int(slot) < len(made) and isinstance(made[int(slot)], str) else None
    if maker is not None and len(calls) > 1:
        said += f"; the output that differs most is made in {path(maker)}"
    return said, lines.get(maker or "") or lines.get(calls[0])


def _inserted(records: list[Record], after: dict[int, list[Record]]) -> list[Record]:
    if not after:
        return records
    out: list[Record] = []
    for i, r in enumerate(records):
        out.append(r)
        out += after.get(i, [])
    return out


__all__ = ["SPAN_CLASS", "span_calls", "span_said"]
