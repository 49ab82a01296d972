"""Statistics of one logical tensor from its pieces' statistics, exactly, in float64.

    merge_shards([{"max":, "min":, "mean":, "norm":, "nan":, "inf":}, ...], [numel, ...])

Pieces that together hold every element once (shards, data-parallel slices, pipeline stages'
halves): max and min are the pieces' max and min, the mean is weighted by element count, the
norm is the root of the sum of squared norms, nan and inf counts add. Partial sums cannot be
merged from statistics (the max of a sum is not a sum of maxima): `None`, and the caller says
so. Shards and replicas merge through the statistics table (`store/statistics.py`); what is
particular to layouts (a partial sum scaled by its coefficient, a loss summed over ranks) is here.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from ...store.records import decode_float, encode_float
from ...store.schema import Descriptor, Statistics
from ...store.statistics import CONCAT, REPLICA, Piece, merge

_KEYS = ("max", "min", "mean", "norm")
# A descriptor's shape, dtype and statistics' values (compared for equality only).
Signature = tuple[tuple[int, ...], Optional[str], tuple[object, ...]]


def _floats(stats: Statistics) -> Optional[dict[str, float]]:
    try:
        return {k: float(decode_float(stats.get(k))) for k in _KEYS}   # (absent: TypeError)
    except (KeyError, TypeError, ValueError):
        return None


def merge_shards(pieces: Sequence[Optional[Statistics]],
                 numels: Sequence[int]) -> Optional[Statistics]:
    """The statistics of the concatenation of `pieces` (None where one piece has none): the
    table's exact merge (`store.statistics.merge`, layout `concat`)."""
    if not pieces or any(not isinstance(p, dict) or _floats(p) is None for p in pieces):
        return None
    if not any(n > 0 for n in numels):
        first = pieces[0]
        return first.copy() if first is not None else {}
    return merge([Piece(p, n) for p, n in zip(pieces, numels) if n > 0], CONCAT)


def scaled(stats: Optional[Statistics], factor: float) -> Optional[Statistics]:
    """The statistics of a tensor multiplied by `factor` > 0 (exact: each is linear in it)."""
    if factor == 1.0 or not isinstance(stats, dict):
        return stats
    f = _floats(stats)
    if f is None:
        return None
    out = stats.copy()
    out["max"], out["min"], out["mean"], out["norm"] = (encode_float(f[k] * factor) for k in _KEYS)
    return out


def combined_scalars(pieces: Sequence[Optional[Statistics]],
                     coefficients: Sequence[float]) -> Optional[Statistics]:
    """The statistics of sum(c * x) over one-element pieces x (a data-parallel rank's loss: the
    whole batch's is the ranks' weighted by their share), exact from their values."""
    floats = [_floats(p) if isinstance(p, dict) else None for p in pieces]
    if not floats or any(f is None for f in floats):
        return None
    value = math.fsum(c * f["mean"] for c, f in zip(coefficients, floats) if f is not None)
    out: Statistics = {"max": encode_float(value), "min": encode_float(value),
                       "mean": encode_float(value), "norm": encode_float(abs(value))}
    counts = [(p or {}).get(k) for p in pieces for k in ("nan", "inf")]
    if all(isinstance(c, int) for c in counts):
        out["nan"] = int(not math.isfinite(value) and math.isnan(value))
        out["inf"] = int(math.isinf(value))
    return out


def signature(desc: Descriptor) -> Signature:
    """A descriptor's shape, dtype and statistics as they were recorded: equal on two ranks
    when they hold the same values (a replica, or the tensor a DTensor was made of)."""
    s = desc.get("stats") or {}
    return (tuple(desc.get("shape") or ()), desc.get("dtype"),
            tuple(s.get(k) for k in _KEYS))


def same(a: Optional[Statistics], b: Optional[Statistics]) -> bool:
    """Two replicas' statistics are the same (exactly: replicas are copies)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return a == b
    if _floats(a) is None or _floats(b) is None:
        return a == b
    dropped: set[str] = set()
    merge([Piece(a, 1), Piece(b, 1)], REPLICA, dropped)
    return not dropped & set(_KEYS)


__all__ = ["merge_shards", "same", "signature", "scaled", "combined_scalars"]
