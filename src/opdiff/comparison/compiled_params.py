"""Eager against Inductor at L2: forward extern kernels paired by the modules whose parameters
they read, not by their place in the sequence.

Inductor orders its extern kernels as it schedules them: layer 0's k, v and q projections'
`mm`s run in that order, eager's in q, k, v. The alignment pairs `mm` with `mm` by place and
shape, so q's `mm` met k's, and a region ending at it was judged against another tensor (a
healthy bf16-autocast step named a false culprit, its output "error 8.9"). Each extern kernel
names the modules of the nodes it computes (`compiled.modules`, capture/kernel_modules.py), and
each eager op reads its module's parameter, through autocast's cast and a transpose at most.
Where the two disagree the pair is split, and each such target op is paired with the one free
golden op of its kind, shapes and module, in the target op's place (`link_modules`).
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Optional, cast

from ..store.records import iter_tensors
from ..store.schema import Kind, Phase, Record, Role
from .compiled_modules import by_inductor, inside, modules_of
from .graph import RunGraph

Pair = tuple[Optional[int], Optional[int]]
Graphs = Optional[tuple[RunGraph, RunGraph]]    # (target's, golden's: `graph.py`)

# ops that hand a parameter on unchanged in value (autocast's cast of a weight, its transpose)
CARRIERS = frozenset({"Aten.t", "Aten._to_copy", "Aten.view", "Aten._unsafe_view",
                      "Aten.transpose", "Aten.permute", "Aten.expand", "Aten.clone",
                      "Aten.alias", "Aten.contiguous"})


def link_modules(pairs: list[Pair], target: list[Record], golden: list[Record],
                 graphs: Graphs = None) -> list[Pair]:
    """`pairs` with each forward pair whose target op names modules (`compiled.modules`) that
    the golden op's parameters do not belong to split, and each such target op paired with the
    one free golden op of the same kind and shapes that reads its module's parameters.
    graphs: the two sides' (`graph.RunGraph`), when the caller has them."""
    graphs = graphs or (RunGraph(target), RunGraph(golden))
    by_seq = graphs[1].at
    owners = {j: parameter_modules(golden[j], golden, by_seq) for j in range(len(golden))
              if golden[j]["phase"] == Phase.FORWARD and golden[j]["kind"] == Kind.ATEN}
    split: list[Pair] = []
    for ti, gi in pairs:
        if ti is not None and gi is not None and gi in owners and _other(target[ti], owners[gi]):
            split += [(ti, None), (None, gi)]
        else:
            split.append((ti, gi))
    if len(split) == len(pairs):
        return link_backward_modules(pairs, target, golden, graphs)
    free = {gi for ti, gi in split if ti is None and gi is not None and owners.get(gi)}
    out: list[Pair] = []
    used: set[int] = set()
    for ti, gi in split:
        if ti is not None and gi is None and _modules(target[ti]):
            found = [j for j in sorted(free - used) if _alike(target[ti], golden[j])
                     and not _other(target[ti], owners[j])]
            if len(found) == 1:
                used.add(found[0])
                out.append((ti, found[0]))
                continue
        out.append((ti, gi))
    return link_backward_modules(in_golden_order(
        [(ti, gi) for ti, gi in out if not (ti is None and gi in used)], golden), target, golden,
        graphs)


def link_backward_modules(pairs: list[Pair], target: list[Record],
                          golden: list[Record], graphs: Graphs = None) -> list[Pair]:
    """`pairs` with each backward extern kernel of Inductor's (a weight's or an input's
    gradient `mm`) paired with the one free golden backward op of its kind and shapes whose
    forward op reads the parameters of the same modules (`compiled.modules`), reading the same
    parameters itself (the input gradient reads the weight, the weight gradient the activation:
    `k_proj`'s two `mm`s have one shape); a pair the alignment made against that evidence is
    split first. Inductor's backward calls name no forward op of theirs (`forward` is the
    compiled function's), so their modules are the evidence. The pair takes the target op's
    place, golden's other ops put back in its order (`in_golden_order`)."""
    graphs = graphs or (RunGraph(target), RunGraph(golden))
    twins = ModuleTwins(golden, graphs[1])
    split: list[Pair] = []
    for ti, gi in pairs:
        if ti is not None and gi is not None and backward_modules(target[ti]) and \
                not twins(target[ti], golden[gi]):
            split += [(ti, None), (None, gi)]
        else:
            split.append((ti, gi))
    free = [gi for ti, gi in split if ti is None and gi is not None and
            golden[gi]["phase"] == Phase.BACKWARD and golden[gi]["kind"] == Kind.ATEN]
    used: set[int] = set()
    out: list[Pair] = []
    for ti, gi in split:
        if ti is not None and gi is None and backward_modules(target[ti]):
            found = [j for j in free if j not in used and twins(target[ti], golden[j])]
            if len(found) == 1:
                used.add(found[0])
                out.append((ti, found[0]))
                continue
        out.append((ti, gi))
    if len(split) == len(pairs) and not used:
        return pairs
    return beside_makers(in_golden_order(
        [(ti, gi) for ti, gi in out if not (ti is None and gi in used)], golden), target, golden,
        graphs[0])


def beside_makers(pairs: list[Pair], target: list[Record], golden: list[Record],
                  graph: Optional[RunGraph] = None) -> list[Pair]:
    """`pairs` with each stretch of golden's backward ops alone that runs just before a pair
    whose target op reads what one unpaired call of Inductor's backward made moved beside that
    call: golden made there what the pair reads, as that kernel did (eager's `silu_backward`
    runs after `up_proj`'s gradient `mm`s, Inductor's kernel holding it before them), so the
    region judging the kernel lists it (the region's boundary is the target's dataflow alone).
    graph: the target's (`graph.RunGraph`), when the caller has it."""
    by_seq: dict[Optional[int], int] = cast("dict[Optional[int], int]",
                                            (graph or RunGraph(target)).at)
    place = {ti: k for k, (ti, gi) in enumerate(pairs) if ti is not None and gi is None}
    moves: dict[int, list[int]] = {}        # place of the kernel -> places to put after it
    for k, (ti, gi) in enumerate(pairs):
        if ti is None or gi is None or target[ti]["phase"] != Phase.BACKWARD:
            continue
        makers = {place[m] for m in (by_seq.get((d.get("producer") or (None,))[0])
                                     for _, role, d in iter_tensors(target[ti])
                                     if role != Role.OUTPUT)
                  if m is not None and m in place and target[m]["phase"] == Phase.BACKWARD}
        alone: list[int] = []
        for q in range(k - 1, -1, -1):
            tq, gq = pairs[q]
            if tq is not None or gq is None or golden[gq]["phase"] != Phase.BACKWARD:
                break
            alone.insert(0, q)
        if len(makers) == 1 and alone and min(makers) < alone[0] and \
                any(t is not None and g is not None for t, g in pairs[min(makers):alone[0]]):
            moves.setdefault(min(makers), []).extend(alone)
    if not moves:
        return pairs
    moved = {q for qs in moves.values() for q in qs}
    out: list[Pair] = []
    for k, pair in enumerate(pairs):
        if k not in moved:
            out.append(pair)
        out += [pairs[q] for q in moves.get(k, ())]
    return out


class ModuleTwins:
    """`twins(t, g)`: whether an extern kernel of Inductor's compiled backward and a golden
    backward op are twins by the evidence `link_backward_modules` pairs them on: the modules
    whose parameters g's forward op reads are those t names, and they read the same
    parameters, in the same shapes."""

    def __init__(self, golden: list[Record], graph: Optional[RunGraph] = None) -> None:
        self.golden = golden
        self.by_seq = (graph or RunGraph(golden)).at      # (`graph`: golden's)
        self.by_name = {r["name"]: j for j, r in enumerate(golden)}
        self.owners: dict[str, set[str]] = {}

    def __call__(self, t: Record, g: Record) -> bool:
        modules = set(backward_modules(t))
        if not modules or g["phase"] != Phase.BACKWARD or not _alike(t, g):
            return False
        forward = str(g.get("forward") or "")
        if forward not in self.owners:
            made = self.by_name.get(forward)
            self.owners[forward] = set() if made is None else \
                parameter_modules(self.golden[made], self.golden, self.by_seq)
        return self.owners[forward] == modules and read_parameters(t) == read_parameters(g)


def backward_modules(record: Record) -> list[str]:
    """The modules an extern kernel of Inductor's compiled backward computes the gradients of
    (`compiled.modules`; [] for any other record, and for a kernel Inductor generated)."""
    if record["phase"] != Phase.BACKWARD or record["kind"] != Kind.ATEN or \
            not by_inductor(record):
        return []
    return [m for m in modules_of(record) or () if m]


def read_parameters(record: Record) -> set[tuple[str, str]]:
    """(input, parameter FQN) of each parameter `record` reads directly."""
    name = record["name"]
    return {(n[len(name):], str(d.get("fqn"))) for n, role, d in iter_tensors(record)
            if role != Role.OUTPUT and d.get("leaf") == "parameter"}


def in_golden_order(pairs: list[Pair], golden: list[Record]) -> list[Pair]:
    """`pairs` with each record only golden has moved to just before the first pair of ops (in
    the target's order) that holds a golden op it ran before: pairs made out of the alignment's
    order (q's `mm` met at k's place) leave golden's ops between them where the alignment put
    them, before every op of the target's that they are the twins of, and the regions
    (`regions.find_regions`, stretches of the list) would hold golden's ops of whole layers
    against none of the target's."""
    paired = sorted((gi, pos) for pos, (ti, gi) in enumerate(pairs)
                    if ti is not None and gi is not None and golden[gi]["kind"] in Kind.OPS)
    if not paired:
        return pairs
    first_after = [0] * len(paired)     # over paired[k:], the earliest place in the list
    low = len(pairs)
    for k in range(len(paired) - 1, -1, -1):
        low = min(low, paired[k][1])
        first_after[k] = low
    keys = [gi for gi, _ in paired]
    placed: list[tuple[float, int, Pair]] = []
    for pos, (ti, gi) in enumerate(pairs):
        where = float(pos)
        if ti is None and gi is not None:
            k = bisect_right(keys, gi)
            where = first_after[k] - 0.5 if k < len(paired) else float(len(pairs))
        placed.append((where, pos, (ti, gi)))
    return [pair for _, _, pair in sorted(placed, key=lambda p: (p[0], p[1]))]


def parameter_modules(record: Record, records: list[Record], by_seq: dict[int, int],
                      depth: int = 4) -> set[str]:
    """The modules whose parameters `record` reads, directly or through `CARRIERS`."""
    out: set[str] = set()
    for _, role, desc in iter_tensors(record):
        if role == Role.OUTPUT:
            continue
        fqn, producer = desc.get("fqn"), desc.get("producer")
        if desc.get("leaf") == "parameter" and isinstance(fqn, str):
            out.add(fqn.rsplit(".", 1)[0] if "." in fqn else "")
        elif producer and depth > 0:
            made = by_seq.get(producer[0])
            if made is not None and records[made]["op"] in CARRIERS:
                out |= parameter_modules(records[made], records, by_seq, depth - 1)
    return out


def _modules(record: Record) -> list[str]:
    found = (record.get("compiled") or {}).get("modules")
    if record["phase"] != Phase.FORWARD or not isinstance(found, list):
        return []
    return [str(m) for m in found]


def _other(t: Record, owners: set[str]) -> bool:
    """Does the target op compute nodes of none of the modules whose parameters golden's reads?"""
    modules = _modules(t)
    if not modules or not owners:
        return False
    return not any(inside(b, a) or inside(a, b) for a in owners for b in modules)


def _alike(t: Record, g: Record) -> bool:
    """The same op and phase, and the same shapes of the tensors both hold under one name (an
    extern kernel's `out=` buffer is the target's alone)."""
    if (t["op"], t["phase"]) != (g["op"], g["phase"]):
        return False
    t_shapes = {n[len(t["name"]):]: d.get("shape") for n, _, d in iter_tensors(t)}
    g_shapes = {n[len(g["name"]):]: d.get("shape") for n, _, d in iter_tensors(g)}
    shared = set(t_shapes) & set(g_shapes)
    return bool(shared) and all(t_shapes[k] == g_shapes[k] for k in shared)


__all__ = ["link_modules", "link_backward_modules", "beside_makers", "ModuleTwins",
           "backward_modules", "read_parameters", "in_golden_order", "parameter_modules",
           "CARRIERS"]
