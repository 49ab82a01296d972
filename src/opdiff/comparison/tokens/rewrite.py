"""One side's records rewritten to the matched sequences' real tokens: every activation's
descriptor gets the cut shape, a key its `SlicedSource` serves cut, and statistics recomputed
from the cut tensor. Parameters and buffers are never cut; a tensor whose dims hold no rows or
positions (`slicing.cut_for`) is left as recorded."""
from __future__ import annotations

import copy
import logging
from typing import Optional

from ...store.records import iter_tensors
from ...store.schema import Kind, Record, Descriptor, Statistics
from .slicing import BROADCAST, FLAT, ROW, Cut, agrees, cut_for, statistics
from .sequences import Layout
from .source import SlicedSource

log = logging.getLogger("opdiff")

# A tensor's place: its record's module call, op and call within it, and its name in the record.
Place = tuple[str, str, int, str]
LEAVES = ("parameter", "buffer")     # never cut: they hold no tokens


def _places(records: list[Record]) -> list[tuple[str, str, int]]:
    """Where each record sits: (its module call, its op, how many calls of that op the module
    call made before it). Call counters shift when one side runs extra ops elsewhere (its mask
    built from the padding); a place inside a module call does not."""
    seen: dict[tuple[str, str], int] = {}
    out = []
    for r in records:
        at = (str(r.get("module") or ""), str(r["op"]))
        seen[at] = seen.get(at, -1) + 1
        out.append((*at, seen[at]))
    return out


def shapes_by_place(records: list[Record]) -> dict[Place, tuple[int, ...]]:
    """Every tensor's recorded shape, by its record's place and its name within the record
    (what the other side's cuts check against)."""
    return {(*place, name[len(r["name"]):]): tuple(desc.get("shape") or ())
            for r, place in zip(records, _places(records)) for name, _, desc in iter_tensors(r)}


def _identity(cut: Cut, shape: tuple[int, ...], side: SlicedSource) -> bool:
    """Cutting changes nothing: one sequence that fills the whole of the only row."""
    if len(side.sequences) != 1 or cut.lead == FLAT:
        return False
    s = side.sequences[0]
    row_kept = cut.lead in ("", BROADCAST) or (cut.lead == ROW and shape[0] == 1 and s.row == 0)
    return row_kept and s.positions == tuple(range(side.layout.length))


def rewrite(side: SlicedSource, records: list[Record],
            other: dict[Place, tuple[int, ...]], other_layout: Layout) -> list[Record]:
    """`records` with their activations cut (see the module docstring); `side` learns the cut keys
    and serves them."""
    out: list[Record] = []
    for record, place in zip(records, _places(records)):
        cuts = {}
        if record["kind"] == Kind.PARAM_GRAD:      # a parameter's gradient holds no tokens
            out.append(record)
            continue
        for name, _, desc in iter_tensors(record):
            shape = tuple(int(s) for s in desc.get("shape") or ())
            if desc.get("leaf") in LEAVES or record.get("leaf") in LEAVES:
                continue
            cut = cut_for(shape, side.layout)
            if cut is not None:
                cut = agrees(cut, shape, other.get((*place, name[len(record["name"]):])), side.layout, other_layout)
            if cut is not None and not _identity(cut, shape, side):
                cuts[name] = cut
        if not cuts:
            out.append(record)
            continue
        record = copy.deepcopy(record)
        for name, _, desc in iter_tensors(record):
            if name in cuts:
                cut_descriptor(desc, cuts[name], side)
        out.append(record)
    return out


def cut_descriptor(desc: Descriptor, cut: Cut, side: SlicedSource) -> None:
    """The descriptor of the tensor cut: its shape, the key `side` serves it under, and the
    statistics of the cut values (each cut tensor loaded once per side)."""
    cache = side.measured
    shape = [int(s) for s in desc.get("shape") or ()]
    key = desc.get("key")
    desc["shape"] = cut.shape(shape, side.sequences)
    desc.pop("saved_shape", None)
    if not key:             # no values to cut: its statistics describe every row, not these
        desc.pop("stats", None)
        return
    new_key = side.cut_key(str(key), cut)
    desc["key"] = new_key
    if new_key not in cache:
        stats: Optional[Statistics] = None
        try:
            part = side.tensor(new_key)
            if part is not None:
                cache_shape, stats = list(part.shape), statistics(part)
            else:
                cache_shape = desc["shape"]
        except Exception as exc:      # an unreadable tensor: no statistics for its cut
            log.warning("opdiff: cannot cut tensor %s to its tokens (%s)", key, exc)
            cache_shape = desc["shape"]
        cache[new_key] = (cache_shape, stats)
    desc["shape"], stats = cache[new_key]
    if stats is None:
        desc.pop("stats", None)
    else:
        desc["stats"] = stats


__all__ = ["rewrite", "shapes_by_place", "cut_descriptor", "LEAVES"]
