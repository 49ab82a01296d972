"""Where a descriptor's statistics come from, and how a later read of the same tensor is verified.

`StatsBatch.add` (stats.py) returns a handle for every tensor it describes; the describer keeps
it with the tensor's identity and version counter, so that the next op reading the unchanged
tensor shares those statistics (`handle.share(batch, desc)`) instead of reducing it again. One
handle type, three kinds:

- `Known`: statistics known now (a large CPU tensor, reduced when described), or none at all;
- `Small`: a small tensor's values copied when described, reduced with the others at flush;
- `DeviceVector`: a large device tensor's six numbers, reduced there, fetched at flush.

Writes outside torch. A write that bypasses the version counter (through `.numpy()`, DLPack, an
extension kernel writing through `data_ptr()`) leaves a shared description stale: the next op's
input would show the earlier values, and that op would be blamed for a difference it was handed.
So a shared description is verified (`handle.verify(batch, desc, t, where)`), cheaply, by the
handle that knows how its numbers were made:

- a small contiguous CPU tensor (<= 16k elements, most of a step's tensors): its bytes, read in
  place (no torch op), are compared with those copied when it was first described (host_stage.py),
  or, once they were reduced at a flush, with their hash;
- a small tensor over one memory block that was cloned (a transpose): its bytes are compared in
  place with the clone's, or, once the clone was reduced at a flush, with the hash the flush
  took of the clone's bytes (the same bytes in the same order: a clone keeps a dense tensor's
  strides);
- another small tensor (or one whose hash differs): its values are copied again when it is read
  (a clone, or one staging copy on a device) and its statistics, reduced at flush with the
  others, are compared with those of its first description (`settle`);
- a large CPU tensor: its sum is taken again (one pass) and compared with the one its statistics
  were made from; a mismatch is confirmed by reducing it again;
- a large device tensor is not verified (its check would cost a kernel per read on the host).

When the values differ, the reader's descriptor gets the statistics of what it read, and
`"outside": true`, `"leaf": "outside"`, `"fqn"`: its tensor name (the comparison names the origin
"outside", see opdiff.comparison.origins); with task="tensor" the values it read are saved.
"""
from __future__ import annotations

import ctypes
from typing import Any, Callable, Optional

import torch

from ..store.records import encode_float
from .host_stage import flat_in_memory_order, one_block, same_bytes, same_memory

# The dtypes whose CPU statistics are reduced where they lie (stats.cpu_stats), so that a sum
# taken again is comparable with the mean they gave.
SUMMED_AS_IS = (torch.float32, torch.float64)


class Handle:
    """The statistics of one described tensor (see the module docstring)."""

    __slots__ = ()

    def share(self, batch: Any, desc: dict) -> None:
        """Give `desc` these statistics: now if they are known, else when `batch` resolves."""
        raise NotImplementedError

    def verify(self, batch: Any, desc: dict, t: torch.Tensor, where: Any) -> Optional[Handle]:
        """Check that `t` still holds the values these statistics describe. Returns the handle
        `desc` was filled from here (a check queued for flush, or the statistics of values
        found changed, reported to `batch.on_outside`), or None to share this one as before."""
        return None


class Known(Handle):
    """Statistics known when the tensor was described (a large CPU tensor's), or None: none
    can be had (an empty or meta tensor)."""

    __slots__ = ("stats",)

    def __init__(self, stats: Optional[dict]):
        self.stats = stats

    def share(self, batch: Any, desc: dict) -> None:
        desc["stats"] = self.stats

    def verify(self, batch: Any, desc: dict, t: torch.Tensor, where: Any) -> Optional[Handle]:
        if self.stats is None or not t.is_cpu:
            return None
        if same_sum(t, self.stats):
            return None
        fresh = batch.reduce_now(t)
        if fresh == self.stats:
            return None
        desc["stats"] = fresh
        batch.on_outside(desc, None, where)
        return Known(fresh)


NO_STATS = Known(None)


class DeviceVector(tuple, Handle):
    """A large device tensor's (max, min, sum, norm, nan, inf), reduced on its device into one
    float64 vector (`stats.device_vector`) and fetched with the others at flush: the pair
    (vector, numel). Not verified."""

    __slots__ = ()

    def __new__(cls, vector: torch.Tensor, numel: int) -> DeviceVector:
        return tuple.__new__(cls, (vector, numel))

    @property
    def vector(self) -> torch.Tensor:
        return self[0]

    @property
    def numel(self) -> int:
        return self[1]

    def share(self, batch: Any, desc: dict) -> None:
        batch.queue_vector(desc, self)


STAGED = object()    # `Small.values` while they wait in a staging buffer
# `Small.digest` of a clone over one memory block: hashed from the clone at flush (hash() never
# returns -1 in CPython, so no digest of any bytes is this value)
AT_FLUSH = -1


class Small(Handle):
    """A small tensor waiting to be reduced with the others of its flush: its values (a float64
    NumPy copy, a clone), or STAGED while they wait in a staging buffer (host_stage.py,
    device_stage.py). Once reduced, `values` is None and `stats` holds the statistics (None if
    the reduction failed). A check made by `verify` keeps its values until `settle`."""

    __slots__ = ("values", "stats", "descs", "original", "where", "digest", "staged", "columns",
                 "ref")

    def __init__(self, values: Any, desc: dict):
        self.values, self.stats, self.descs = values, None, [desc]
        self.original: Small | None = None   # a check: the first description
        self.where: Any = None
        self.digest: int | None = None     # a contiguous CPU tensor's bytes, hashed (or AT_FLUSH)
        # (host buffer, offset, bytes, address) until flush (host_stage.py)
        self.staged: tuple | None = None
        self.columns: tuple | None = None  # its reductions, when its buffer made them at flush
        self.ref: Any = None   # a weak reference to its tensor, where the describer made one

    def share(self, batch: Any, desc: dict) -> None:
        if self.values is None:      # reduced already (or failed: None)
            desc["stats"] = self.stats
        else:
            self.descs.append(desc)

    def verify(self, batch: Any, desc: dict, t: torch.Tensor, where: Any) -> Optional[Handle]:
        if self.values is None and self.stats is None:    # its reduction failed
            return None
        if self.digest is not None and one_block(t) and digest(t) == self.digest:
            return None
        if self.staged is not None and same_bytes(self, t):
            return None     # (its bytes, copied when first described, still wait for the flush)
        if self.digest == AT_FLUSH and same_clone(self.values, t):
            return None     # (its clone still waits for the flush)
        check = batch.snapshot(desc, t)
        if check is not None:
            check.original, check.where = self, where
        return check


def settle(pending: list, on_outside: Optional[Callable]) -> None:
    """After a flush's reduction: compare each check (`Small.verify`) with its first description."""
    for p in pending:
        original = p.original
        if original is None:
            continue
        if (on_outside is not None and p.descs and original.stats is not None
                and p.stats is not None and p.stats != original.stats):
            on_outside(p.descs[0], p.values, p.where)
        p.values, p.descs, p.original, p.where = None, [], None, None


def digest(t: torch.Tensor) -> int:
    """A hash of the bytes of a CPU tensor that fills one memory block (`one_block`), read where
    they lie (a NumPy view would make its storage unresizable; a torch op costs more)."""
    return hash(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))


def same_clone(values: Any, t: torch.Tensor) -> bool:
    """Whether `values`, a clone of a tensor over one memory block (same strides), holds t's
    bytes: compared in place, in memory order."""
    if not isinstance(values, torch.Tensor):
        return False
    nbytes = t.numel() * t.element_size()
    if values.numel() * values.element_size() != nbytes or not one_block(t) or not one_block(values):
        return False
    return same_memory(t.data_ptr(), values.data_ptr(), nbytes)


def same_sum(t: torch.Tensor, stats: dict) -> bool:
    """Whether t's sum is still the one its statistics' mean came from (float32/64 tensors:
    cpu_stats sums them the same way); False when it cannot tell cheaply."""
    x = t.detach()
    if x.is_complex() or x.dtype not in SUMMED_AS_IS or x.numel() == 0:
        return False
    flat = flat_in_memory_order(x)
    return encode_float(flat.sum().item() / flat.numel()) == stats.get("mean")


__all__ = ["Handle", "Known", "NO_STATS", "DeviceVector", "Small", "STAGED", "AT_FLUSH", "settle",
           "digest", "same_clone", "same_sum", "SUMMED_AS_IS"]
