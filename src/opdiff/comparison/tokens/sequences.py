"""Which token sequences each side computes, read from its own recorded input ids, and which of
them are the same sequence on both sides.

A side's ids are the integer input of its first embedding call (`[batch, length]`), its real
tokens those its recorded `attention_mask` input keeps (all of them without one). Two sequences
are the same when their real tokens are equal; where a side recorded no mask, a sequence is also
found as a contiguous run inside the other side's row (padding the user did not mark)::

    golden = read_layout(golden_dump, golden_records)      # None: no ids recorded
    target = read_layout(target_dump, target_records)
    matches = match(golden, target)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...dtypes import is_exact
from ...store.source import DumpSource
from ...store.schema import Kind, Phase, Record, Descriptor

SAME_IDS = "same ids"               # the real tokens of the two rows are equal
INSIDE_ROW = "ids found inside the row"   # one side's tokens, a contiguous run of the other's row


@dataclass(frozen=True)
class Sequence:
    """One row's real tokens: where they sit in the row (`positions`) and what they are."""

    row: int
    positions: tuple[int, ...]
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """How one side laid its tokens out: `batch` rows of `length` positions."""

    batch: int
    length: int
    rows: tuple[Sequence, ...]
    ids: tuple[tuple[int, ...], ...]        # every row's ids, padding included
    masked: bool                            # an attention mask said which tokens are real
    ids_key: str                            # the recorded tensor the ids were read from


@dataclass(frozen=True)
class Match:
    """The same token sequence on both sides: golden's row and positions, target's, and how."""

    golden: Sequence
    target: Sequence
    how: str


def _is_embedding(record: Record) -> bool:
    return record["kind"] in (Kind.API, Kind.ATEN) and record["phase"] == Phase.FORWARD \
        and "embedding" in str(record.get("op") or "").lower().split(".")


def _integer_input(record: Record) -> Optional[Descriptor]:
    for desc in record["inputs"]:
        if isinstance(desc, dict) and desc.get("type") == "tensor" \
                and is_exact(desc.get("dtype")) and len(desc.get("shape") or ()) == 2:
            return desc
    return None


def first_ids(records: list[Record]) -> Optional[Descriptor]:
    """The descriptor of the first embedding call's integer input ([batch, length]), or None."""
    return next((d for r in records if _is_embedding(r) for d in [_integer_input(r)]
                 if d is not None), None)


def passes(records: list[Record]) -> list[tuple[int, Descriptor]]:
    """(record index, ids descriptor) of every embedding call with saved integer ids: one per
    forward pass (a prefill, then each decode step through the KV cache)."""
    return [(i, d) for i, r in enumerate(records) if _is_embedding(r)
            for d in [_integer_input(r)] if d is not None and d.get("key")]


def load_ids(dump: DumpSource, desc: Descriptor) -> Optional[list[list[int]]]:
    """The rows of a saved ids tensor, or None where it cannot be read."""
    return _load_rows(dump, desc["key"])


def _load_rows(dump: DumpSource, key: str) -> Optional[list[list[int]]]:
    try:
        found = dump.tensor(key)
    except Exception:       # an unreadable tensor: no ids from it
        return None
    if found is None or found.dim() != 2:
        return None
    return [[int(v) for v in row] for row in found.tolist()]


def read_layout(dump: DumpSource, records: list[Record]) -> Optional[Layout]:
    """The side's token layout from its first embedding call's ids, or None when it recorded none
    (statistics dumps, no embedding)."""
    ids_desc = first_ids(records)
    if ids_desc is None or not ids_desc.get("key"):
        return None
    ids = _load_rows(dump, ids_desc["key"])
    if not ids:
        return None
    batch, length = len(ids), len(ids[0])
    mask = _mask(dump, records, (batch, length))
    rows = []
    for r, row in enumerate(ids):
        keep = [p for p in range(length) if mask is None or mask[r][p]]
        rows.append(Sequence(r, tuple(keep), tuple(row[p] for p in keep)))
    return Layout(batch, length, tuple(rows), tuple(tuple(row) for row in ids), mask is not None,
                  ids_desc["key"])


def given_layout(ids: tuple[tuple[int, ...], ...],
                 mask: Optional[tuple[tuple[int, ...], ...]]) -> Layout:
    """A side's layout from ids given in a file (`given.py`), not read from its dump."""
    batch, length = len(ids), len(ids[0])
    rows = []
    for r, row in enumerate(ids):
        keep = [p for p in range(length) if mask is None or mask[r][p]]
        rows.append(Sequence(r, tuple(keep), tuple(row[p] for p in keep)))
    return Layout(batch, length, tuple(rows), tuple(ids), mask is not None, "")


def _mask(dump: DumpSource, records: list[Record],
          shape: tuple[int, int]) -> Optional[list[list[int]]]:
    """The recorded `attention_mask` input of the ids' shape (1: a real token), or None."""
    for record in records:
        if record["kind"] != Kind.LEAF or record.get("leaf") != "input" \
                or record.get("tensor") != "attention_mask":
            continue
        for desc in record["outputs"]:
            if isinstance(desc, dict) and desc.get("key") and \
                    tuple(desc.get("shape") or ()) == shape:
                return _load_rows(dump, desc["key"])
    return None


def _inside(short: Sequence, long_row: tuple[int, ...], row: int) -> Optional[Sequence]:
    """`short`'s tokens as the only contiguous run of `long_row`, as a sequence of that row."""
    n = len(short.tokens)
    starts = [s for s in range(len(long_row) - n + 1) if long_row[s:s + n] == short.tokens]
    if len(starts) != 1 or n == 0:
        return None
    return Sequence(row, tuple(range(starts[0], starts[0] + n)), short.tokens)


def match(golden: Layout, target: Layout) -> list[Match]:
    """Each golden sequence paired with the target sequence holding the same tokens (each used
    once), in golden's row order."""
    found: list[Match] = []
    used: set[int] = set()
    for g in golden.rows:
        same = next((t for t in target.rows if t.row not in used and t.tokens == g.tokens
                     and t.tokens), None)
        if same is not None:
            used.add(same.row)
            found.append(Match(g, same, SAME_IDS))
            continue
        # a side without a mask: the sequence inside the other's row, padding unmarked
        for t in target.rows:
            if t.row in used:
                continue
            inner = _inside(g, target.ids[t.row], t.row) if not target.masked else None
            outer = _inside(t, golden.ids[g.row], g.row) if not golden.masked else None
            if inner is not None and len(inner.tokens) == len(g.tokens):
                used.add(t.row)
                found.append(Match(g, inner, INSIDE_ROW))
                break
            if outer is not None:
                used.add(t.row)
                found.append(Match(outer, t, INSIDE_ROW))
                break
    return found


__all__ = ["Sequence", "Layout", "Match", "read_layout", "given_layout", "first_ids", "passes", "load_ids", "match",
           "SAME_IDS", "INSIDE_ROW"]
