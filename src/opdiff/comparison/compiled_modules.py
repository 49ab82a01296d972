"""Eager at level mix against compiled code: each module's call judged at its boundary.

At mix an eager run records torch calls and module calls; a compiled run records the aten ops
its forward graphs run (`compiled` provenance: the module each node came from) and no module
call (module hooks do not fire inside compiled code). Ops of the two sides never pair one to
one. But a module's call is a region whose members the compiler names: the compiled ops whose
`compiled.module` is the module's path or one inside it. Its boundary is found through the
dump's dataflow (`"producer": [seq, slot]`): the tensors its ops read that ops outside it
made, and the tensors its ops made that ops outside it read. Where these correspond one to one
with the eager module call's inputs and outputs (the same count and the same shapes, no two of
a shape), the target gets a module record of that call, with that name, made of those
descriptors, which pairs with the eager one by name and is judged as any module call (named
where its inputs agree and its outputs do not). A module called more than once, one whose ops
read a tensor whose maker is not recorded or draw random numbers (dropout in training), or
whose boundary does not correspond, gets none: it is not judged, never guessed. Only forward graphs
are recorded at mix: the parameter gradients are compared, never named (compiled_backward.py).

Under Inductor the compiled calls are its generated kernels (`Inductor.<kernel>`, kind
`kernel`) and the extern kernels its wrapper calls (mm, bmm), each naming the modules of every
node it fuses (`compiled.modules`, capture/kernel_modules.py; views left out). A call is a
member of a module's call when all those modules lie inside it; a call fusing nodes inside and
outside it (the down projection's last op with the residual add after it) makes the module
unjudged, and the enclosing module whose call holds all of it is judged instead (and the
smallest span of module calls that closes the call: compiled_spans.py). A boundary
tensor may be saved in another grouping of the same dimensions than eager's (an mm's [16, 32]
for a Linear's [2, 8, 32]): it is compared in eager's shape (`saved_shape` says which it had).
Where an Inductor call names no module (its wrapper generated while opdiff did not watch), no
module call is judged (compiled.py's note says why). Under autocast Inductor fuses a Linear's
bf16 weight cast into the kernel of the code before it; a cast names no module there, and the
kernel says which outputs it computes from parameters alone (`compiled.from_parameters`): such a
tensor enters no boundary of the module owning those parameters (the cast is its own code; the
parameters are compared as leaves) and leaves none of calls that own none of them.
"""
from __future__ import annotations

from typing import Any, Literal, NamedTuple, Optional, Union

from .. import ops
from ..store.records import iter_tensors
from ..store.schema import CompiledFacts, Descriptor, Kind, Phase, Record, Role, compiled_facts, module_path
from ..store.schema import is_inductor as by_inductor   # (the one predicate: store/schema.py)
from .graph import RunGraph

_RESHAPES = frozenset({"Torch.view.default", "Torch._unsafe_view.default",
                       "Torch.reshape.default"})


def inside(path: str, module: str) -> bool:
    return path == "" or module == path or module.startswith(path + ".")


def _shape(desc: object) -> Optional[tuple[int, ...]]:
    if not isinstance(desc, dict) or desc.get("type") != "tensor":
        return None
    return tuple(desc.get("shape") or ())


def _tensors(descs: object) -> list[Descriptor]:
    return [d for d in (descs if isinstance(descs, list) else []) if _shape(d) is not None]


def _prefixes(shape: tuple[int, ...]) -> set[int]:
    out, n = set(), 1
    for d in shape:
        n *= d
        out.add(n)
    return out


def flattened(shape: Optional[tuple[int, ...]], golden: Optional[tuple[int, ...]]) -> bool:
    """Whether `shape` and `golden` are one shape with runs of neighbouring dimensions merged
    or split (the [16, 32] an mm of Inductor's wrote for a Linear's [2, 8, 32]; the
    [2, 8, 4, 8] of heads for [2, 8, 32]): the same elements in the same order, never a
    transpose ([32, 16] for [16, 32])."""
    if shape is None or golden is None or shape == golden or 1 in shape or 1 in golden:
        return False
    small, large = sorted((_prefixes(shape), _prefixes(golden)), key=len)
    return max(small, default=0) == max(large, default=0) and small <= large


def unique_shapes(descs: list[Descriptor]) -> bool:
    """Whether no two of `descs` have one shape."""
    shapes = [_shape(d) for d in descs]
    return len(set(shapes)) == len(shapes)


def _same(d: Descriptor, g: Descriptor) -> bool:
    return _shape(d) == _shape(g) or flattened(_shape(d), _shape(g))


def _matched(golden: list[Descriptor], found: list[list[Descriptor]]
             ) -> Optional[list[Descriptor]]:
    """One descriptor of each `found` tensor (each has one or more spellings: itself, the
    reshape that alone reads it) in the order of `golden`'s descriptors, matched by shape (or
    that shape flattened, `flattened`: the descriptor then takes the golden shape and says the
    one it was saved in); None unless each golden shape is unique and met by exactly one found
    tensor, and none is left."""
    if len(golden) != len(found) or not golden:
        return None
    out = []
    for g in golden:
        # (the shape itself first: a regrouped spelling only where no tensor has it)
        same = [d for ways in found for d in ways[:2] if _shape(d) == _shape(g)] or \
            [d for ways in found for d in ways[:2] if _same(d, g)]
        if len(same) != 1 or sum(_shape(x) == _shape(g) for x in golden) != 1:
            return None
        d = same[0]
        if _shape(d) != _shape(g):
            d = d.copy()
            d["shape"], d["saved_shape"] = list(_shape(g) or ()), same[0].get("shape")
        out.append(d)
    return out


def modules_of(r: Record) -> Optional[list[str]]:
    """The modules of the nodes a compiled record computes: an FX node's one (`module`), or
    those of every node an Inductor call fuses (`modules`, capture/kernel_modules.py)."""
    facts = r.get("compiled") or {}
    if isinstance(facts.get("module"), str):
        return [facts["module"]]
    found = facts.get("modules")
    if isinstance(found, list) and found and all(isinstance(m, str) for m in found):
        return found
    return None


def _unplaced(r: Record) -> bool:
    """An Inductor call that names no module (its wrapper generated while opdiff did not
    record): where it belongs is unknown, so no module call made of compiled records is
    proven."""
    return by_inductor(r) and modules_of(r) is None


def module_calls(target: list[Record], golden: list[Record],
                 graph: Optional[RunGraph] = None) -> list[Record]:
    """`target` with a module record added after the compiled ops of each golden forward module
    call whose boundary corresponds (see the module docstring). graph: the target's
    (`graph.RunGraph`), when the caller has it."""
    calls = [r for r in target if r["kind"] in Kind.OPS and r["phase"] == Phase.FORWARD
             and r.get("compiled")]
    compiled = [r for r in calls if modules_of(r) is not None]
    if not compiled or any(_unplaced(r) for r in calls):
        return target
    names = {r["name"] for r in target}
    by_seq = (graph or RunGraph(target)).by_seq
    forward = [g for g in golden if g["kind"] == Kind.MODULE and g["phase"] == Phase.FORWARD]
    count: dict[str, int] = {}
    for g in forward:
        count[g["op"]] = count.get(g["op"], 0) + 1
    after: dict[int, list[Record]] = {}
    for g in forward:
        if count[g["op"]] != 1 or g["name"] in names:
            continue
        made = _module_call(g, compiled, target, by_seq)
        if made is not None:
            last, record = made
            after.setdefault(last, []).append(record)
    if not after:
        return target
    out: list[Record] = []
    for i, r in enumerate(target):
        out.append(r)
        # (inner modules end first, as eager records them)
        out += sorted(after.get(i, []), key=lambda m: -m["name"].count("."))
    return out


def _module_call(g: Record, compiled: list[Record], target: list[Record],
                 by_seq: dict[int, Record]) -> Optional[tuple[int, Record]]:
    path = module_path(g["op"])
    members, straddle = [], False
    for r in compiled:
        within = [inside(path, m) for m in modules_of(r) or ()]
        if all(within):
            members.append(r)
        elif any(within):
            straddle = True
    # a call fusing nodes inside and outside the module (a kernel of its last op and the
    # residual add after it): the module's outputs are never written; its parent is judged
    # (or the smallest span of module calls that closes the call: compiled_spans.py)
    if straddle:
        return None
    found = boundary(members, target, by_seq)
    if found is None:
        return None
    inputs = _matched(_tensors(g.get("inputs")), [[d] for d in found.entering])
    outputs = _matched(_tensors(g.get("outputs")), [ways for ways, _ in found.leaving])
    if inputs is None or outputs is None:
        return None
    return compiled_record(g, members, target, inputs, outputs, {"module": path})


class Boundary(NamedTuple):
    """What a set of compiled calls reads from outside it and what it hands out."""
    entering: list[Descriptor]      # one descriptor per tensor read from outside
    # per tensor read outside: its spellings (itself, the one reshape that alone reads it)
    # and the modules of the calls that read it
    leaving: list[tuple[list[Descriptor], set[str]]]
    unmade: frozenset[int] = frozenset()    # entering tensors whose maker is not recorded
    made_by: tuple[Any, ...] = ()   # per entering tensor: its maker's seq (None: an input)


def boundary(members: list[Record], target: list[Record], by_seq: dict[int, Record],
             unmade: bool = False) -> Optional[Boundary]:
    """The boundary of the compiled calls `members` by the target's dataflow (the module
    docstring), or None where it is not known: no member, a member without a seq, one that
    draws random numbers, a tensor read whose maker is not recorded (with `unmade`, such a
    tensor enters instead, its index in `Boundary.unmade`: the graph's input, which the caller
    pairs only with the model's input)."""
    seqs = {r["seq"] for r in members}
    if not members or None in seqs or any(_random(r["op"]) for r in members):
        return None     # (a random draw, dropout in training: eager's and the graph's differ)
    # (seq, slot) made outside -> its descriptor; ("input", fqn), ("unmade", id) for the others
    reads: dict[tuple[Union[int, str], Union[int, str]], Descriptor] = {}
    for r in members:
        for _, role, d in iter_tensors(r):
            if role == Role.OUTPUT or d.get("leaf") in ("parameter", "buffer") or \
                    d.get("overwritten") or d.get("uninitialized"):
                continue        # (a buffer an Inductor kernel is handed to write, not read)
            if d.get("leaf") == "input" and d.get("fqn"):
                reads.setdefault(("input", d["fqn"]), d)
                continue
            made = d.get("producer")
            if not made and not unmade:
                return None     # a tensor whose maker is not recorded: the boundary is unknown
            if not made:
                reads.setdefault(("unmade", id(d)), d)
            elif made[0] not in seqs:
                if _own_parameters(by_seq.get(made[0]), made[1], members):
                    continue    # (a cast of the members' own weight, made in another's kernel)
                source = _output(by_seq.get(made[0]), made[1])
                if source is None:
                    return None
                reads.setdefault((made[0], made[1]), source)
    # a reshape of the module's input that another module reads too (the compiler shares one
    # `view` of `x` between gate_proj and up_proj) is that input, not an output
    passed = {r["seq"] for r in members if r["op"] in _RESHAPES and all(
        (d.get("producer") or [None])[0] not in seqs
        for _, role, d in iter_tensors(r) if role != Role.OUTPUT)}
    readers: dict[tuple[int, int], list[Record]] = {}      # (seq, slot) made inside -> who outside reads it
    for r in target:
        # (AOT's runtime detaches the activations the backward graph saves, after the graph)
        if r["seq"] in seqs or (r["op"] == "Tensor.detach" and not r.get("compiled")):
            continue
        for _, role, d in iter_tensors(r):
            made = d.get("producer") if role != Role.OUTPUT else None
            if made and made[0] in seqs and made[0] not in passed:
                readers.setdefault((made[0], made[1]), []).append(r)
    leaving: list[tuple[list[Descriptor], set[str]]] = []
    for (seq, slot), who in readers.items():
        if _foreign_parameters(by_seq.get(seq), slot, members):
            continue    # (a cast of another module's weight, fused into a member's kernel)
        source = _output(by_seq.get(seq), slot)
        if source is None:
            return None
        # read only by one reshape outside (the compiler put a Linear's `view` back to the
        # batch shape in the parent module): the module's output is that reshape's, the same
        # elements in the shape the eager module returned
        reshaped = _output(who[0], 0) if len(who) == 1 and who[0]["op"] in _RESHAPES else None
        leaving.append(([source] + ([reshaped] if reshaped is not None else []),
                        _read_by(who, target, seqs)))
    return Boundary(list(reads.values()), leaving,
                    frozenset(i for i, key in enumerate(reads) if key[0] == "unmade"),
                    tuple(None if key[0] in ("input", "unmade") else key[0] for key in reads))


def _parameters_of(record: Optional[Record], slot: Union[int, str]) -> Optional[list[str]]:
    """The modules of the parameters an Inductor call's output `slot` is computed from alone
    (`compiled.from_parameters`, capture/inductor.py), or None where it reads anything else."""
    for entry in compiled_facts(record).get("from_parameters") or ():
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == slot and entry[1]:
            return [str(fqn).rsplit(".", 1)[0] if "." in str(fqn) else "" for fqn in entry[1]]
    return None


def _own_parameters(record: Optional[Record], slot: Union[int, str], members: list[Record]) -> bool:
    """Whether a tensor the members read is computed from parameters alone, each of a module
    the members' own code runs in (autocast's weight cast, done in eager inside that module's
    call: the parameters are compared as leaves, the cast is the call's own code)."""
    owners = _parameters_of(record, slot)
    mine = {m for r in members for m in modules_of(r) or ()}
    return owners is not None and all(o in mine for o in owners)


def _foreign_parameters(record: Optional[Record], slot: Union[int, str], members: list[Record]) -> bool:
    """Whether a tensor the members hand out is computed from parameters alone, none of a
    module the members' own code runs in (another module's weight cast, fused into a kernel of
    the members): not data the members compute."""
    owners = _parameters_of(record, slot)
    mine = {m for r in members for m in modules_of(r) or ()}
    return owners is not None and not any(o in mine for o in owners)


def _read_by(who: list[Record], target: list[Record], seqs: set[Optional[int]]) -> set[str]:
    """The modules of the compiled calls that read a tensor (through one reshape: its readers)."""
    out: set[str] = set()
    for r in who:
        out.update(modules_of(r) or ())
        if r["op"] in _RESHAPES and r["seq"] is not None:
            out.update(m for x in target if x["seq"] not in seqs for _, role, d in
                       iter_tensors(x) if role != Role.OUTPUT and
                       (d.get("producer") or [None])[0] == r["seq"] for m in modules_of(x) or ())
    return out


def compiled_record(g: Record, members: list[Record], target: list[Record],
                    inputs: list[Descriptor], outputs: list[Descriptor],
                    facts_added: CompiledFacts) -> tuple[int, Record]:
    """The target's record of the golden module (or span) call `g`, made of the compiled calls
    `members` with those boundary descriptors, and the index of the last member in `target`
    (the record goes after it)."""
    seqs = {r["seq"] for r in members}
    last = max(i for i, r in enumerate(target) if r["seq"] in seqs)
    first = next(r for r in target if r["seq"] in seqs)
    facts = first["compiled"].copy()
    facts.pop("modules", None)
    kernels = [r for r in members if r["kind"] == Kind.KERNEL]
    if kernels:     # Inductor: the generated kernels it ran, the first one's user line
        node = kernels[0]["compiled"].get("node")
        if node is not None:
            facts["node"] = node
        else:
            facts.pop("node", None)
        facts["kernels"] = list(dict.fromkeys(str(r["compiled"].get("node")) for r in kernels))
        facts.pop("source", None)
        if kernels[0]["compiled"].get("source"):
            facts["source"] = kernels[0]["compiled"]["source"]
    record = g.copy()
    for field in _CALL_FIELDS:
        record.pop(field, None)
    record["inputs"] = [_strip(d) for d in inputs]
    record["outputs"] = [_strip(d) for d in outputs]
    record["kwargs"], record["parameters"] = {}, {}
    record["seq"], record["stack"] = None, first.get("stack")
    # (where the call's compiled ops begin: its first node, the user's line)
    record["compiled"] = facts
    facts.update(facts_added)
    return last, record


# The fields of a golden module call its compiled twin has its own of.
_CALL_FIELDS: tuple[Literal["inputs", "outputs", "kwargs", "seq", "stack", "parameters"], ...] = (
    "inputs", "outputs", "kwargs", "seq", "stack", "parameters")


_DRAWS = ("rand", "bernoulli", "dropout")     # (in an Inductor kernel's name: the ops it fuses)


def _random(op: str) -> bool:
    """Whether a compiled op draws random numbers (`Torch.native_dropout.default` is the aten
    op `Aten.native_dropout.default`; an Inductor kernel whose name lists a random op)."""
    if op.startswith("Inductor."):
        return any(word in op for word in _DRAWS)
    return ops.traits("Aten." + op.split(".", 1)[1] if op.startswith("Torch.") else op).random


def _output(record: Optional[Record], slot: Union[int, str]) -> Optional[Descriptor]:
    outs = record.get("outputs") if record is not None else None
    if not isinstance(outs, list) or not isinstance(slot, int) or not 0 <= slot < len(outs):
        return None
    d = outs[slot]
    return d if _shape(d) is not None else None


def _strip(desc: Descriptor) -> Descriptor:
    """A boundary descriptor as the module call's own (its maker is not one of the module's)."""
    own = desc.copy()
    own.pop("producer", None)
    return own


__all__ = ["by_inductor", "Boundary", "boundary", "compiled_record", "flattened", "inside", "module_calls",
           "modules_of", "unique_shapes"]
