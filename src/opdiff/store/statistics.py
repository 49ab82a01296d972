"""The statistics a descriptor carries, named once: key, CSV column, value type, and how each
merges exactly across the pieces of one tensor (torch-free).

    >>> [s.key for s in STATISTICS]
    ['max', 'min', 'mean', 'norm', 'nan', 'inf']
    >>> merge([Piece({"max": 1.0, "min": 0.0, "mean": 0.5, "norm": 2.0, "nan": 0, "inf": 0}, 4),
    ...        Piece({"max": 3.0, "min": -1.0, "mean": 1.0, "norm": 1.0, "nan": 0, "inf": 0}, 2)])
    {'max': 3.0, 'min': -1.0, 'mean': 0.6666666666666666, 'norm': 2.23606797749979, 'nan': 0, 'inf': 0}

Pieces are laid out one of three ways (`LAYOUTS`), the ways ranks hold one tensor:

- `concat`: slices of the tensor along a dim (a shard; split q/k/v against a fused qkv). Every
  statistic here merges exactly: max and min are the pieces' max and min (NaN where one is
  NaN), the mean is the pieces' means weighted by their element counts, the norm comes from
  the pieces' sums of squares, the counts add up; in float64.
- `partial`: the tensor is the element-wise sum of the pieces (a partial sum before its
  reduce). Only the mean merges exactly (the sum of the pieces' means, pieces of one size);
  the extremes, the norm and the counts of a sum cannot be told from its terms' statistics.
- `replica`: each piece is the whole tensor (a replicated parameter). A statistic the pieces
  agree on is the tensor's; one they disagree on is unknown.

What does not merge exactly is left out of the merged statistics (unknown), never estimated.
Adding a statistic: its row here, its field in `opdiff.store.schema.Statistics`, and its
computation in capture (`capture/stats.py`); the writer's JSON Schema, the reader, the CSV and
the concatenation of `concat:` mapping lines follow from the row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Union, cast

from .records import decode_float, encode_float
from .schema import Statistics

Number = Union[float, int]
# (values of the pieces, each a float or int, and their element counts) -> the merged value
Merge = Callable[[Sequence[Number], Sequence[int]], Number]

CONCAT, PARTIAL, REPLICA = "concat", "partial", "replica"
LAYOUTS = (CONCAT, PARTIAL, REPLICA)


def _nan_or(pick: Callable[[Sequence[float]], float]) -> Merge:
    """max/min: NaN where a piece's is NaN (as torch's max of a tensor holding one)."""
    def merged(values: Sequence[Number], numels: Sequence[int]) -> Number:
        nums = [float(v) for v in values]
        return math.nan if any(math.isnan(v) for v in nums) else pick(nums)
    return merged


def _sum(values: Sequence[float]) -> float:
    """A float64 sum, correctly rounded where every term is finite."""
    return math.fsum(values) if all(math.isfinite(v) for v in values) else sum(values)


def _mean(values: Sequence[Number], numels: Sequence[int]) -> Number:
    total = sum(numels)
    if not total:
        return float(values[0])
    return _sum([float(v) * n for v, n in zip(values, numels)]) / total


def _norm(values: Sequence[Number], numels: Sequence[int]) -> Number:
    # sqrt of the sum of the pieces' sums of squares, without overflowing them (hypot; which
    # says inf for a NaN beside an inf, where the tensor's norm is NaN)
    nums = [float(v) for v in values]
    return math.nan if any(math.isnan(v) for v in nums) else math.hypot(*nums)


def _count(values: Sequence[Number], numels: Sequence[int]) -> Number:
    return int(sum(int(v) for v in values))


def _sum_of_means(values: Sequence[Number], numels: Sequence[int]) -> Number:
    return _sum([float(v) for v in values])


@dataclass(frozen=True)
class Statistic:
    """One statistic: how a descriptor names it, the CSV shows it, and its pieces merge."""
    key: str                    # its key in a descriptor's `stats` (records.jsonl)
    column: Optional[str]       # its label in the CSV's "NPU <label>"/"Bench <label>" columns (None: none)
    value: type                 # float (strict JSON spells NaN/Infinity as strings) or int
    concat: Optional[Merge]     # merged from slices along a dim; None: not exactly
    partial: Optional[Merge]    # merged from the terms of an element-wise sum; None: not exactly
    meaning: str

    def merger(self, layout: str) -> Optional[Merge]:
        if layout == CONCAT:
            return self.concat
        if layout == PARTIAL:
            return self.partial
        return None


STATISTICS: tuple[Statistic, ...] = (
    Statistic("max", "max", float, _nan_or(max), None, "largest value"),
    Statistic("min", "min", float, _nan_or(min), None, "smallest value"),
    Statistic("mean", "mean", float, _mean, _sum_of_means, "mean over every element"),
    Statistic("norm", "l2norm", float, _norm, None, "L2 norm"),
    Statistic("nan", None, int, _count, None, "how many elements are NaN"),
    Statistic("inf", None, int, _count, None, "how many elements are +-inf"),
)
BY_KEY: dict[str, Statistic] = {s.key: s for s in STATISTICS}
KEYS: tuple[str, ...] = tuple(BY_KEY)
COLUMNS: tuple[tuple[str, str], ...] = tuple((s.key, s.column) for s in STATISTICS if s.column)


class Piece(NamedTuple):
    """One piece of a tensor: its statistics (as a descriptor holds them) and element count."""
    stats: Optional[Mapping[str, Any]]
    numel: int


def piece(desc: Mapping[str, Any]) -> Piece:
    """A tensor descriptor as a piece: its statistics and the element count of its shape (0
    for a shape that is missing or not a list of sizes, so a piece without statistics that
    says nothing of its size leaves the merge unknown)."""
    shape = desc.get("shape")
    numel = 0
    if isinstance(shape, list) and all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
        numel = 1
        for n in shape:
            numel *= n
    stats = desc.get("stats")
    return Piece(stats if isinstance(stats, Mapping) else None, numel)


def _number(v: Any) -> Optional[Number]:
    v = decode_float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return v


def merge(pieces: Sequence[Piece], layout: str = CONCAT,
          dropped: Optional[set[str]] = None) -> Optional[Statistics]:
    """The statistics of the tensor `pieces` make up in `layout`, exact in float64, spelled as a
    descriptor holds them (non-finite floats as strings).

    A statistic that does not merge exactly in this layout, that a piece lacks, or that this
    table does not know (a foreign tool's `md5`) is left out and its key added to `dropped`.
    None when a piece with elements has no statistics at all. Empty pieces count for nothing."""
    if layout not in LAYOUTS:
        raise ValueError(f"no layout {layout!r}; known: {', '.join(LAYOUTS)}")
    if dropped is None:
        dropped = set()
    pieces = [p for p in pieces if p.stats or p.numel != 0] or list(pieces[:1])
    if not pieces or any(not p.stats for p in pieces):
        return None
    named = dict.fromkeys(k for p in pieces for k in p.stats or {})
    dropped.update(k for k in named if k not in BY_KEY)
    out: dict[str, Any] = {}
    numels = [p.numel for p in pieces]
    for stat in STATISTICS:
        if stat.key not in named:
            continue
        values = [_number((p.stats or {}).get(stat.key)) for p in pieces]
        known = [v for v in values if v is not None]
        value: Optional[Number] = None
        if len(known) == len(values):
            if layout == REPLICA:
                first = known[0]
                same = all(v == first or (math.isnan(v) and math.isnan(first)) for v in known)
                value = first if same else None
            else:
                fn = stat.merger(layout)
                if fn is not None and (layout != PARTIAL or len(set(numels)) == 1):
                    value = fn(known, numels)
        if value is None:
            dropped.add(stat.key)
            continue
        out[stat.key] = int(value) if stat.value is int else encode_float(float(value))
    # The table's keys are `Statistics`' own (tests/store/test_statistics.py holds them together).
    return cast(Statistics, out)


__all__ = ["Statistic", "STATISTICS", "BY_KEY", "KEYS", "COLUMNS", "Piece", "piece", "merge", "LAYOUTS", "CONCAT",
           "PARTIAL", "REPLICA"]
