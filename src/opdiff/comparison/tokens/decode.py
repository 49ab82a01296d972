"""A prefill plus decode steps through a KV cache on one side against one forward of the same
tokens on the other.

The side with several forward passes (one embedding call each, `sequences.passes`) is kept as
recorded; the one-pass side is copied once per pass, each copy cut to that pass's tokens: a dim
the passing side holds `n` positions of, in a pass that ends at token `end`, keeps the
one-pass side's positions `end - n .. end` (a query's dim: the pass's own tokens; a key's dim:
every token so far, the cache included). Which tensor of the copy answers which of the pass is
read from where it sits (its module call, op, and how many calls of that op the call made
before it), so other call counters never matter. Copies after the first are renamed as the
model's next forward would name them (call counters, sequence numbers, producers), and leave
out the parameters and buffers the first copy already compared.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Optional

from ...store.records import iter_tensors
from ...store.schema import Kind, RecordName
from ...store.source import DumpSource
from .rewrite import LEAVES, cut_descriptor
from .sequences import Layout, Sequence, load_ids, passes
from .slicing import BROADCAST, ROW, Cut
from .source import SlicedSource

_CALL = re.compile(r"\.call\d+$")
PREFIX = "prefix of the one forward"        # how a decode's tokens matched


@dataclass(frozen=True)
class Decoded:
    """The decoding side kept, the one-pass side copied per pass (see the module docstring)."""

    many: str                       # "target" or "golden": the side that decoded
    many_records: list[dict[str, Any]]  # its records (positions counted from the start)
    many_source: SlicedSource
    lengths: tuple[int, ...]        # tokens per pass
    one: Sequence                   # the one-pass side's matched row and positions
    records: list[dict[str, Any]]   # the one-pass side's copies, one per pass
    source: SlicedSource


def _pass_starts(records: list[dict[str, Any]], at: list[int]) -> list[int]:
    """Where each pass begins: at its embedding call, with what ran since the previous pass's
    last outermost module call ended (the ids it reads, the caller's slicing of them)."""
    starts = []
    for k, i in enumerate(at):
        while k and i > 0 and (records[i - 1]["kind"] == Kind.LEAF or (
                not records[i - 1].get("module") and records[i - 1]["kind"] != Kind.MODULE)):
            i -= 1
        starts.append(0 if k == 0 else i)
    return starts


def _counted_from_start(dump: DumpSource, records: list[dict[str, Any]], starts: list[int],
                        lengths: list[int], one: dict[tuple[Any, ...], tuple[int, ...]],
                        one_length: int) -> tuple[list[dict[str, Any]], SlicedSource]:
    """The decoding side with each later pass's `arange` of its own tokens (0..n-1), where the
    one forward's `arange` at the same place counts its positions, served counted from the
    sequence's start, as the one forward counts them."""
    side = SlicedSource(dump, [], Layout(1, 0, (), (), False, ""), [])
    out = list(records)
    for k in range(1, len(lengths)):
        offset = sum(lengths[:k])
        part = records[starts[k]:starts[k + 1]]
        counted = {str(desc["key"]) for record, place in zip(part, _places(part))
                   if str(record["op"]).endswith("arange")
                   for name, _, desc in iter_tensors(record)
                   if one.get((*place, name[len(record["name"]):])) == (one_length,)
                   and _own_positions(dump, desc, lengths[k])}
        for i in range(starts[k], starts[k + 1]):     # (the ops that read them too)
            if not any(desc.get("key") in counted for _, _, desc in iter_tensors(records[i])):
                continue
            out[i] = copy.deepcopy(records[i])
            for _, _, desc in iter_tensors(out[i]):
                if desc.get("key") in counted:
                    cut_descriptor(desc, Cut("", (), (), offset), side)
    side.keep(out)
    return out, side


def _own_positions(dump: DumpSource, desc: dict[str, Any], length: int) -> bool:
    import torch

    if not desc.get("key") or list(desc.get("shape") or ()) != [length]:
        return False
    try:
        found = dump.tensor(desc["key"])
    except Exception:
        return False
    return found is not None and not found.is_floating_point() and \
        torch.equal(found.long().reshape(-1), torch.arange(length))


def _module(name: Any) -> str:
    parsed = RecordName.parse(str(name or ""))
    return parsed.without_index if parsed is not None else str(name or "")


def _op(record: dict[str, Any]) -> str:
    """The record's op, a model input's without the call it was given to (`Input.0.call1`)."""
    op = str(record["op"])
    return _CALL.sub("", op) if record["kind"] == Kind.LEAF else op


def _places(records: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    seen: dict[tuple[str, str], int] = {}
    out = []
    for r in records:
        at = (_module(r.get("module")), _op(r))
        seen[at] = seen.get(at, -1) + 1
        out.append((*at, seen[at]))
    return out


def _shapes(records: list[dict[str, Any]]) -> dict[tuple[Any, ...], tuple[int, ...]]:
    return {(*place, name[len(r["name"]):]): tuple(desc.get("shape") or ())
            for r, place in zip(records, _places(records)) for name, _, desc in iter_tensors(r)}


def decode_alignment(target: DumpSource, golden: DumpSource, t_records: list[dict[str, Any]],
                     g_records: list[dict[str, Any]], t_layout: Layout,
                     g_layout: Layout) -> Optional[Decoded]:
    """The alignment where exactly one side ran several passes of one row whose tokens begin
    the other side's row; None otherwise."""
    t_passes, g_passes = passes(t_records), passes(g_records)
    if (len(t_passes) > 1) == (len(g_passes) > 1):
        return None
    many, one_layout = ("target", g_layout) if len(t_passes) > 1 else ("golden", t_layout)
    dump, records, found = (target, t_records, t_passes) if many == "target" else \
        (golden, g_records, g_passes)
    one_records = g_records if many == "target" else t_records
    tokens: list[int] = []
    lengths = []
    for _, desc in found:
        rows = load_ids(dump, desc)
        if rows is None or len(rows) != 1:
            return None         # a batch decoded: not aligned here
        tokens += rows[0]
        lengths.append(len(rows[0]))
    row = next((s for s in one_layout.rows if s.tokens[:len(tokens)] == tuple(tokens)), None)
    if row is None:
        return None
    one = Sequence(row.row, row.positions[:len(tokens)], tuple(tokens))
    side = SlicedSource(golden if many == "target" else target, [], one_layout, [one])
    starts = _pass_starts(records, [i for i, _ in found]) + [len(records)]
    spans = _spans(one_records)
    n = 1 + max((int(r.get("seq") or 0) for r in one_records), default=0)
    copies: list[dict[str, Any]] = []
    end = 0
    for k, length in enumerate(lengths):
        end += length
        pass_shapes = _shapes(records[starts[k]:starts[k + 1]])
        for record, place in zip(one_records, _places(one_records)):
            if k and record["kind"] == Kind.LEAF and record.get("leaf") in LEAVES:
                continue        # parameters and buffers: compared with the first pass
            record = _cut_record(record, place, pass_shapes, end, length, one_layout, side)
            copies.append(_renamed(record, k, spans, n) if k else record)
    side.keep(copies)
    kept, kept_side = _counted_from_start(dump, records, starts, lengths, _shapes(one_records),
                                          one_layout.length)
    return Decoded(many, kept, kept_side, tuple(lengths), one, copies, side)


def _cut_record(record: dict[str, Any], place: tuple[str, str, int],
                pass_shapes: dict[tuple[Any, ...], tuple[int, ...]], end: int, own: int,
                layout: Layout, side: SlicedSource) -> dict[str, Any]:
    cuts = {}
    for name, _, desc in iter_tensors(record):
        if desc.get("leaf") in LEAVES or record.get("leaf") in LEAVES:
            continue
        shape = tuple(int(s) for s in desc.get("shape") or ())
        other = pass_shapes.get((*place, name[len(record["name"]):]))
        cut = _window(shape, other, end, own, layout)
        if cut is not None:
            cuts[name] = cut
    if not cuts:
        return record
    record = copy.deepcopy(record)
    for name, _, desc in iter_tensors(record):
        if name in cuts:
            cut_descriptor(desc, cuts[name], side)
    return record


def _window(shape: tuple[int, ...], other: Optional[tuple[int, ...]], end: int, own: int,
            layout: Layout) -> Optional[Cut]:
    """The one-pass side's tensor cut to a pass ending at token `end`, whose own tensor at the
    same place has shape `other` (None: none there; its token dims then keep the pass's own
    tokens, as a query's would)."""
    if not shape or (other is not None and len(other) != len(shape)):
        return None
    lead = ROW if shape[0] == layout.batch else BROADCAST if shape[0] == 1 else ""
    windows = []
    for d in range(1 if lead else 0, len(shape)):
        if shape[d] != layout.length:
            continue
        n = other[d] if other is not None else own
        if n <= end:
            windows.append((d, end - n, end))
    if not windows and (lead != ROW or layout.batch == 1):
        return None
    return Cut(lead, (), tuple(windows))


def _spans(records: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """How many calls of each op (and module) one pass makes: a copy's counters move by it."""
    out: dict[tuple[str, str], int] = {}
    for r in records:
        parsed = RecordName.parse(r["name"])
        if parsed is not None:
            key = (parsed.op, parsed.kind)
            out[key] = max(out.get(key, 0), parsed.index + 1)
    return out


def _rename(name: Any, k: int, spans: dict[tuple[str, str], int]) -> Any:
    parsed = RecordName.parse(str(name)) if isinstance(name, str) else None
    if parsed is None or (parsed.op, parsed.kind) not in spans:
        return name
    return RecordName(parsed.op, parsed.phase, parsed.index + k * spans[(parsed.op, parsed.kind)],
                      parsed.kind).text


def _renamed(record: dict[str, Any], k: int, spans: dict[tuple[str, str], int],
             n: int) -> dict[str, Any]:
    """The record as the model's k-th next forward would have named it."""
    record = copy.deepcopy(record)
    if record["kind"] == Kind.LEAF and record.get("leaf") == "input":   # (capture's spelling)
        parsed = RecordName.parse(record["name"])
        if parsed is not None:
            record["op"] = f"{parsed.op}.call{k}"
            record["name"] = RecordName(record["op"], parsed.phase, parsed.index, parsed.kind).text
            record["tensor"] = f"{record.get('tensor')}.call{k}"
    else:
        record["name"] = _rename(record["name"], k, spans)
    for field in ("module", "reader", "forward"):
        if isinstance(record.get(field), str):
            record[field] = _rename(record[field], k, spans)
    if isinstance(record.get("seq"), int):
        record["seq"] += k * n
    for _, _, desc in iter_tensors(record):
        found = desc.get("producer")
        if isinstance(found, list) and len(found) == 2 and isinstance(found[0], int):
            desc["producer"] = [found[0] + k * n, found[1]]
    return record


__all__ = ["Decoded", "decode_alignment", "PREFIX"]
