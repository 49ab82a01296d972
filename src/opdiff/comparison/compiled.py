"""Eager against `torch.compile`: pairing what the compiled graphs ran with the eager ops, only
where the dump's dataflow agrees.

A compiled run records, at L2, the aten ops its FX graphs run (`capture/compiled.py` marks them
with a `compiled` field); the eager run the aten ops autograd and the model run. The two
sequences are mostly the same ops, but not in the same order (the compiled backward is one
graph in the partitioner's order, not autograd's), so a name or a shape alone pairs a `mul` of
one layer with a `mul` of another. Here every pair the alignment proposes is checked against the
dataflow (`"producer": [seq, slot]` on input descriptors): a pair whose inputs were made by ops
that are paired elsewhere, or by another parameter, is split. What is left unpaired forms
regions (`regions.py`), judged through their boundary or reported as not judged, never blamed
op by op.

Inductor's own kernels, recorded at L2 (`capture/inductor.py`, kind `kernel`), never pair one to
one: each falls in a region with the eager ops it replaces, between the extern kernels (mm, bmm)
that pair with eager's. A compiled target recorded at level mix against an eager golden is
judged per module call at its boundary (`compiled_modules.py`), Inductor's kernels and extern
kernels among them (each call names the modules of the nodes it fuses). Where the two sides
cannot be paired at all (level L1, Triton kernels, which are not recorded, an Inductor wrapper
whose modules are not known), the compare
is not refused: what pairs (leaves, parameter gradients) is compared, and the result says
"inconclusive" with the reason (the rows of `plans.PLANS`, `compiled_backward.unexplained`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterable, Optional, TYPE_CHECKING

from ..store.records import iter_tensors
from ..store.schema import Descriptor, Kind, Location, Phase, Record, Role, compiled_facts, locations_from_frames
from .compiled_modules import by_inductor
from .compiled_params import Graphs, ModuleTwins, backward_modules, link_modules
from .graph import RunGraph
from .compiled_spans import span_said
from .recording import Recording

if TYPE_CHECKING:
    from ..store.source import DumpSource
    from .result import Divergence

Pair = tuple[Optional[int], Optional[int]]

INCONCLUSIVE = "inconclusive"


def _inputs(record: Record) -> dict[str, Descriptor]:
    """Input descriptors by their name's suffix (`.input.0`, `.kwargs.x`)."""
    name = record["name"]
    return {n[len(name):]: d for n, role, d in iter_tensors(record) if role != Role.OUTPUT}


def verify(pairs: list[Pair], target: list[Record], golden: list[Record],
           strict: bool = True, graphs: Graphs = None) -> list[Pair]:
    """`pairs` with every pair the dataflow contradicts split into two unpaired ops (in place
    of the pair). Repeated until nothing changes: a split producer frees its consumers' inputs.
    `strict`: also split a backward pair where one side reads a paired op's output and the
    other a tensor without a producer (a gradient, or a view of that same output: weak evidence,
    used before `link_backward`, which prefers twins it does not contradict).
    graphs: the two sides' (`graph.RunGraph`), when the caller has them."""
    graphs = graphs or (RunGraph(target), RunGraph(golden))
    t_by_seq, g_by_seq = graphs[0].at, graphs[1].at
    in_backward = frozenset(i for i, r in enumerate(target) if r["phase"] == Phase.BACKWARD)
    if not t_by_seq or not g_by_seq:
        return pairs       # no dataflow on one side: nothing to check against
    t_by_name = {r["name"]: i for i, r in enumerate(target)}
    g_by_name = {r["name"]: j for j, r in enumerate(golden)}
    twins = ModuleTwins(golden, graphs[1])
    out = list(pairs)
    for _ in range(8):
        partner = {ti: gi for ti, gi in out if ti is not None and gi is not None}
        taken = {gi: ti for ti, gi in partner.items()}
        split: list[Pair] = []
        changed = False
        for ti, gi in out:
            if ti is not None and gi is not None and (
                    _contradicts(target[ti], golden[gi], partner, taken, t_by_seq, g_by_seq,
                                 strict, in_backward) or
                    _other_forward(target[ti], golden[gi], partner, t_by_name, g_by_name, twins)):
                split += [(ti, None), (None, gi)]
                changed = True
            else:
                split.append((ti, gi))
        out = split
        if not changed:
            break
    return out


def _other_forward(t: Record, g: Record, partner: dict[int, int], t_by_name: dict[str, int],
                   g_by_name: dict[str, int], golden_twins: ModuleTwins) -> bool:
    """Whether two backward ops are not known to belong to forward ops that are each other's
    twins (a compiled backward op names its forward op through the graph node's `seq_nr`; the
    backward of eager and compiled code run in other orders, so a name or shape proves nothing)."""
    if t["phase"] != Phase.BACKWARD or t["kind"] not in Kind.REPLAYABLE:
        return False
    if backward_modules(t):     # (Inductor's: its `forward` is the compiled function's)
        return not golden_twins(t, g)
    tf, gf = t.get("forward"), g.get("forward")
    ti, gi = t_by_name.get(tf or ""), g_by_name.get(gf or "")
    # a backward pair stands only on positive evidence: its forward ops are each other's twins
    return ti is None or gi is None or partner.get(ti) != gi


def link_backward(pairs: list[Pair], target: list[Record], golden: list[Record],
                  graphs: Graphs = None) -> list[Pair]:
    """Pair unpaired backward ops through their forward ops: a target backward op whose forward
    op is paired meets an unpaired golden backward op of that forward op's twin with the same
    op and shapes (the compiled backward runs in another order than autograd's, so the
    alignment leaves most of them unpaired). The pair takes the target op's place."""
    partner = {ti: gi for ti, gi in pairs if ti is not None and gi is not None}
    taken = {gi: ti for ti, gi in partner.items()}
    graphs = graphs or (RunGraph(target), RunGraph(golden))
    t_by_seq, g_by_seq = graphs[0].at, graphs[1].at
    in_backward = frozenset(i for i, r in enumerate(target) if r["phase"] == Phase.BACKWARD)
    t_by_name = {r["name"]: i for i, r in enumerate(target)}
    free: dict[tuple[Any, ...], list[int]] = {}
    for ti, gi in pairs:
        if ti is None and gi is not None and golden[gi].get("forward"):
            g = golden[gi]
            free.setdefault((g["forward"],) + signature(g), []).append(gi)
    used: set[int] = set()
    out: list[Pair] = []
    for ti, gi in pairs:
        if ti is not None and gi is None and (forward := target[ti].get("forward")):
            t = target[ti]
            f = t_by_name.get(forward)
            twin = partner.get(f) if f is not None else None
            if twin is not None:
                waiting = free.get((golden[twin]["name"],) + signature(t))
                if waiting:
                    # the first candidate whose inputs' makers do not contradict it
                    gj = next((j for j in waiting if not _contradicts(
                        t, golden[j], partner, taken, t_by_seq, g_by_seq, True, in_backward)),
                        waiting[0])
                    waiting.remove(gj)
                    used.add(gj)
                    out.append((ti, gj))
                    continue
        out.append((ti, gi))
    return [(ti, gi) for ti, gi in out if not (ti is None and gi in used)]


def signature(record: Record) -> tuple[Any, ...]:
    """op, phase and the shapes of every tensor (what two twins share)."""
    shapes = tuple((role, tuple(d.get("shape") or ())) for _, role, d in iter_tensors(record))
    return (record["op"], record["phase"], shapes)


def _contradicts(t: Record, g: Record, partner: dict[int, int], taken: dict[int, int],
                 t_by_seq: dict[int, int], g_by_seq: dict[int, int], strict: bool,
                 in_backward: frozenset[int] = frozenset()) -> bool:
    """Whether the inputs of t and g were made by ops that are not each other's twins."""
    if t["kind"] not in Kind.REPLAYABLE:
        return False        # modules, leaves, parameter gradients pair by their names
    g_inputs = _inputs(g)
    backward = strict and t["phase"] == Phase.BACKWARD
    for suffix, td in _inputs(t).items():
        gd = g_inputs.get(suffix)
        if gd is None:
            continue
        tp, gp = td.get("producer"), gd.get("producer")
        tl, gl = td.get("leaf"), gd.get("leaf")
        if tp and gp:
            t_made, g_made = t_by_seq.get(tp[0]), g_by_seq.get(gp[0])
            if t_made is None or g_made is None:
                continue
            if t_made in partner and (partner[t_made] != g_made or tp[1] != gp[1]):
                return True
            if t_made not in partner and g_made in taken:
                return True
        elif tp and gl in ("parameter", "buffer", "input"):
            t_made = t_by_seq.get(tp[0])
            if t_made is not None and t_made in partner:
                return True     # golden reads a leaf where the target reads a paired op's output
        elif gp and tl in ("parameter", "buffer", "input"):
            g_made = g_by_seq.get(gp[0])
            if g_made is not None and g_made in taken:
                return True
        elif tl and gl and td.get("fqn") and gd.get("fqn") and \
                (tl, td.get("fqn")) != (gl, gd.get("fqn")):
            return True         # another parameter, buffer or input
        elif backward and (tp or gp) and not (tl or gl):
            # in backward, a tensor without a producer is a gradient (or a view): one side
            # reads a forward op's output where the other reads a gradient (Inductor's
            # backward calls name the ones that made theirs: gradients too)
            made = t_by_seq.get(tp[0]) if tp else g_by_seq.get(gp[0]) if gp else None
            if tp and made in in_backward:
                continue
            if made is not None and (made in partner if tp else made in taken):
                return True
    return False


def inductor_calls(records: list[Record]) -> list[str]:
    """The ops of a dump recorded inside Inductor's generated code (its extern kernels and,
    from capture/inductor.py, its own kernels)."""
    return [r["op"] for r in records if by_inductor(r)]


def comparable_records(target: list[Record], golden: list[Record]) -> int:
    """How many records could pair at most, for the "different models" check: where a side
    ran Inductor kernels (capture/inductor.py), each stands for several ops of the other side
    and never pairs one to one, so only that side's other records (extern kernels, leaves)
    count; where module calls of compiled code were made at mix (`judged_modules`), the
    target's records that are not ops; otherwise the larger side's records."""
    if judged_modules(target):      # mix: ops never pair, only records by their names
        return sum(1 for r in target if r["kind"] not in Kind.OPS)
    kernels = [sum(1 for r in side if r["kind"] == Kind.KERNEL) for side in (target, golden)]
    if any(kernels):
        return max(len(side) - k for side, k in zip((target, golden), kernels) if k)
    return max(len(target), len(golden))


def linked(pairs: list[Pair], target: list[Record], golden: list[Record],
           graphs: Graphs = None) -> list[Pair]:
    """The alignment's pairs of eager against compiled code, op by op: module calls of compiled
    code linked (`compiled_params.link_modules`), checked against dataflow, backward ops paired
    through their forward ops, checked again, leaves and gradients paired by name. The two
    sides' graphs (`graph.RunGraph`, the caller's when it has them) are indexed once for all."""
    graphs = graphs or (RunGraph(target), RunGraph(golden))
    pairs = verify(link_modules(pairs, target, golden, graphs), target, golden, graphs=graphs)
    return by_name(verify(link_backward(pairs, target, golden, graphs), target, golden,
                          strict=False, graphs=graphs), target, golden)


# The plan table's "inconclusive: ..." reasons (`plans.PLANS`), one per row that says one;
# `side` is the compiled side's Recording, `target` whether that is the target.
def unrecorded_kernels(side: Recording, target: bool) -> str:
    which = "target" if target else "golden"
    shown = ", ".join(dict.fromkeys(side.extern))
    return (f"{INCONCLUSIVE}: the {which} ran Inductor-generated kernels, which are not "
            f"recorded (only {len(side.extern)} extern kernel calls are: {shown}); only inputs, "
            f"parameters and parameter gradients (where recorded) are compared, ops are not "
            f"judged; record "
            f"the {which} with torch.compile(backend=\"aot_eager\") and level=\"L2\" to "
            f"compare its graphs op by op (if that names nothing, the difference comes from "
            f"Inductor's code generation)")


def kernels_against_aten(level: Optional[str]) -> str:
    return (f"{INCONCLUSIVE}: one run ran Inductor's kernels and the other the aten ops of "
            f"another backend, both recorded at level {level}: only inputs, "
            f"parameters and parameter gradients (where recorded) are compared, ops are not "
            f"judged; record both runs with level=\"L2\" to judge each kernel against the "
            f"ops it fuses")


def modules_unknown(side: Recording, target: bool) -> str:
    which = "target" if target else "golden"
    return (f"{INCONCLUSIVE}: the {which} ran Inductor-generated kernels whose modules are "
            f"not known ({len(side.unplaced)} calls, such as {side.unplaced[0]}): Inductor "
            f"generated its code while opdiff did not record (the model was compiled "
            f"before capture started, or a wrapper call opdiff could not place); no "
            f"module call is judged, only inputs, parameters and parameter gradients are "
            f"compared; record a step in which torch.compile compiles (start capture "
            f"before the first compiled call, or call torch._dynamo.reset() first)")


def levels_differ(target: bool, levels: set[Optional[str]]) -> str:
    which = "target" if target else "golden"
    return (f"{INCONCLUSIVE}: the {which} ran torch.compile'd code, whose graphs are recorded per "
            f"aten op, while the other run is recorded per torch call (level "
            f"{'/'.join(sorted(str(v) for v in levels))}): only inputs, parameters and parameter "
            f"gradients (where recorded) are compared, ops are not judged; record both runs with level=\"L2\" "
            f"(and backend=\"aot_eager\" for Inductor) to compare the compiled graphs op by op")


def judged_modules(target: list[Record]) -> int:
    """How many module calls of compiled code `compiled_modules.module_calls` made."""
    return sum(1 for r in target if r["kind"] == Kind.MODULE and r.get("compiled"))


def restrict(pairs: list[Pair], target: list[Record], golden: list[Record]) -> list[Pair]:
    """Only records that are not ops stay paired (leaves, parameter gradients, module calls):
    where compiled code and eager code are recorded differently, two ops of the same name and
    shapes are not known to be twins."""
    out: list[Pair] = []
    for ti, gi in pairs:
        if ti is not None and gi is not None and target[ti]["kind"] in Kind.REPLAYABLE:
            out += [(ti, None), (None, gi)]
        else:
            out.append((ti, gi))
    return by_name(out, target, golden)


# records whose name says what they are, in any order (a module call's name is its path,
# class and call number: compiled_modules.py makes a compiled run's under the eager names)
NAMED = (Kind.LEAF, Kind.PARAM_GRAD, Kind.MODULE)


def by_name(pairs: list[Pair], target: list[Record], golden: list[Record]) -> list[Pair]:
    """Pair unpaired leaves and parameter gradients by their names: a compiled backward hands
    every gradient over at its end, in another order than autograd's. The pair takes the
    target record's place."""
    free = {golden[gi]["name"]: gi for ti, gi in pairs
            if ti is None and gi is not None and golden[gi]["kind"] in NAMED}
    used: set[int] = set()
    out: list[Pair] = []
    for ti, gi in pairs:
        if ti is not None and gi is None and target[ti]["kind"] in NAMED:
            gj = free.pop(target[ti]["name"], None)
            if gj is not None:
                used.add(gj)
                out.append((ti, gj))
                continue
        out.append((ti, gi))
    return [(ti, gi) for ti, gi in out if not (ti is None and gi in used)]


def where(record: Optional[Record]) -> str:
    """" (compiled graph `<eval_with_key>.5`, node `silu_1`, in `model.layers.1.mlp`)": what the
    compiler says of a record it ran ("" for an eager record)."""
    facts = compiled_facts(record)
    if not facts.get("node"):
        return ""
    inside = f", in `{facts['module']}`" if facts.get("module") else ""
    modules = facts.get("modules")     # (a kernel's: the modules of the nodes it computes)
    if not inside and isinstance(modules, list) and any(modules):
        inside = ", computing " + ", ".join(f"`{m}`" for m in modules if m)
    kernels = facts.get("kernels")
    if isinstance(kernels, list) and len(kernels) > 1:     # (a module call of Inductor's)
        ran = "kernels " + ", ".join(f"`{k}`" for k in kernels)
    else:
        ran = f"node `{facts['node']}`"
    return f" (compiled graph `{facts.get('graph', '?')}`, {ran}{inside})"


def source(record: Optional[Record],
           code_of: Callable[[str, int], str] = lambda file, line: "") -> Optional[Location]:
    """The user's line the compiler names for a record it ran (its node's stack trace). The
    line's text comes from `code_of(file, line)` (what the dumps hold: `stored_code`), never
    from the file the dump names (a dump is untrusted: SECURITY.md)."""
    found = compiled_facts(record).get("source")
    if not isinstance(found, list) or len(found) != 2:
        return None
    try:
        file, line = str(found[0]), int(found[1])
    except (TypeError, ValueError):
        return None
    return Location(file, line, code_of(file, line))


def stored_code(dumps: Iterable[tuple[DumpSource, list[Record]]]) -> Callable[[str, int], str]:
    """`code_of(file, line)`: the text of a source line as the dumps' own stacks hold it (a
    frame's `code`, or a line of its stored `context`), "" when no dump holds it. `dumps`:
    (DumpSource, its records) pairs; read only when asked."""
    def code_of(file: str, line: int) -> str:
        for dump, records in dumps:
            seen: set[int] = set()
            for r in records:
                sid = r["stack"]
                if sid is None or sid in seen:
                    continue
                seen.add(sid)
                try:
                    frames = dump.stack(sid)
                except Exception:       # an unreadable stack is only a missing line
                    continue
                for frame in frames:
                    if not isinstance(frame, dict) or frame.get("file") != file:
                        continue
                    if frame.get("line") == line and isinstance(frame.get("code"), str):
                        return str(frame["code"]).strip()[:_MAX_CODE]
                    for n, text in frame.get("context") or ():
                        if n == line and isinstance(text, str):
                            return text.strip()[:_MAX_CODE]
        return ""
    return code_of


_MAX_CODE = 1000


def module_line(call: str, kernel_line: Optional[Location], golden: list[Record],
                dumps: Iterable[tuple[DumpSource, list[Record]]]) -> Optional[Location]:
    """Where to point for the compiled ops judged as the module call `call`: the line its first
    kernel names (`kernel_line`) if the golden run executed that line inside that call (a frame
    of one of its ops' stacks); else the line of golden's first op inside the call. A kernel
    fuses across modules and names one node's line: GPT-2's silu kernel names Conv1D's
    `addmm` line (the `view` of `c_fc`'s output it fuses), not `act`'s. None where golden's
    stacks cannot tell."""
    dump = next((d for d, records in dumps if records is golden), None)
    if dump is None:
        return None
    parents = {r["name"]: r["module"] for r in golden if r["kind"] == Kind.MODULE}

    def within(module: Optional[str]) -> bool:
        seen: set[str] = set()
        while module and module not in seen:
            if module == call:
                return True
            seen.add(module)
            module = parents.get(module)
        return False
    first: Optional[Location] = None
    for r in golden:
        if r["kind"] not in Kind.OPS or r["stack"] is None or not within(r["module"]):
            continue
        try:
            frames = locations_from_frames(dump.stack(r["stack"]))
        except Exception:       # an unreadable stack is only a missing line
            continue
        if kernel_line is not None and any((f.file, f.line) == (kernel_line.file, kernel_line.line)
                                           for f in frames):
            return kernel_line
        first = first or (frames[0] if frames else None)
    return first


def region_line(region: dict[str, Any], kernel_line: Optional[Location],
                golden_line: Callable[[str], Optional[Location]] = lambda name: None
                ) -> Optional[Location]:
    """Where to point for a region of compiled code: its kernel's line if golden ran one of the
    region's ops there; else the line of golden's last op in the region, which makes what the
    region hands on (Inductor's final-norm kernel names `lm_head`'s line, the node it was
    scheduled with; golden's last op is the norm's `self.weight * hidden_states`).
    `golden_line(name)`: the user's line of a golden op that ran compiled code itself (its
    stack's innermost frame is the compiled graph's code, `<eval_with_key>.N`)."""
    lines: list[Location] = []
    for o in region.get("golden_ops") or []:
        at = golden_line(str(o.get("name")))
        if at is None and isinstance(o.get("location"), dict):
            try:
                at = Location(str(o["location"]["file"]), int(o["location"]["line"]),
                              str(o["location"].get("code") or ""))
            except (KeyError, TypeError, ValueError):
                continue
        if at is not None:
            lines.append(at)
    if not lines or (kernel_line is not None and any(
            (at.file, at.line) == (kernel_line.file, kernel_line.line) for at in lines)):
        return kernel_line
    return lines[-1]


def annotate(divergence: Optional[Divergence], target: list[Record], golden: list[Record],
             dumps: Iterable[tuple[DumpSource, list[Record]]] = ()) -> Optional[Divergence]:
    """A divergence at an op of compiled code says where the compiler put it: its graph node,
    the module and the user's line (the op's own call site is inside torch). `dumps`: where the
    line's text may come from (see `stored_code`)."""
    if divergence is None:
        return None
    by_name = {r["name"]: r for r in target}
    rec = by_name.get(divergence.name)
    if rec is None and divergence.region:
        ops = divergence.region.get("target_ops") or []
        rec = next((by_name.get(o.get("name")) for o in ops
                    if compiled_facts(by_name.get(o.get("name")))), None)
    said = where(rec)
    if not said:
        return divergence
    dumps = list(dumps)
    loc = source(rec, stored_code(dumps)) or divergence.location
    if rec is not None and rec["kind"] == Kind.MODULE and not rec["compiled"].get("span"):
        loc = module_line(rec["name"], loc, golden, dumps) or loc
    elif divergence.region:
        code, g_by = stored_code(dumps), {r["name"]: r for r in golden}
        loc = region_line(divergence.region, loc, lambda name: source(g_by.get(name), code))
    # a span of module calls (compiled_spans.py): its first and last call, and the line of
    # the one that made the output that differs
    spanned, line = span_said(rec, dumps, divergence.tensor)
    return replace(divergence, reason=divergence.reason + said + spanned, location=line or loc)


__all__ = ["INCONCLUSIVE", "NAMED", "where", "source", "stored_code", "annotate", "linked",
           "verify", "link_backward", "signature", "inductor_calls", "unrecorded_kernels",
           "kernels_against_aten", "modules_unknown", "levels_differ", "restrict", "by_name",
           "judged_modules"]
