"""One big step/rank pair cut into shards: its tensor measurements spread over several tasks.

    from opdiff.comparison.shards import plan, measure_shard
    groups = plan(target_path, golden_path, shard_bytes=256 << 20)   # [] when one task will do
    parts = [measure_shard(target_path, golden_path, g) for g in groups]   # each a Ray task
    compare_pair(t, g, measured=merged(parts))     # rows, blame and replay as without shards

The tensors a pair measures are found as `compare_pair` finds them: the two op sequences
aligned (`align`), each record's tensors matched by their name within the record. A pair of saved
tensors (both descriptors carry a key) of the same recorded shape, with values that mean
something and at least one element, is planned; each distinct (target key, golden key) once,
since records share saved tensors. The list, in execution order, is cut into groups of about
`shard_bytes` of saved bytes (both sides). A shard opens both dumps by path and loads one tensor
pair at a time, so its memory is two tensors; it returns only the Measurements. A pair it could
not measure (a shard that cannot be read, saved shapes that differ) is left out, and
`compare_pair` measures it itself, with the same words as without shards: the planned set only
decides where the work runs, never the result.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from ..errors import OpdiffError
from ..store.records import iter_tensors
from .align import align
from ..store.schema import Descriptor, Record

KeyPair = tuple[str, str]
Scores = dict[KeyPair, Any]            # (target key, golden key) -> metrics.Measurement

_ITEM_BYTES = {"float64": 8, "int64": 8, "complex64": 8, "complex128": 16, "float32": 4,
               "int32": 4, "float16": 2, "bfloat16": 2, "int16": 2}
_UNREAD = ("overwritten", "uninitialized")     # capture's Describer.unread flags


def _nbytes(desc: Descriptor) -> int:
    n = 1
    for s in desc.get("shape") or ():
        n *= int(s)
    return n * _ITEM_BYTES.get(str(desc.get("dtype")), 1)


def _measurable(td: Descriptor, gd: Descriptor) -> bool:
    return bool(td.get("key") and gd.get("key")) and td.get("shape") == gd.get("shape") and \
        _nbytes(td) > 0 and not any(td.get(f) or gd.get(f) for f in _UNREAD)


def tensor_pairs(t_records: list[Record], g_records: list[Record],
                 shape_flag: bool = False) -> list[tuple[KeyPair, int]]:
    """((target key, golden key), bytes of both) of every saved tensor pair the compare of these
    records measures, each once, in execution order."""
    seen: set[KeyPair] = set()
    out: list[tuple[KeyPair, int]] = []
    for ti, gi in align(t_records, g_records, shape_flag=shape_flag):
        if ti is None or gi is None:
            continue
        t_rec, g_rec = t_records[ti], g_records[gi]
        g_by = {n[len(g_rec["name"]):]: d for n, _role, d in iter_tensors(g_rec)}
        for name, _role, td in iter_tensors(t_rec):
            gd = g_by.get(name[len(t_rec["name"]):])
            if gd is None or not _measurable(td, gd):
                continue
            pair = (str(td["key"]), str(gd["key"]))
            if pair not in seen:
                seen.add(pair)
                out.append((pair, _nbytes(td) + _nbytes(gd)))
    return out


def cut(pairs: list[tuple[KeyPair, int]], shard_bytes: int) -> list[list[KeyPair]]:
    """`pairs` in consecutive groups of about `shard_bytes` each (a group holds at least one
    pair); [] when they fit in one: the pair's own task measures them then."""
    if sum(b for _p, b in pairs) <= shard_bytes:
        return []
    groups: list[list[KeyPair]] = [[]]
    size = 0
    for pair, nbytes in pairs:
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(pair)
        size += nbytes
    return groups


def plan(target_path: str, golden_path: str, shard_bytes: int,
         shape_flag: bool = False) -> list[list[KeyPair]]:
    """The shards of one pair (a task: it reads both dumps' records by path); [] when the pair
    holds no more than `shard_bytes` of saved tensors, or none (a statistics dump)."""
    from ..store.adapters import discover

    t, g = discover(target_path)[0], discover(golden_path)[0]
    if not (t.holds_tensors and g.holds_tensors):
        return []
    return cut(tensor_pairs(list(t.records()), list(g.records()), shape_flag), shard_bytes)


def measure_shard(target_path: str, golden_path: str, pairs: Iterable[KeyPair]) -> Scores:
    """A task: the Measurement of each tensor pair of one shard, loading one pair at a time."""
    import torch

    from ..store.adapters import discover
    from .metrics import measure

    torch.set_num_threads(1)    # as each pair's worker: one task per CPU the engine gives it
    t, g = discover(target_path)[0], discover(golden_path)[0]
    out: Scores = {}
    for t_key, g_key in pairs:
        try:
            tt, gt = t.tensor(t_key), g.tensor(g_key)
        except OpdiffError:
            raise                   # the dump's own error, as compare_pair raises it
        except Exception:  # noqa: BLE001 - compare_pair reads it again and says what it uses
            continue
        if tuple(tt.shape) == tuple(gt.shape):
            out[(t_key, g_key)] = measure(tt, gt)
        del tt, gt
    return out


def merged(parts: Iterable[Optional[Scores]]) -> Scores:
    """The shards' scores as one table for `compare_pair(measured=...)`."""
    out: Scores = {}
    for part in parts:
        out.update(part or {})
    return out


__all__ = ["plan", "cut", "tensor_pairs", "measure_shard", "merged", "KeyPair", "Scores"]
