"""Pass one over the ranks of a group: how each recorded tensor is laid out (`GroupPlan`).

The ranks of a tensor-parallel group run the same ops in the same order, so their k-th records
are one logical call. For each tensor of each call the plan decides a `Layout`, from (first
found wins):

1. the DTensor placement capture recorded (`placement`);
2. the record that made it (`producer`, through the layout ops below), or for a backward
   record the forward call's tensor it is the gradient of;
3. for a forward output, its inputs: all replicated makes it replicated; an output shaped like
   its one sharded input (an elementwise op) is sharded like it;
4. an earlier output holding the same values on every rank (a collective's result that its
   reader got through a view capture does not see);
5. every rank holding the same values: replicated.

Otherwise it is `UNKNOWN`, and not judged. Layout ops are left out of the logical run:
DTensor's own views (`Tensor.view_as` of a tensor as itself: `to_local`, `from_local`) and the
group's collectives (an all-reduce's result is the sum of its partial inputs: its readers read
that sum; its statistics are the sum's, exact where the partials' cannot be merged).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence, cast

from ...store.records import iter_tensors, producer_of
from ...store.schema import Descriptor, Kind, Phase, Record, RecordName, Statistics
from ...store.source import DumpSource
from . import fsdp, held, mesh, redistribute, statistics
from .statistics import Signature
from .declared import DeclaredSource
from .placement import (PARTIAL, REPLICATE, REPLICATED, SHARD, UNKNOWN_LAYOUT, Layout, Unsupported,
                        coordinate, from_placement)

# collectives whose result is the whole of what their inputs are pieces of
_GATHERING = ("Distributed.all_reduce", "Distributed.all_gather_into_tensor",
              "Distributed.all_gather", "Distributed.all_gather_tensor")
_RECENT = 64          # outputs looked back at for a tensor found by its values (rule 4)

Slot = tuple[int, str]      # (seq, output slot)


def tensor_slots(record: Record) -> Iterator[tuple[str, str, Descriptor]]:
    """(role, path within the role, descriptor) of every tensor of a record; path is the
    part of the tensor's name after its role (`0`, `0.1`, `weight`)."""
    for name, role, desc in iter_tensors(record):
        yield role, name.split(f".{role}.", 1)[-1] if f".{role}." in name else \
            name.rsplit(".", 1)[-1], desc


@dataclass
class GroupPlan:
    """What pass one decided for a group of ranks' dumps of one step."""

    ranks: list[int]
    mode: str = "tensor"           # "tensor": DTensor placements; "data": batch split over ranks
    weights: list[float] = field(default_factory=list)     # data: each rank's share of the batch
    wrapper: str = ""              # data: DDP's `module.` before every parameter's name, dropped
    dropped: set[int] = field(default_factory=set)                 # record positions left out
    layouts: dict[tuple[int, str, str], Layout] = field(default_factory=dict)  # (pos, role, path)
    order: list[int] = field(default_factory=list)                 # piece order: rank indices
    alias: dict[Slot, Slot] = field(default_factory=dict)          # a layout op's output -> source
    reduced: dict[Slot, Statistics] = field(default_factory=dict)   # a partial's summed stats
    renamed: dict[str, str] = field(default_factory=dict)          # record names renumbered
    replicas: list[str] = field(default_factory=list)              # replicas that differ: findings
    differing: list[tuple[str, int, int]] = field(default_factory=list)  # (tensor, rank, against)
    gathers: int = 0                # FSDP2's parameter all-gather ops left out (`fsdp.py`)
    moves: int = 0                  # DTensor's reorders around collectives (`redistribute.py`)
    unknown: int = 0
    merged: dict[str, int] = field(default_factory=dict)           # how many tensors, by layout
    kept: int = 0
    # FSDP2: a reader's position -> [(its input's path, the gathered parameter's fqn)]
    leaves: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    outputs: dict[Slot, int] = field(default_factory=dict)   # an unknown output's position
    # leaves read first by a layout op (DDP x TP's `from_local` of every parameter up front):
    # moved to just before the op that reads the DTensor made of them (`held`)
    deferred: dict[int, int] = field(default_factory=dict)   # leaf pos -> its reader's pos
    reader_of: dict[int, str] = field(default_factory=dict)  # leaf pos -> its reader's name
    tags: dict[int, list[tuple[str, str, str]]] = field(default_factory=dict)  # pos -> (path,
    #                                                          leaf kind, fqn) of inputs read
    leaf_slots: dict[tuple[Signature, ...], list[tuple[int, Slot, str, str]]] = field(
        default_factory=dict)                                # leaves by their values
    fqn_slot: dict[str, Slot] = field(default_factory=dict)  # a parameter's leaf output
    dropped_names: set[str] = field(default_factory=set)
    leaf_reader: dict[int, str] = field(default_factory=dict)   # leaf pos -> its first reader

    def resolve(self, slot: Optional[Slot]) -> Optional[Slot]:
        seen = 0
        while slot is not None and slot in self.alias and seen < 10_000:
            slot, seen = self.alias[slot], seen + 1
        return slot


def _is_self_view(rec: Record) -> bool:
    """DTensor's to_local/from_local: `Tensor.view_as` of a tensor shaped like itself."""
    if rec.get("op") != "Tensor.view_as" or rec.get("kind") != Kind.API:
        return False
    shapes = [d.get("shape") for _, _, d in iter_tensors(rec)]
    return len(shapes) >= 2 and all(s == shapes[0] for s in shapes)


def _group_collective(rec: Record, ranks: Sequence[int]) -> bool:
    group = rec.get("group")
    return (isinstance(group, dict) and str(rec["op"]).startswith("Distributed.")
            and "peer" not in group and sorted(group.get("ranks") or []) == sorted(ranks))


def plan_group(sources: Sequence[DumpSource]) -> GroupPlan:
    """Pass one over the ranks' records (streamed, all ranks in step); `Unsupported` when they
    are not one logical run this package can merge."""
    ranks = [int(s.rank if s.rank is not None else i) for i, s in enumerate(sources)]
    plan = GroupPlan(ranks=ranks, order=list(range(len(sources))))
    weights = _batch_shares(sources)
    if weights is not None:
        plan.mode, plan.weights = "data", weights
    out_layout: dict[Slot, Layout] = {}
    forward_layouts: dict[str, dict[tuple[str, str], Layout]] = {}
    dropped_names = plan.dropped_names
    recent: list[tuple[tuple[Signature, ...], Slot]] = []
    counters: dict[str, int] = {}
    placed = False
    fqns: list[str] = []
    gather, moves = _layout_ops(sources[0])
    plan.gathers, plan.moves = len(gather), len(moves)
    # a layout file's run (`declared.py`): its self-views are its own ops (autograd Functions
    # returning their input), not DTensor's to_local/from_local
    views = not any(isinstance(s, DeclaredSource) for s in sources)
    reads: list[fsdp.Read] = []                  # FSDP2: inputs that may be whole parameters
    sharded: list[fsdp.Sharded] = []
    gathered: set[Slot] = set()                  # FSDP2: its gathers' outputs (a DTensor's view)
    iters = [iter(s.records()) for s in sources]
    pos = -1
    while True:
        got = [next(it, None) for it in iters]
        if all(r is None for r in got):
            break
        pos += 1
        if any(r is None for r in got):
            short = [ranks[i] for i, r in enumerate(got) if r is None]
            raise Unsupported(f"rank(s) {short} recorded fewer ops than rank {ranks[0]}")
        recs = [r for r in got if r is not None]
        first = recs[0]
        assert first is not None
        for i, r in enumerate(recs[1:], 1):
            if r is not None and r.get("name") != first.get("name"):
                raise Unsupported(f"rank {ranks[i]} ran {r.get('name')} where rank {ranks[0]} "
                                  f"ran {first.get('name')} (record {pos})")
        found_seq = first.get("seq")
        seq: int = found_seq if isinstance(found_seq, int) else pos
        name = str(first.get("name"))
        if first.get("phase") == Phase.BACKWARD and first.get("forward") in dropped_names:
            plan.dropped.add(pos)
            continue
        if pos in gather:                # FSDP2 gathering a module's parameters (fsdp.py)
            plan.dropped.add(pos)
            dropped_names.add(name)
            out_layout[(seq, "0")] = REPLICATED
            gathered.add((seq, "0"))
            continue
        if (views and _is_self_view(first)) or _group_collective(first, ranks) or pos in moves:
            plan.dropped.add(pos)
            dropped_names.add(name)
            _drop(plan, first, recs, seq, out_layout)
            continue
        plan.kept += 1
        if first.get("kind") == Kind.LEAF and first.get("leaf") in ("parameter", "buffer"):
            fqns.append(str(first.get("tensor", "")))
        parsed = RecordName.parse(name)
        if parsed is not None and first.get("phase") == Phase.FORWARD:
            idx = counters.get(parsed.op, 0)
            counters[parsed.op] = idx + 1
            if idx != parsed.index:
                plan.renamed[name] = RecordName(parsed.op, parsed.phase, idx, parsed.kind).text
        if gather and first.get("phase") == Phase.FORWARD and first.get("kind") != Kind.LEAF:
            reads.extend(fsdp.Read(pos, path, list(d.get("shape") or []), d.get("stats"))
                         for role, path, d in tensor_slots(first) if role == "input"
                         and producer_of(d) in (None, *gathered) and "leaf" not in d
                         and d.get("shape"))
        backward_of = forward_layouts.get(str(first.get("forward"))) \
            if first.get("phase") == Phase.BACKWARD else None
        mine: dict[tuple[str, str], Layout] = {}
        per_rank = [list(tensor_slots(r)) for r in recs if r is not None]
        for j, (role, path, _) in enumerate(per_rank[0]):
            # (a rank short of this slot: an empty descriptor, with no shape, placement or stats)
            descs = mesh.project([p[j][2] if j < len(p) else cast(Descriptor, {}) for p in per_rank])
            desc = descs[0]
            layout = _decide(plan, descs, role, path, first, mine, out_layout, backward_of,
                             recent, seq, pos)
            if from_placement(desc) is not None:
                placed = True
                c = [x for x in (coordinate(d) for d in descs) if x is not None]
                if len(c) == len(descs) and sorted(c) == list(range(len(c))):
                    plan.order = sorted(range(len(c)), key=lambda i: c[i])
            plan.layouts[(pos, role, path)] = layout
            if gather and first.get("leaf") == "parameter" and layout.kind == SHARD:
                sharded.append(_sharded(plan, pos, first, descs, layout))
            mine[(role, path)] = layout
            plan.merged[layout.kind] = plan.merged.get(layout.kind, 0) + 1
            if layout.kind == REPLICATE:
                for i, d in enumerate(descs[1:], 1):
                    if not statistics.same(descs[0].get("stats"), d.get("stats")):
                        plan.replicas.append(
                            f"rank {ranks[i]}'s copy of {name}.{role}.{path} differs from rank "
                            f"{ranks[0]}'s (a replica that should be equal)")
                        plan.differing.append((f"{name}.{role}.{path}", ranks[i], ranks[0]))
                        break
            if role == "output":
                out_layout[(seq, path)] = layout
                if layout.kind == "unknown":
                    plan.outputs[(seq, path)] = pos
                if first.get("kind") == Kind.LEAF:
                    plan.leaf_reader[pos] = str(first.get("reader"))
                    held.leaf(plan, pos, (seq, path), first, descs)
                recent.append((tuple(statistics.signature(d) for d in descs), (seq, path)))
        del recent[:-_RECENT]
        if first.get("phase") == Phase.FORWARD:
            forward_layouts[name] = mine
    if reads and sharded:
        _name_gathered(plan, reads, sharded)
    if plan.mode == "data" and fqns and all(f.startswith("module.") for f in fqns):
        plan.wrapper = "module."      # DistributedDataParallel's: the model's own names
    if not placed and plan.mode != "data":
        raise Unsupported("no DTensor placement is recorded in it, and its ranks' inputs are "
                          "the same (not a batch split between them)")
    plan.unknown = plan.merged.get("unknown", 0)
    return plan


def _sharded(plan: GroupPlan, pos: int, first: Record, descs: list[Descriptor],
             layout: Layout) -> fsdp.Sharded:
    """An optimizer-time parameter leaf of FSDP2 (a `Shard(0)` DTensor), merged whole."""
    shapes = [list(descs[i].get("shape") or []) for i in plan.order]
    whole = list(shapes[0])
    if layout.dim < len(whole):
        whole[layout.dim] = sum(s[layout.dim] for s in shapes if layout.dim < len(s))
    stats = statistics.merge_shards([descs[i].get("stats") for i in plan.order],
                                    [_numel(s) for s in shapes])
    return fsdp.Sharded(pos, str(first.get("tensor", "")), whole, stats)


def _name_gathered(plan: GroupPlan, reads: list[fsdp.Read],
                   sharded: list[fsdp.Sharded]) -> None:
    """FSDP2's gathered parameters get their leaf records where the one-device run records
    them; the optimizer step's leaves of their shards are left out (the same values, seen)."""
    for read, param in fsdp.name_gathered(reads, sharded):
        plan.leaves.setdefault(read.pos, []).append((read.path, param.fqn))
        plan.dropped.add(param.pos)
        plan.kept -= 1
        plan.merged[SHARD] = plan.merged.get(SHARD, 0) - 1
        plan.merged[REPLICATE] = plan.merged.get(REPLICATE, 0) + 1
    plan.kept += sum(len(v) for v in plan.leaves.values())


def _layout_ops(source: DumpSource) -> tuple[set[int], set[int]]:
    """Positions of FSDP2's parameter all-gathers (`fsdp.py`) and of DTensor's redistribution
    ops around collectives (`redistribute.py`) in one rank's records (one pass)."""
    gather, moves = fsdp.Unshards(), redistribute.Finder()
    for pos, rec in enumerate(source.records()):
        gather.feed(pos, rec)
        moves.feed(pos, rec)
    return gather.positions, moves.positions


def _drop(plan: GroupPlan, first: Record, recs: list[Record], seq: int,
          out_layout: dict[Slot, Layout]) -> None:
    """A layout op left out: its output stands for its input (a view) or for the whole its
    inputs are pieces of (a gathering collective)."""
    ins = [d for _, role, d in iter_tensors(first) if role == "input"]
    src = plan.resolve(producer_of(ins[0])) if ins else None
    op = str(first.get("op"))
    slots = [path for role, path, _ in tensor_slots(first) if role == "output"] or ["0"]
    for slot in slots:
        if src is not None:
            plan.alias[(seq, slot)] = src
        if op.startswith("Distributed."):
            out_layout[(seq, slot)] = REPLICATED
        elif ins:
            p = producer_of(ins[0])
            out_layout[(seq, slot)] = out_layout.get(p, UNKNOWN_LAYOUT) if p else UNKNOWN_LAYOUT
    if src is None or not op.startswith("Distributed."):
        return
    if op in _GATHERING:
        outs = [d for _, role, d in iter_tensors(first) if role == "output"]
        stats = outs[0].get("stats") if outs else None
        if stats is not None:
            plan.reduced[src] = stats
    elif "reduce_scatter" in op:     # the ranks' outputs are the pieces of the whole sum
        pieces = [[d for _, role, d in iter_tensors(r) if role == "output"][:1] for r in recs]
        if all(pieces):
            found = statistics.merge_shards([p[0].get("stats") for p in pieces],
                                            [_numel(p[0].get("shape") or []) for p in pieces])
            if found is not None:
                plan.reduced[src] = found


def _decide(plan: GroupPlan, descs: list[Descriptor], role: str, path: str,
            first: Record, mine: dict[tuple[str, str], Layout],
            out_layout: dict[Slot, Layout], backward_of: Optional[dict[tuple[str, str], Layout]],
            recent: list[tuple[tuple[Signature, ...], Slot]], seq: int,
            pos: int) -> Layout:
    placed = [from_placement(d) for d in descs]
    if placed[0] is not None and role == "input" and producer_of(descs[0]) is None:
        held.from_local(plan, descs, placed[0], out_layout, recent, pos, path, first)
    if role == "input" and placed[0] is None and producer_of(descs[0]) is None:
        found = held.read(plan, descs, first, mine, out_layout)
        if found is not None:
            return found
    if plan.mode == "data" and placed[0] is None:
        found = _data_layout(descs, role, first, mine, backward_of)
        if found is not None:
            return found
    if placed[0] is not None:
        if any(p != placed[0] for p in placed):
            raise Unsupported(f"{first.get('name')}: ranks hold {role} {path} placed unlike "
                              f"each other")
        return placed[0]
    if role == "input" and first.get("phase") == Phase.FORWARD:
        src = producer_of(descs[0])
        if src is not None:
            found = out_layout.get(src)
            if found is not None and found.kind != "unknown":
                return found
    if backward_of is not None:
        twin = {"input": "output", "output": "input"}.get(role)
        found = backward_of.get((twin, path)) if twin else None
        if found is not None and found.kind != "unknown":
            return _twin_in_data(found) if plan.mode == "data" else found
    if role == "output" and first.get("phase") == Phase.FORWARD:
        found = _propagated(descs, mine)
        if found is not None:
            return found
    key = tuple(statistics.signature(d) for d in descs)
    if descs[0].get("stats") is not None:
        for earlier, slot in reversed(recent):
            if earlier == key and slot[0] != seq:
                found = out_layout.get(slot)
                if found is not None and found.kind != "unknown":
                    return found
    if all(statistics.signature(d) == key[0] for d in descs) and \
            descs[0].get("stats") is not None:
        return REPLICATED
    return UNKNOWN_LAYOUT


_MEAN_LOSSES = ("mean", "mse_loss", "l1_loss", "cross_entropy", "nll_loss", "smooth_l1_loss",
                "binary_cross_entropy", "binary_cross_entropy_with_logits", "huber_loss")


def _batch_shares(sources: Sequence[DumpSource]) -> Optional[list[float]]:
    """Each rank's share of the global batch when the ranks were given different inputs of one
    shape but dim 0 (data parallel: the batch split between them); None otherwise."""
    found: list[Descriptor] = []
    for source in sources:
        seen: Optional[Descriptor] = None
        for i, rec in enumerate(source.records()):
            if seen is None and rec.get("kind") == Kind.LEAF and rec.get("leaf") == "input" \
                    and rec.get("outputs"):
                seen, i0 = rec["outputs"][0], i
                found.append(seen)
            elif seen is not None and any(
                    _splits(d) and statistics.signature(d) == statistics.signature(seen)
                    for _, role, d in iter_tensors(rec) if role == "input"):
                return None           # the input is a DTensor's local piece: its placement says
            if i > 500 or (seen is not None and i > i0 + _RECENT):
                break
    if len(found) != len(sources) or any("placement" in d for d in found):
        return None
    shapes = [list(d.get("shape") or []) for d in found]
    if not shapes[0] or any(len(s) != len(shapes[0]) or s[1:] != shapes[0][1:] for s in shapes):
        return None
    if all(statistics.signature(d) == statistics.signature(found[0]) for d in found):
        return None                   # the same input on every rank: not a batch split
    total = sum(s[0] for s in shapes)
    return [s[0] / total for s in shapes] if total else None


def _splits(desc: Descriptor) -> bool:
    """A DTensor placement that splits the tensor (a replicated DTensor made of the input, as
    tensor parallelism makes of each data-parallel rank's batch, does not)."""
    placed = desc.get("placement")
    names = placed.get("placements") if isinstance(placed, dict) else None
    return isinstance(names, list) and any(str(n) not in ("R", "Replicate()") for n in names)


def _data_layout(descs: list[Descriptor], role: str, first: Record,
                 mine: dict[tuple[str, str], Layout],
                 backward_of: Optional[dict[tuple[str, str], Layout]]) -> Optional[Layout]:
    """Data parallel: the batch is dim 0 of what the inputs made, parameters are replicas, and
    a mean loss over each rank's part of the batch makes each rank's gradients its share's
    multiple of the whole batch's: activation gradients are shards scaled by the share,
    parameter gradients partial means weighted by it, the loss's own gradient a replica."""
    if first.get("kind") == Kind.LEAF:
        return Layout.shard(0) if first.get("leaf") == "input" else REPLICATED
    if backward_of is not None:
        return None                   # the forward twin's (`_twin_in_data`, in `_decide`)
    if role == "output" and first.get("phase") == Phase.FORWARD:
        ins = [layout for (r, _), layout in mine.items() if r == "input"]
        shape = descs[0].get("shape") or []
        if any(x.kind == SHARD and x.dim == 0 for x in ins) and _numel(shape) == 1:
            op = str(first["op"]).rsplit(".", 1)[-1]
            if op in _MEAN_LOSSES:
                return Layout.partial("avg")
            if op == "sum":
                return Layout.partial("sum")
    return None


def _twin_in_data(layout: Layout) -> Layout:
    """The layout of a gradient whose forward tensor is laid out `layout` (data parallel)."""
    if layout.kind == SHARD:
        return Layout(SHARD, layout.dim, scaled=True)
    if layout.kind == REPLICATE:
        return Layout.partial("avg")
    if layout.kind == PARTIAL:
        return REPLICATED
    return layout


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for x in shape:
        n *= int(x)
    return n


def _propagated(descs: list[Descriptor], mine: dict[tuple[str, str], Layout]
                ) -> Optional[Layout]:
    """An output's layout from its record's inputs (`mine`, decided already)."""
    ins = [layout for (role, _), layout in mine.items() if role == "input"]
    if not ins:
        return None
    if all(layout.kind == REPLICATE for layout in ins):
        return REPLICATED
    shards = {layout for layout in ins if layout.kind == SHARD}
    others = [layout for layout in ins if layout.kind not in (SHARD, REPLICATE)]
    if len(shards) == 1 and not others:
        layout = next(iter(shards))
        ndim = len(descs[0].get("shape") or ())
        if layout.dim < ndim:
            return layout
    if any(layout.kind == PARTIAL for layout in ins):
        return None
    return None


__all__ = ["GroupPlan", "plan_group", "tensor_slots", "Layout"]
