"""Which saved tensor's bytes a tensor about to be saved repeats, so that the writer stores a
reference to it (`reader.REF_PREFIX`) instead of the bytes again.

Two ways to repeat them: a view of a saved tensor's memory, unchanged since (the output of view,
transpose, reshape, expand, getitem; found by storage and version counter, `Aliases.link`), and
a tensor of its own holding the very bytes of one written before (a clone, a copy, zeros again;
found by dtype, size and sampled elements, `Aliases.same_bytes`). Either way the reference is
only made once all its bytes have been compared with those written for the other (`Ref.entry`),
so writes the version counter misses (`.data`, numpy) or a sample that happens to agree cannot
make one wrong. A reference is always to a tensor written before it, in the same shard or an
earlier one: it is durable whenever its base is.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import torch

_SAME_SIZE_INTS: dict[int, str] = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
_MIN_REF_BYTES = 256     # a reference's header entry costs about as much as this many bytes
_SAMPLE: Any = None      # the element indices a fingerprint samples (times a large odd number)


class _Memory:
    """A CPU tensor's bytes as NumPy sees them through `__array_interface__`: unlike
    `Tensor.numpy()`, which marks the tensor's storage unresizable for good (FSDP2's
    `storage.resize_(0)` then fails on the user's parameters), it leaves the storage alone."""

    __slots__ = ("__array_interface__",)

    def __init__(self, t: torch.Tensor, size: int) -> None:
        self.__array_interface__ = {"data": (t.data_ptr(), True),
                                    "shape": (t.numel() * t.element_size() // size,),
                                    "typestr": f"<u{size}", "version": 3}


def host_elements(t: torch.Tensor, size: int | None = None) -> Any:
    """A NumPy array over the memory of a contiguous CPU tensor, as unsigned integers of `size`
    bytes (default: its element size, which must then be 1, 2, 4 or 8), without a copy: the
    tensor must stay alive while it is used."""
    import numpy as np

    size = size or t.element_size()
    if t.numel() == 0:
        return np.empty(0, dtype=f"<u{size}")
    return np.asarray(_Memory(t, size))


class Base:
    """A tensor written whole, which later views of its memory (`weak`: a weak reference to the
    storage, `start`: its first byte there) or copies of its bytes may refer to; its `shard` and
    `offset` once written (None until then, or for good if that failed)."""

    __slots__ = ("key", "weak", "start", "nbytes", "dtype", "version", "shard", "offset")

    def __init__(self, key: str, weak: int, start: int, nbytes: int, dtype: Any, version: int):
        self.key, self.weak, self.start, self.nbytes, self.dtype = key, weak, start, nbytes, dtype
        self.version, self.shard, self.offset = version, cast("Any", None), 0


class Ref:
    """A view of a saved base: its elements at `offset`, `shape`, `stride` (of the base, flat)."""

    __slots__ = ("base", "offset", "shape", "stride")

    def __init__(self, base: Base, offset: int, shape: list[int], stride: list[int]):
        self.base, self.offset, self.shape, self.stride = base, offset, shape, stride

    def entry(self, t: torch.Tensor) -> dict[str, Any] | None:
        """The reference to write for `t`, or None unless its bytes are those written for the base."""
        import torch

        base = self.base
        if base.shard is None:         # not written (it failed): write t itself
            return None
        size = base.dtype.itemsize
        span = sum((n - 1) * st for n, st in zip(self.shape, self.stride)) + 1   # elements it reaches
        data = base.shard.read(base.offset + self.offset * size, span * size)
        ints = getattr(torch, _SAME_SIZE_INTS[size])
        seen = data.view(ints).as_strided(self.shape, self.stride, 0)
        if not torch.equal(seen, t.view(ints)):
            return None
        return {"base": base.key, "offset": self.offset, "shape": self.shape, "stride": self.stride}


class Aliases:
    """Which saved tensor's memory a new tensor views (a view, transpose, reshape, expand or
    getitem of it): it is then stored as a reference to that tensor, not as its bytes again.

    Bases are found by storage (alive: a weak reference to it) and version counter (unchanged
    as far as autograd counts); the bytes are then compared with those written for the base
    (`Ref.entry`), so writes the counter misses (`.data`, numpy) cannot make one wrong."""

    def __init__(self, same_bytes: bool = True) -> None:
        global _SAMPLE
        if _SAMPLE is None:
            import numpy as np

            _SAMPLE = (np.arange(32, dtype=np.int64) * 2654435761 + 7919)
        self.same_bytes_too = same_bytes
        self.by_storage: dict[int, list[Base]] = {}
        self.by_content: dict[tuple[Any, ...], list[Base]] = {}   # fingerprint -> written tensors
        self.added = 0
        self.picks: dict[int, Any] = {}      # numel -> the elements a fingerprint samples

    def same_bytes(self, t: torch.Tensor) -> tuple[list[Ref], tuple[Any, ...] | None]:
        """For a contiguous tensor about to be written: `Ref`s to the written ones with the same
        dtype, size and sampled elements (to be compared whole), latest first, and t's
        fingerprint."""
        n, size = t.numel(), t.dtype.itemsize
        if not self.same_bytes_too or n * size < _MIN_REF_BYTES or size not in _SAME_SIZE_INTS:
            return [], None
        data = host_elements(t)              # t's elements (t is contiguous), not a copy
        picks = self.picks.get(n)
        if picks is None:
            # scattered, not evenly spaced: every 1/16th of an activation is the same pixel of
            # another image, often a zero of a padded border in all of them
            picks = self.picks[n] = _SAMPLE % n
        # numel, not shape: a reshape's copy (on a device, every view is one) has the same bytes
        fingerprint = (t.dtype, n, data.reshape(-1)[picks].tobytes())
        stride = [math.prod(t.shape[i + 1:]) for i in range(t.dim())]
        return [Ref(base, 0, list(t.shape), stride) for base in reversed(self.by_content.get(fingerprint, ()))
                if base.shard is not None], fingerprint

    def written(self, fingerprint: tuple[Any, ...], base: Base) -> None:
        """Note a tensor written whole, under its fingerprint (the last 4 of each)."""
        bases = self.by_content.setdefault(fingerprint, [])
        bases.append(base)
        del bases[:-4]

    def link(self, key: str, t: torch.Tensor) -> Base | Ref | None:
        """A `Ref` when t views a saved base; else the `Base` t becomes once written (when
        its memory is contiguous), else None."""
        import torch

        if (t.layout != torch.strided or t.is_meta or not t.numel()
                or t.dtype.itemsize not in _SAME_SIZE_INTS or t.is_neg() or t.is_conj()):
            return None
        try:
            version = t._version
            storage = t.untyped_storage()
            start = t.data_ptr() - storage.data_ptr()
        except (RuntimeError, NotImplementedError):   # inference tensors, storage-less layouts
            return None
        cdata, size = storage._cdata, t.dtype.itemsize
        bases = self.by_storage.get(cdata)
        if bases and torch.UntypedStorage._expired(bases[0].weak):   # freed; cdata reused
            self._forget(cdata)
            bases = None
        if bases and t.numel() * size >= _MIN_REF_BYTES:
            extent = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
            for base in reversed(bases):
                if (base.dtype == t.dtype and base.version == version and base.start <= start
                        and start + (extent + 1) * size <= base.start + base.nbytes
                        and (start - base.start) % size == 0):
                    return Ref(base, (start - base.start) // size, list(t.shape), list(t.stride()))
        if not t.is_contiguous():
            return None
        base = Base(key, cast(int, storage._weak_ref()), start, t.numel() * size, t.dtype, version)
        self.by_storage.setdefault(cdata, []).append(base)
        self.added += 1
        if self.added % 1024 == 0:
            self._sweep()
        return base

    def _sweep(self, everything: bool = False) -> None:
        """Forget the bases of freed storages (with `everything`, all)."""
        import torch

        for cdata, bases in list(self.by_storage.items()):
            if everything or torch.UntypedStorage._expired(bases[0].weak):
                self._forget(cdata)

    def _forget(self, cdata: int) -> None:
        import torch

        for base in self.by_storage.pop(cdata):
            torch.UntypedStorage._free_weak_ref(base.weak)


