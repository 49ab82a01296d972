"""A group of ranks' dumps of one step read as the one-device run they split (`MergedSource`).

    merged = MergedSource(rank_dumps)          # pass one (`plan.plan_group`) runs here
    for record in merged.records():            # streamed: the ranks' k-th records at a time
        ...                                    # each tensor the logical, whole one
    merged.tensor(desc["key"])                 # pieces joined on demand (cat, sum or rank 0's)
    desc["pieces"]                             # [{"rank", "shape", "offset"}]: where it came from

A merged descriptor has the logical tensor's shape and statistics (`statistics.merge_shards`,
exact; a partial sum's are its all-reduce's result where one was recorded, else unknown), no
`placement`, and `"pieces"` and `"layout"` saying what it was made of; its producer is the
logical run's. Layout ops (`plan.py`) are left out and the records after them renumbered.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterator, Literal, Optional, Sequence, cast

from ...store.records import producer_of, producer_ref
from ...store.schema import Descriptor, RankPiece, Record
from ...store.source import DumpSource
from . import mesh, statistics
from .fsdp import as_leaf
from .placement import PARTIAL, REPLICATE, REPLICATED, SHARD, UNKNOWN, Layout
from .plan import GroupPlan, plan_group, tensor_slots


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


class RankGroup:
    """Several ranks' dumps of one step, in rank order, standing as one logical `DumpSource`:
    its path, step, rank and meta are its first rank's (the meta copied, to say how it was
    made under "logical"). ordered: the sources are in their order already (pipeline stages a
    layout file names), not to be sorted by rank."""

    format = "opdiff"

    def __init__(self, sources: Sequence[DumpSource], ordered: bool = False):
        self.sources = list(sources) if ordered else \
            sorted(sources, key=lambda s: s.rank if s.rank is not None else -1)
        first = self.sources[0]
        self.path: Path = first.path
        self.step = first.step
        self.rank = first.rank
        self.meta: dict[str, Any] = dict(first.meta)


class MergedSource(RankGroup):
    """One step of a group of ranks, as one logical `DumpSource` (see the module docstring)."""

    def __init__(self, sources: Sequence[DumpSource]):
        super().__init__(sources)
        self.plan: GroupPlan = plan_group(self.sources)
        self.meta["logical"] = {"ranks": self.plan.ranks, "merged": dict(self.plan.merged)}
        # merged key -> (kind, dim, [(rank index, key)], [coefficient per piece])
        self._recipes: dict[str, tuple[str, int, list[tuple[int, str]], list[float]]] = {}
        self._pieces: dict[str, list[RankPiece]] = {}

    # -- DumpSource -----------------------------------------------------------------------------
    @property
    def holds_tensors(self) -> bool:
        return all(s.holds_tensors for s in self.sources)

    def record_count(self) -> int:
        return self.plan.kept

    def stack(self, stack_id: Optional[int]) -> list[dict[str, Any]]:
        return self.sources[0].stack(stack_id)

    def tensor_keys(self) -> list[str]:
        if not self._recipes:
            for _ in self.records():
                pass
        return list(self._recipes)

    def tensor(self, key: str) -> Any:
        recipe = self._recipes.get(key)
        if recipe is None:
            return None
        import torch

        kind, dim, parts, coefficients = recipe
        loaded = [self.sources[i].tensor(k) for i, k in parts]
        if any(t is None for t in loaded):
            return None
        if any(c != 1.0 for c in coefficients) and kind in (SHARD, PARTIAL):
            loaded = [t * c for t, c in zip(loaded, coefficients)]
        if kind == SHARD:
            return torch.cat(loaded, dim=dim)
        if kind == PARTIAL:
            total = loaded[0].clone()
            for t in loaded[1:]:
                total += t
            return total
        return loaded[0]

    def records(self) -> Iterator[Record]:
        plan = self.plan
        iters = [iter(s.records()) for s in self.sources]
        pos = -1
        waiting: dict[int, list[Record]] = {}      # leaves moved to their reader
        while True:
            got = [next(it, None) for it in iters]
            recs = [r for r in got if r is not None]
            if len(recs) != len(got):
                return
            pos += 1
            if pos in plan.dropped:
                continue
            if pos in plan.deferred:
                leaf = self._merged(pos, recs)
                leaf["reader"] = plan.reader_of[pos]
                waiting.setdefault(plan.deferred[pos], []).append(leaf)
                continue
            yield from waiting.pop(pos, ())
            for path, fqn in plan.leaves.get(pos, ()):    # FSDP2: a gathered parameter
                yield self._leaf(pos, recs, path, fqn)
            yield self._merged(pos, recs)

    # -- the merge ------------------------------------------------------------------------------
    def _merged(self, pos: int, recs: list[Record]) -> Record:
        plan = self.plan
        out: Record = copy.deepcopy(recs[0])
        for field in ("name", "forward", "reader"):
            value = out.get(field)
            if isinstance(value, str) and value in plan.renamed:
                out[field] = plan.renamed[value]
        if plan.wrapper:
            self._unwrapped(out)
        per_rank = [list(tensor_slots(r)) for r in recs]
        targets = list(tensor_slots(out))
        for j, (role, path, desc) in enumerate(targets):
            layout = plan.layouts.get((pos, role, path))
            descs = mesh.project([p[j][2] for p in per_rank])
            self._merge_desc(desc, descs, layout, f"{out['name']}.{role}.{path}",
                             (recs[0].get("seq"), path) if role == "output" else None)
            mesh.carried(descs[plan.order[0]], desc)
            for read, fqn in plan.leaves.get(pos, ()):
                if role == "input" and path == read:  # reads an FSDP2-gathered parameter
                    desc["leaf"], desc["fqn"] = "parameter", fqn
            for read, what, fqn in plan.tags.get(pos, ()):
                if role == "input" and path == read:  # reads a moved leaf (`held.py`)
                    # (a leaf record's own `leaf`, which `record_problem` checked is text)
                    desc["leaf"], desc["fqn"] = cast("Literal['parameter', 'buffer', 'input', 'outside']", what), fqn
        return out

    def _leaf(self, pos: int, recs: list[Record], path: str, fqn: str) -> Record:
        """The leaf record of FSDP2's gathered parameter `fqn`, which record `pos` reads as
        its input `path` (`fsdp.py`): the ranks' copies, replicas of the whole parameter."""
        leaves = []
        for rec in recs:
            desc = next(d for role, p, d in tensor_slots(rec) if role == "input" and p == path)
            leaves.append(as_leaf(rec, desc, fqn))
        out = copy.deepcopy(leaves[0])
        out["reader"] = self.plan.renamed.get(str(out["reader"]), out["reader"])
        descs = mesh.project([r["outputs"][0] for r in leaves])
        self._merge_desc(out["outputs"][0], descs, REPLICATED, f"{out['name']}.output.0", None)
        mesh.carried(descs[self.plan.order[0]], out["outputs"][0])
        return out

    def _unwrapped(self, out: Record) -> None:
        """Parameter names without DDP's `module.` (the one-device model's names)."""
        prefix = self.plan.wrapper
        if out.get("kind") == "leaf" and str(out.get("tensor", "")).startswith(prefix):
            out["tensor"] = out["tensor"][len(prefix):]
            out["name"] = str(out["name"]).replace(f".{prefix}", ".", 1)
            if isinstance(out.get("op"), str):
                out["op"] = out["op"].replace(f".{prefix}", ".", 1)
        for _, _, desc in tensor_slots(out):
            if str(desc.get("fqn", "")).startswith(prefix) and desc.get("leaf") != "input":
                desc["fqn"] = desc["fqn"][len(prefix):]

    def _merge_desc(self, desc: Descriptor, descs: list[Descriptor],
                    layout: Optional[Layout], tensor: str, slot: Any) -> None:
        plan = self.plan
        layout = layout or Layout(UNKNOWN)
        order = plan.order
        shapes = [list(descs[i].get("shape") or []) for i in order]
        desc.pop("placement", None)
        desc.pop("key", None)
        src = producer_of(desc)
        if src is not None:
            found = plan.resolve(src)
            if found is not None:
                desc["producer"] = producer_ref(found[0], found[1])
        desc["layout"] = layout.text
        pieces: list[RankPiece] = []
        offset = 0
        for i, shape in zip(order, shapes):
            piece: RankPiece = {"rank": plan.ranks[i], "shape": shape}
            if layout.kind == SHARD:
                piece["offset"] = offset
                offset += shape[layout.dim] if layout.dim < len(shape) else 0
            pieces.append(piece)
        desc["pieces"] = pieces
        keys = [descs[i].get("key") for i in order]
        coefficients = [1.0] * len(order)
        if (layout.scaled or layout.op == "avg") and plan.weights:
            coefficients = [plan.weights[i] for i in order]
        if layout.kind == SHARD:
            shape = list(shapes[0])
            if layout.dim < len(shape):
                shape[layout.dim] = offset
            desc["shape"] = shape
            desc["stats"] = statistics.merge_shards(
                [statistics.scaled(descs[i].get("stats"), c) for i, c in zip(order, coefficients)],
                [_numel(s) for s in shapes])
        elif layout.kind == PARTIAL:
            reduced = plan.reduced.get(slot) if slot is not None else None
            if reduced is not None:
                desc["stats"] = copy.deepcopy(reduced)
            elif all(_numel(s) == 1 for s in shapes):      # scalars: their values add exactly
                desc["stats"] = statistics.combined_scalars(
                    [descs[i].get("stats") for i in order], coefficients)
            else:
                desc["stats"] = None
        elif layout.kind == REPLICATE:
            desc["stats"] = copy.deepcopy(descs[order[0]].get("stats"))
        else:
            desc["stats"] = None
        if layout.kind != UNKNOWN and all(isinstance(k, str) for k in keys):
            self._recipes[tensor] = (layout.kind, layout.dim,
                                     [(i, str(k)) for i, k in zip(order, keys)], coefficients)
            desc["key"] = tensor
        self._pieces[tensor] = pieces

    def pieces(self, tensor: str) -> list[RankPiece]:
        """Where a merged tensor came from (after `records()` reached it): [{"rank", "shape",
        "offset"}]."""
        return self._pieces.get(tensor, [])

    def recipe(self, tensor: str) -> list[tuple[int, str]]:
        recipe = self._recipes.get(tensor)
        return list(recipe[2]) if recipe else []

    def coefficients(self, tensor: str) -> list[float]:
        """What each piece is multiplied by before it is joined (1 but for data parallel)."""
        recipe = self._recipes.get(tensor)
        return list(recipe[3]) if recipe else []

    def layout_of(self, tensor: str) -> Optional[tuple[str, int]]:
        recipe = self._recipes.get(tensor)
        return (recipe[0], recipe[1]) if recipe else None


__all__ = ["MergedSource"]
