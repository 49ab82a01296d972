"""Tensors whose values changed outside torch between two recorded ops.

Descriptions are cached by tensor identity and version counter (describe.py): an op's output is
reduced once, and the next op that reads it shares those statistics. A write that bypasses the
version counter (through `.numpy()`, DLPack, an extension kernel writing through `data_ptr()`)
leaves the cache stale: the next op's input would show the earlier values, and that op would be
blamed for a difference it was handed. So a shared description is verified, cheaply:

- a small contiguous CPU tensor (<= 16k elements, most of a step's tensors): its bytes, read in
  place (no torch op), are compared with those copied when it was first described (host_stage.py),
  or, once they were reduced at a flush, with their hash;
- another small tensor (or one whose hash differs): its values are copied again when it is read
  (a clone, or one staging copy on a device) and its statistics, reduced at flush with the
  others, are compared with those of its first description;
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
from . import host_stage
from .host_stage import one_block
from . import stats as st


def verify(batch: Any, desc: dict, handle: Any, t: torch.Tensor, where: Any) -> Any:
    """Check a shared description of `t` (see module docstring). Returns the handle `desc` was
    filled from here (a check queued for flush, or the statistics of values found changed),
    or None to share `handle` as before."""
    if handle is None:
        return None
    if isinstance(handle, st._Small):
        if handle.values is None and handle.stats is None:    # its reduction failed
            return None
        if handle.digest is not None and one_block(t) and digest(t) == handle.digest:
            return None
        if handle.staged is not None and host_stage.same_bytes(handle, t):
            return None     # (its bytes, copied when first described, still wait for the flush)
        check = batch.snapshot(desc, t)
        if check is not None:
            check.original, check.where = handle, where
        return check
    if isinstance(handle, dict) and t.is_cpu:      # a large CPU tensor, reduced when described
        if _same_sum(t, handle):
            return None
        fresh = st.cpu_stats(t)
        if fresh == handle:
            return None
        desc["stats"] = fresh
        batch.on_outside(desc, None, where)
        return fresh
    return None


def digest(t: torch.Tensor) -> int:
    """A hash of the bytes of a CPU tensor that fills one memory block (`one_block`), read where
    they lie (a NumPy view would make its storage unresizable; a torch op costs more)."""
    return hash(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))


def _same_sum(t: torch.Tensor, stats: dict) -> bool:
    """Whether t's sum is still the one its statistics' mean came from (float32/64 tensors:
    cpu_stats sums them the same way); False when it cannot tell cheaply."""
    x = t.detach()
    if x.is_complex() or x.dtype not in st._FLOATING_WIDE or x.numel() == 0:
        return False
    flat = x.reshape(-1)
    return encode_float(flat.sum().item() / flat.numel()) == stats.get("mean")


def settle(pending: list, on_outside: Optional[Callable]) -> None:
    """After a flush's reduction: compare each check with its first description."""
    for p in pending:
        original = p.original
        if original is None:
            continue
        if (on_outside is not None and p.descs and original.stats is not None
                and p.stats is not None and p.stats != original.stats):
            on_outside(p.descs[0], p.values, p.where)
        p.values, p.descs, p.original, p.where = None, [], None, None


__all__ = ["verify", "settle", "digest", "one_block"]
