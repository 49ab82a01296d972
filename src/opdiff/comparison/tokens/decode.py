"""A prefill plus decode steps through a KV cache on one side against one forward of the same
tokens on the other.

The side with several forward passes (one embedding call each, `sequences.passes`) is kept as
recorded; the one-pass side is copied once per pass, each copy cut to that pass's tokens: a dim
the passing side holds `n` positions of, in a pass that ends at token `end`, keeps the
one-pass side's positions `end - n .. end` (a query's dim: the pass's own tokens; a key's dim:
every token so far, the cache included). Which record of the copy answers which of the pass
is found by diffing the records of each module (and those outside every module call) on their
op and output ranks (`_counterparts`), so an op only one side runs (the cache positions
`generate` passes, its own ops between passes) never shifts the others. Where the one forward
extends an empty KV cache, a later pass's copy extends the one forward's own keys of the tokens
before it instead (`_cache_so_far`), so the cache's concatenation pairs op for op. Copies after
the first are renamed as the model's next forward would name them (call counters, sequence
numbers, producers), and leave out the parameters and buffers the first copy already compared.
"""
from __future__ import annotations

import copy
import difflib
import re
from dataclasses import dataclass
from typing import Any, Optional, cast

from ...store.records import iter_tensors, producer_ref
from ...store.schema import Descriptor, Kind, Record, RecordName, Role
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
    many_records: list[Record]  # its records (positions counted from the start)
    many_source: SlicedSource
    lengths: tuple[int, ...]        # tokens per pass
    one: Sequence                   # the one-pass side's matched row and positions
    records: list[Record]   # the one-pass side's copies, one per pass
    source: SlicedSource


def _pass_starts(records: list[Record], at: list[int]) -> list[int]:
    """Where each pass begins: at its embedding call, with what ran since the previous pass's
    last outermost module call ended (the ids it reads, the caller's slicing of them)."""
    starts = []
    for k, i in enumerate(at):
        while k and i > 0 and (records[i - 1]["kind"] == Kind.LEAF or (
                not records[i - 1].get("module") and records[i - 1]["kind"] != Kind.MODULE)):
            i -= 1
        starts.append(0 if k == 0 else i)
    return starts


def _counted_from_start(dump: DumpSource, records: list[Record], starts: list[int],
                        lengths: list[int], one: list[Record],
                        one_length: int) -> tuple[list[Record], SlicedSource]:
    """The decoding side with each later pass's `arange` of its own tokens (0..n-1), where its
    counterpart in the one forward counts the positions, served counted from the sequence's
    start, as the one forward counts them."""
    side = SlicedSource(dump, [], Layout(1, 0, (), (), False, ""), [])
    out = list(records)
    for k in range(1, len(lengths)):
        offset = sum(lengths[:k])
        part = records[starts[k]:starts[k + 1]]
        shapes = _shapes(part, one)         # (the one forward's, by the pass's records)
        counted = {str(desc["key"]) for j, record in enumerate(part)
                   if str(record["op"]).endswith("arange")
                   for name, _, desc in iter_tensors(record)
                   if shapes.get((j, name[len(record["name"]):])) == (one_length,)
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


def _own_positions(dump: DumpSource, desc: Descriptor, length: int) -> bool:
    import torch

    if not desc.get("key") or list(desc.get("shape") or ()) != [length]:
        return False
    try:
        found = dump.tensor(desc["key"])
    except Exception:
        return False
    return found is not None and not found.is_floating_point() and \
        torch.equal(found.long().reshape(-1), torch.arange(length))


def _module(name: Optional[str]) -> str:
    parsed = RecordName.parse(str(name or ""))
    return parsed.without_index if parsed is not None else str(name or "")


def _op(record: Record) -> str:
    """The record's op, a model input's without the call it was given to (`Input.0.call1`)."""
    op = str(record["op"])
    return _CALL.sub("", op) if record["kind"] == Kind.LEAF else op


def _signature(record: Record) -> tuple[str, str, tuple[int, ...]]:
    """What a record is, whatever its counters and sizes: its op, kind and its outputs' ranks
    (a token dim's size differs between a pass and the one forward; its rank does not. An
    input's may: the cache a pass extends is an empty tensor in a forward that starts one)."""
    return (_op(record), record["kind"], tuple(len(desc.get("shape") or ()) for _, role, desc
                                              in iter_tensors(record) if role == Role.OUTPUT))


def _counterparts(one: list[Record], part: list[Record]) -> dict[int, int]:
    """Each record of the one forward (its index) that has a counterpart in a pass (its index
    there): the records of each module (its path and class, any call) and those outside every
    module call are diffed on their signatures, longest matching blocks first, so an op only
    one side runs (a cache position the caller gives, the caller's own ops between passes)
    never shifts the others."""
    groups: dict[str, tuple[list[int], list[int]]] = {}
    for side, records in ((0, one), (1, part)):
        for i, r in enumerate(records):
            groups.setdefault(_module(r.get("module")), ([], []))[side].append(i)
    found: dict[int, int] = {}
    for ones, parts in groups.values():
        if not ones or not parts:
            continue
        matcher = difflib.SequenceMatcher(None, [_signature(one[i]) for i in ones],
                                          [_signature(part[j]) for j in parts], autojunk=False)
        for a, b, size in matcher.get_matching_blocks():
            found.update({ones[a + d]: parts[b + d] for d in range(size)})
    return found


def _shapes(one: list[Record], part: list[Record]
            ) -> dict[tuple[int, str], tuple[int, ...]]:
    """The pass's tensor shapes, by the one forward's record (its index) and tensor name in it."""
    out = {}
    for i, j in _counterparts(one, part).items():
        r = part[j]
        for name, _, desc in iter_tensors(r):
            out[(i, name[len(r["name"]):])] = tuple(desc.get("shape") or ())
    return out


def decode_alignment(target: DumpSource, golden: DumpSource, t_records: list[Record],
                     g_records: list[Record], t_layout: Layout,
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
    copies: list[Record] = []
    end = 0
    for k, length in enumerate(lengths):
        end += length
        pass_shapes = _shapes(one_records, records[starts[k]:starts[k + 1]])
        for at, record in enumerate(one_records):
            if k and record["kind"] == Kind.LEAF and record.get("leaf") in LEAVES:
                continue        # parameters and buffers: compared with the first pass
            if k and _starts_a_cache(record, at, pass_shapes):
                continue
            record = _cut_record(record, at, pass_shapes, end, length, one_layout, side)
            if k:
                record = _cache_so_far(record, one_records[at], at, pass_shapes, (end, length),
                                       one_layout, side, n)
            copies.append(_renamed(record, k, spans, n) if k else record)
    side.keep(copies)
    kept, kept_side = _counted_from_start(dump, records, starts, lengths, one_records,
                                          one_layout.length)
    return Decoded(many, kept, kept_side, tuple(lengths), one, copies, side)


def _empty(desc: Descriptor) -> bool:
    shape = desc.get("shape")
    return isinstance(shape, list) and 0 in shape


def _starts_a_cache(record: Record, at: int,
                    pass_shapes: dict[tuple[int, str], tuple[int, ...]]) -> bool:
    """An op of the one forward that makes only empty tensors and has no counterpart in a later
    pass: the forward starting its KV cache (`torch.tensor([])`), which a pass extends instead."""
    outs = [(n, d) for n, role, d in iter_tensors(record) if role == Role.OUTPUT]
    return bool(outs) and all(_empty(d) for _, d in outs) and not any(
        (at, n[len(record["name"]):]) in pass_shapes for n, _ in outs)


def _cache_so_far(record: Record, original: Record, at: int,
                  pass_shapes: dict[tuple[int, str], tuple[int, ...]], span: tuple[int, int],
                  layout: Layout, side: SlicedSource, n: int) -> Record:
    """A later pass's copy of the op that extends a KV cache: where the one forward extends an
    empty cache, the pass extends the keys of every token before it. That input is served as the
    one forward's own output cut to those tokens, made by the previous pass's copy of the op
    (`seq - n`: `_renamed` moves it on by one pass per copy)."""
    end, own = span
    outs = [d for _, role, d in iter_tensors(original) if role == Role.OUTPUT]
    if len(outs) != 1 or not outs[0].get("key"):
        return record
    full = tuple(int(v) for v in outs[0].get("shape") or ())
    found = [(name, desc) for name, role, desc in iter_tensors(record)
             if role == Role.INPUT and _empty(desc)]
    seq = original.get("seq")
    if not found or not isinstance(seq, int):
        return record
    record = copy.deepcopy(record)
    for name, _, desc in iter_tensors(record):
        past = pass_shapes.get((at, name[len(record["name"]):]))
        if not _empty(desc) or past is None or len(past) != len(full):
            continue
        cut = _window(full, past, end - own, own, layout)
        if cut is None or not cut.windows or any(b - a != end - own for _, a, b in cut.windows):
            continue
        made = copy.deepcopy(outs[0])
        cut_descriptor(made, cut, side)
        made["producer"] = producer_ref(seq - n, 0)
        replaced = cast("dict[str, Any]", desc)   # replaced in place: the record holds this object
        replaced.clear()
        replaced.update(made)
    return record


def _cut_record(record: Record, at: int,
                pass_shapes: dict[tuple[int, str], tuple[int, ...]], end: int, own: int,
                layout: Layout, side: SlicedSource) -> Record:
    cuts = {}
    for name, _, desc in iter_tensors(record):
        if desc.get("leaf") in LEAVES or record.get("leaf") in LEAVES:
            continue
        shape = tuple(int(s) for s in desc.get("shape") or ())
        other = pass_shapes.get((at, name[len(record["name"]):]))
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


def _spans(records: list[Record]) -> dict[tuple[str, str], int]:
    """How many calls of each op (and module) one pass makes: a copy's counters move by it."""
    out: dict[tuple[str, str], int] = {}
    for r in records:
        parsed = RecordName.parse(r["name"])
        if parsed is not None:
            key = (parsed.op, parsed.kind)
            out[key] = max(out.get(key, 0), parsed.index + 1)
    return out


def _rename(name: str, k: int, spans: dict[tuple[str, str], int]) -> str:
    parsed = RecordName.parse(name)
    if parsed is None or (parsed.op, parsed.kind) not in spans:
        return name
    return RecordName(parsed.op, parsed.phase, parsed.index + k * spans[(parsed.op, parsed.kind)],
                      parsed.kind).text


def _renamed(record: Record, k: int, spans: dict[tuple[str, str], int],
             n: int) -> Record:
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
        value = record.get(field)
        if isinstance(value, str):
            record[field] = _rename(value, k, spans)
    seq = record.get("seq")
    if isinstance(seq, int):
        record["seq"] = seq + k * n
    for _, _, desc in iter_tensors(record):
        found = desc.get("producer")
        if isinstance(found, list) and len(found) == 2 and isinstance(found[0], int):
            desc["producer"] = [found[0] + k * n, found[1]]
    return record


__all__ = ["Decoded", "decode_alignment", "PREFIX"]
