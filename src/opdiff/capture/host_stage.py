"""Small CPU tensors copied, byte for byte, into host staging buffers when they are described.

A small tensor's statistics cost more in per-call overhead than in arithmetic, so its values are
kept as they are at the moment of description and reduced with the others at flush (stats.py).
The copy is one `memmove` from the tensor's memory block into a NumPy buffer of its dtype: no
torch op (a clone is a dispatcher round trip, twice the host time), no NumPy view of the user's
storage (that would make it unresizable for good), the version counter untouched. At flush each
buffer becomes float64 values in one conversion, and the bytes of every tensor are hashed there
(handles.py compares a later read with that hash), not when it is described; a read before the
flush compares its bytes with the staged copy in place (`same_bytes`, one `memcmp`). Nothing is
hashed for a tensor that is gone by then (most of a step's activations and gradients at its last
flushes), nor at the step's last flush: its describer, the only reader of the hashes, ends with
the step.

Only contiguous tensors of a dtype NumPy reads exactly are staged (`stageable`); the others are
cloned as before. (A transposed tensor fills one block too, but its values would be summed in
memory order rather than in its own: the same statistics up to the last bit, not bit for bit.)
"""
from __future__ import annotations

import ctypes
import threading
from typing import Iterator

import numpy as np
import torch

# torch dtype -> the NumPy dtype its bytes are read as (bfloat16: as uint16, widened at flush)
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
          torch.bfloat16: np.uint16, torch.int8: np.int8, torch.uint8: np.uint8,
          torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64,
          torch.bool: np.bool_}
HOST_DTYPES = frozenset(_NUMPY)
_CHUNK_BYTES = 1 << 20
# Staging memory kept from one flush to the next, for the whole process (a debugger made per
# step, as `opdiff.dump()` does, finds it too): chunk buffers (bytes) and fetch's float64 work
# buffers (elements). Fresh memory at every flush cost more than the reductions (its pages are
# faulted in again: 7 of 26 ms of capture per step on a tiny Llama at L0, measured).
_KEEP_BYTES = 16 << 20
_KEEP_ELEMENTS = 2 << 20
_SMALL_WORK = 1 << 16     # work buffers below this are made fresh (no page faults to save)


class _Pool:
    """Emptied staging buffers, shared by every staging of the process: HostStaging's chunks,
    and the float64 work buffers of its fetch and of stats._Staging's (threads take and give
    under a lock: a buffer is only ever in one staging's hands). At most 48 MB are kept."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.chunks: list = []                  # uint8 buffers
        self.work: list = []                    # (float64 values, float64 squares) pairs

    def chunk(self, nbytes: int) -> np.ndarray:
        with self._lock:
            for i, buf in enumerate(self.chunks):
                if buf.size >= nbytes:
                    return self.chunks.pop(i)
        return np.empty(nbytes, dtype=np.uint8)

    def give_chunks(self, buffers) -> None:
        with self._lock:
            kept = sum(buf.size for buf in self.chunks)
            for buf in buffers:
                if kept + buf.size <= _KEEP_BYTES:
                    self.chunks.append(buf)
                    kept += buf.size

    def take_work(self, n: int) -> tuple:
        """Two float64 buffers of at least n elements: the smallest kept pair that fits (a
        flush reduces one dtype after another, each holding its pair until the flush ends)."""
        if n >= _SMALL_WORK:
            with self._lock:
                fits = [i for i, pair in enumerate(self.work) if pair[0].size >= n]
                if fits:
                    return self.work.pop(min(fits, key=lambda i: self.work[i][0].size))
            n = 1 << (n - 1).bit_length()      # room for the next flushes' growth
        return np.empty(n), np.empty(n)

    def give_work(self, pair: tuple) -> None:
        if not _SMALL_WORK <= pair[0].size <= _KEEP_ELEMENTS:
            return
        with self._lock:        # the largest pairs are kept, _KEEP_ELEMENTS in all
            self.work.append(pair)
            self.work.sort(key=lambda p: -p[0].size)
            while sum(p[0].size for p in self.work) > _KEEP_ELEMENTS:
                self.work.pop()


pool = _Pool()
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_memmove = ctypes.memmove


def _find_memcmp():
    """The C library's memcmp (None where ctypes cannot find one: bytes are then copied and
    compared by Python)."""
    for load in (lambda: ctypes.CDLL(None), lambda: ctypes.cdll.msvcrt):
        try:
            found = load().memcmp
        except (OSError, AttributeError, TypeError):
            continue
        found.restype = ctypes.c_int
        found.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
        return found
    return None


_memcmp = _find_memcmp()


def same_memory(a: int, b: int, nbytes: int) -> bool:
    """Whether the `nbytes` bytes at addresses a and b are the same (compared in place)."""
    if _memcmp is not None:
        return _memcmp(a, b, nbytes) == 0
    return ctypes.string_at(a, nbytes) == ctypes.string_at(b, nbytes)


def stageable(t: torch.Tensor) -> bool:
    """Whether `put` can take t (a small, non-empty, strided CPU tensor is assumed)."""
    return (type(t) in _PLAIN and t.dtype in _NUMPY and not t.is_neg() and not t.is_conj()
            and t.is_contiguous())


def one_block(t: torch.Tensor) -> bool:
    """Whether t's elements fill one memory block from data_ptr() on: contiguous, or dense in
    another order of its dimensions with positive strides (a transpose, a permute)."""
    if t.is_contiguous():
        return True
    key = (t.stride(), t.shape)     # (answered once per layout: the sort costs 3-4 us)
    found = _layouts.get(key)
    if found is None:
        found = _dense(*key)
        if len(_layouts) < 4096:
            _layouts[key] = found
    return found


_layouts: dict = {}     # (strides, shape) -> whether a tensor of that layout fills one block


def _dense(strides: tuple, shape: tuple) -> bool:
    expected = 1
    for stride, size in sorted(zip(strides, shape)):    # (size-1 dimensions do not count)
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True


def flat_in_memory_order(t: torch.Tensor) -> torch.Tensor:
    """t's elements as one dimension: in memory order, without a copy, where they fill one
    block (`one_block`: a transpose or a permute of a dense tensor), so that every tensor over
    the same block is summed in the same order; else `reshape(-1)`."""
    if not t.is_contiguous() and one_block(t):
        return t.as_strided((t.numel(),), (1,))
    return t.reshape(-1)


class PooledWork:
    """A staging whose fetch reduces its buffers in float64 work buffers from the pool: the
    values it hands out view them, so they are held until `release` (the flush has read them)."""

    _work: tuple | None = None

    def _take_work(self, total: int) -> tuple:
        # (a second fetch before release leaves the first one's buffers to whoever reads them)
        self._work = pool.take_work(total)
        return self._work

    def release(self) -> None:
        """The values handed out by fetch are no longer read: their work buffers go back to
        the process's pool."""
        if self._work is not None:
            pool.give_work(self._work)
            self._work = None


def reduce_segments(native: np.ndarray, wide: np.ndarray, squares: np.ndarray,
                    segments: list) -> Iterator[tuple[np.ndarray, tuple]]:
    """(values, columns_of reductions) of each consecutive segment (start, numel) of one staging
    buffer's values `native`: the values as float64 views of `wide`, filled here (`squares`: a
    work buffer of its size)."""
    np.copyto(wide, native)
    starts = np.fromiter((start for start, _ in segments), dtype=np.intp, count=len(segments))
    for (start, n), columns in zip(segments, columns_of(native, wide, starts, squares)):
        yield wide[start:start + n], columns


class HostStaging(PooledWork):
    """Byte copies of small CPU tensors of one dtype, in reusable buffers of 1 MB."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.np_dtype = _NUMPY[dtype]
        self.itemsize = np.dtype(self.np_dtype).itemsize
        self.chunks: list = []     # [uint8 buffer, its address, bytes used]
        self.waiting: list = []    # (handles.Small, chunk index, byte offset, bytes)

    def put(self, pending, t: torch.Tensor) -> None:
        """Copy t's values now (the caller checked `stageable`)."""
        self.put_block(pending, t.data_ptr(), t.numel())

    def put_block(self, pending, ptr: int, numel: int) -> None:
        """Copy the `numel` values at `ptr` (a stageable tensor's data pointer) now."""
        nbytes = numel * self.itemsize
        chunks = self.chunks
        if not chunks or chunks[-1][2] + nbytes > chunks[-1][0].size:
            buf = pool.chunk(max(_CHUNK_BYTES, nbytes))
            chunks.append([buf, buf.ctypes.data, 0])
        chunk = chunks[-1]
        start = chunk[2]
        _memmove(chunk[1] + start, ptr, nbytes)
        chunk[2] = start + nbytes
        pending.staged = (chunk[0], start, nbytes, chunk[1] + start)
        self.waiting.append((pending, len(chunks) - 1, start, nbytes))

    def fetch(self, digests: bool = True) -> None:
        """Hand each waiting tensor its values as float64, the hash of its bytes (unless not
        `digests`: nothing will read them), and its reductions (`columns`): each buffer is
        reduced where it lies, its tensors being consecutive segments of it.

        The values are views of a work buffer that is reused once `release` gives it back: they
        are read before this flush ends (stats.StatsBatch.resolve), and copied by whatever
        keeps them."""
        size = self.itemsize
        by_chunk: list = [[] for _ in self.chunks]
        for entry in self.waiting:
            by_chunk[entry[1]].append(entry)
        total = sum(used for _, _, used in self.chunks) // size
        wide_all, squares_all = self._take_work(total)
        offset = 0
        for (buf, _, used), entries in zip(self.chunks, by_chunk):
            n = used // size
            if entries:
                segments = [(start // size, nbytes // size) for _, _, start, nbytes in entries]
                reduced = reduce_segments(_native(buf[:used], self.np_dtype), wide_all[offset:offset + n],
                                          squares_all[offset:offset + n], segments)
                for (pending, _, start, nbytes), (values, columns) in zip(entries, reduced):
                    # (a tensor gone is never read again: nothing to verify)
                    if digests and (pending.ref is None or pending.ref() is not None):
                        pending.digest = hash(buf[start:start + nbytes].tobytes())
                    pending.staged = None
                    pending.values, pending.columns = values, columns
            offset += n
        self.waiting.clear()
        pool.give_chunks([buf for buf, _, _ in self.chunks])
        self.chunks.clear()


def same_bytes(pending, t: torch.Tensor) -> bool:
    """Whether t's memory block holds the bytes staged for `pending` (still waiting for its
    flush); False when t does not fill one block (handles.py then copies it again)."""
    nbytes, address = pending.staged[2:]
    if t.numel() * t.element_size() != nbytes or not one_block(t):
        return False
    return same_memory(t.data_ptr(), address, nbytes)


def _native(raw: np.ndarray, np_dtype) -> np.ndarray:
    """A buffer's bytes as values of their dtype (bfloat16: as the float32 it is the upper half
    of, exactly)."""
    values = raw.view(np_dtype)
    if np_dtype is np.uint16:
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values


def columns_of(native: np.ndarray, wide: np.ndarray, starts: np.ndarray,
               squares: np.ndarray | None = None) -> list:
    """(min, max, sum, sum of squares, all four finite) of each segment of a 1-D array that
    begins at `starts` (ascending, the first 0), as Python numbers: `native` holds the values
    in any exact dtype, `wide` the same values as float64 (`squares`, if given, a float64 work
    buffer of its size). Min and max are taken on `native` (a widening conversion keeps order:
    the same numbers, half the memory read); the sums accumulate in float64."""
    with np.errstate(all="ignore"):
        mn = np.minimum.reduceat(native, starts).astype(np.float64, copy=False)
        mx = np.maximum.reduceat(native, starts).astype(np.float64, copy=False)
        total = np.add.reduceat(wide, starts)
        squares = np.add.reduceat(np.multiply(wide, wide, out=squares), starts)
    finite = np.isfinite(mn) & np.isfinite(mx) & np.isfinite(total) & np.isfinite(squares)
    return list(zip(mn.tolist(), mx.tolist(), total.tolist(), squares.tolist(), finite.tolist()))


__all__ = ["HOST_DTYPES", "HostStaging", "PooledWork", "columns_of", "pool", "reduce_segments", "same_bytes",
           "same_memory", "stageable", "flat_in_memory_order"]
