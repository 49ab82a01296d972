"""Small accelerator tensors copied into staging buffers on their device when described.

A small device tensor's statistics would cost some twenty kernel launches of host time; a copy
into a staging buffer costs one. At flush each buffer reaches the host in one transfer and is
reduced where it lands (host_stage.columns_of), as host staging does with small CPU tensors.
Used by stats.StatsBatch; run on CPU tensors in the tests (StatsBatch(cpu_as_device=True)).
"""
from __future__ import annotations

import torch

from .host_stage import PooledWork, reduce_segments


def settle(device: torch.device) -> None:
    """Wait for every stream of an accelerator before reading what capture queued on it: the
    staging copies and statistics kernels ran on whichever stream was current when each tensor
    was described, the host copy at flush runs on the current one."""
    if device.type == "cpu":
        return
    synchronize = getattr(getattr(torch, device.type, None), "synchronize", None)
    if synchronize is not None:
        synchronize(device)


_STAGE_CHUNK = 1 << 18      # elements per staging buffer (1 MB of float32)


class DeviceStaging(PooledWork):
    """Small tensors of one device copied into buffers there, of one width: float32 for
    floating dtypes up to 32 bits, float64 for float64, integers and bools (exact to 2**53).
    Copies are queued on the current stream like any op, so they see the values of the moment."""

    def __init__(self, device, dtype: torch.dtype):
        self.device, self.dtype = device, dtype
        self.chunks: list = []     # [buffer tensor, elements used]
        self.waiting: list = []    # (handles.Small, chunk index, offset, numel)
        with torch.inference_mode(False):
            self.landing = torch.empty(0, dtype=dtype)   # host memory the buffers are copied into

    def put(self, pending, t: torch.Tensor) -> None:
        """Queue the copy of t into a buffer (`pending`: its handles.Small, given its values and
        reductions at fetch)."""
        n = t.numel()
        if not self.chunks or self.chunks[-1][1] + n > self.chunks[-1][0].numel():
            # a normal tensor even when made in inference mode: later flushes write it outside
            with torch.inference_mode(False):
                buf = torch.empty(max(_STAGE_CHUNK, n), dtype=self.dtype, device=self.device)
            self.chunks.append([buf, 0])
        chunk = self.chunks[-1]
        start = chunk[1]
        chunk[0][start:start + n].view(t.shape).copy_(t)
        chunk[1] = start + n
        self.waiting.append((pending, len(self.chunks) - 1, start, n))

    def fetch(self) -> None:
        """Copy the buffers to the host (one transfer each) and hand each tensor its values and
        reductions, made there one buffer at a time (as host_stage.HostStaging.fetch does).

        The host memory is kept from one flush to the next: a landing tensor of this staging's
        own, and float64 work buffers from host_stage's pool, given back by `release` once the
        flush has read the values viewing them (fresh memory at every flush is faulted in again).
        """
        settle(self.device)
        total = sum(used for _, used in self.chunks)
        if self.landing.numel() < total:
            with torch.inference_mode(False):     # (as the buffers: see put)
                self.landing = torch.empty(1 << (total - 1).bit_length(), dtype=self.dtype)
        wide_all, squares_all = self._take_work(total)
        by_chunk: list = [[] for _ in self.chunks]
        for entry in self.waiting:
            by_chunk[entry[1]].append(entry)
        offset = 0
        for (buf, used), entries in zip(self.chunks, by_chunk):
            if entries:
                native = self.landing[offset:offset + used]
                native.copy_(buf[:used])
                reduced = reduce_segments(native.numpy(), wide_all[offset:offset + used],
                                          squares_all[offset:offset + used],
                                          [(start, n) for _, _, start, n in entries])
                for (pending, _, _, _), (values, columns) in zip(entries, reduced):
                    pending.values, pending.columns = values, columns
            offset += used
        self.waiting.clear()
        del self.chunks[1:]        # keep one buffer for the next flush
        if self.chunks:
            self.chunks[0][1] = 0


__all__ = ["DeviceStaging", "settle"]
