"""Turn call arguments into descriptors (see store/records.py) and queue their statistics."""
from __future__ import annotations

import weakref

import torch

from ..store.records import scalar_descriptor
from ..store.schema import tensor_name

_MAX_REPR = 120


class Describer:
    """Builds descriptors for one session step: statistics batched, tensors saved once each.

    `save` decides whether full tensors are kept (task="tensor"). A tensor already saved and not
    modified since (same object, same version counter) is referenced by its first key instead of
    being written again: parameters read by many ops are stored once.
    """

    def __init__(self, stats, writer, save: bool):
        self.stats = stats
        self.writer = writer
        self.save = save
        self._saved: dict = {}   # id(tensor) -> (weakref, version, key)
        self._stats: dict = {}   # id(tensor) -> (weakref, version, stats handle)
        self._blocks: dict = {}  # (address, numel, dtype) of a dense tensor -> same as _stats
        self._by_storage: dict = {}   # storage address -> ids of cached tensors viewing it

    def forget(self, values) -> None:
        """Drop what is known about tensors sharing memory with `values`: called once an op
        that writes into them has been described.

        Version counters miss writes through `.data` (a separate tensor object sharing the
        storage), so entries are found by storage address, not by tensor identity.
        """
        for t in tensors_in(values):
            for key in self._by_storage.pop(_storage(t), ()):
                self._saved.pop(key, None)
                self._stats.pop(key, None)
                self._blocks.pop(key, None)

    def _remember(self, table: dict, t: torch.Tensor, entry: tuple) -> None:
        try:
            table[id(t)] = (weakref.ref(t),) + entry
        except TypeError:
            return
        self._by_storage.setdefault(_storage(t), set()).add(id(t))

    def _remember_stats(self, t: torch.Tensor, version: int, handle, block) -> None:
        """One entry for t, under its id and, when it is new, under its memory block."""
        try:
            entry = (weakref.ref(t), version, handle)
        except TypeError:
            return
        self._stats[id(t)] = entry
        address = _storage(t)
        keys = self._by_storage.get(address)
        if keys is None:
            keys = self._by_storage[address] = set()
        keys.add(id(t))
        if block is not None:
            self._blocks[block] = entry
            keys.add(block)

    def describe(self, value, record: str, role: str, slot, depth: int = 0) -> dict:
        """The descriptor of one argument or result: tensor `record.role.slot` (see
        `store.schema.tensor_name`; the name is only built for a tensor that is saved)."""
        if isinstance(value, torch.Tensor):
            return self.tensor(value, record, role, slot)
        scalar = scalar_descriptor(value, _MAX_REPR)
        if scalar is not None:
            return scalar
        if isinstance(value, torch.dtype):
            return {"type": "dtype", "value": str(value)}
        if isinstance(value, torch.device):
            return {"type": "device", "value": str(value)}
        if isinstance(value, torch.Size):
            return {"type": "size", "value": list(value)}
        if isinstance(value, (list, tuple)) and depth < 4:
            kind = "list" if isinstance(value, list) else "tuple"
            return {"type": kind, "items": [self.describe(v, record, role, f"{slot}.{i}", depth + 1)
                                            for i, v in enumerate(value)]}
        if isinstance(value, dict) and depth < 4:
            return {"type": "dict", "items": {str(k): self.describe(v, record, role, f"{slot}.{k}",
                                                                    depth + 1)
                                              for k, v in value.items()}}
        return {"type": "object", "value": _short_repr(value)}

    def unread(self, value, record: str, role: str, slot, why: str = "overwritten") -> dict:
        """The descriptor of a tensor whose values mean nothing: an argument the op overwrites
        without reading it (an `out=` tensor, the target of a fill; why="overwritten") or the
        output of `torch.empty` (why="uninitialized"). Dtype and shape only: no statistics,
        not saved, and `desc[why] = True` so that compare leaves it out."""
        if not isinstance(value, torch.Tensor):
            return self.describe(value, record, role, slot)
        desc = _head(value)
        desc["stats"] = None
        desc[why] = True
        return desc

    def tensor(self, t: torch.Tensor, record: str, role: str, slot) -> dict:
        if _is_wrapped(t):
            t = _unwrapped(t)
        desc = _head(t)
        if t.is_meta or (type(t) not in _PLAIN_TYPES and getattr(t, "_is_fake", False)):
            desc["stats"] = None
            return desc
        if self.stats is None:      # overflow_check: descriptors only, numbers on demand
            return desc
        # The same unchanged tensor is often described several times (an op's output is the
        # next op's input and its module's output): reduce it once.
        version = _version(t)
        cached = self._stats.get(id(t)) if version is not None else None
        if cached is not None and cached[0]() is t and cached[1] == version:
            self.stats.share(desc, cached[2])
        elif version is not None:
            # A view over exactly the same elements (a transpose, a reshape) holds the same
            # values, and statistics do not depend on their order.
            block = _block(t)
            handle = self._same_block(block, version) if block is not None else None
            if handle is not None:
                self.stats.share(desc, handle)
                block = None     # the block's entry stays its first tensor's
            else:
                handle = self.stats.add(desc, t)
            self._remember_stats(t, version, handle, block)
        else:
            self.stats.add(desc, t)
        if self.save and t.layout == torch.strided:
            desc["key"] = self._save(t, record, role, slot)
        return desc

    def _same_block(self, block: tuple, version: int):
        """The statistics handle of a live tensor over the same memory block, unchanged since."""
        entry = self._blocks.get(block)
        if entry is None or entry[1] != version:
            return None
        other = entry[0]()
        # alive (so the memory was not reused), still there, not written since
        if other is None or other._version != version or other.data_ptr() != block[0]:
            return None
        return entry[2]

    def _save(self, t: torch.Tensor, record: str, role: str, slot) -> str:
        version = _version(t)
        entry = self._saved.get(id(t)) if version is not None else None
        if entry is not None:
            ref, saved_version, key = entry
            if ref() is t and saved_version == version:
                return key
        name = tensor_name(record, role, slot)
        # CPU tensors are written at once; a device tensor is written later, from a copy.
        self.writer.save_tensor(name, t.detach() if t.is_cpu else t.detach().clone())
        if version is not None:
            self._remember(self._saved, t, (version, name))
        return name


def _head(t: torch.Tensor) -> dict:
    """What every tensor descriptor starts with: type, dtype, shape, device, requires_grad."""
    dtype = t.dtype
    return {"type": "tensor", "dtype": _DTYPE_NAMES.get(dtype) or _dtype_name(dtype),
            "shape": list(t.shape), "device": "cpu" if t.is_cpu else str(t.device),
            "requires_grad": t.requires_grad}


def _version(t: torch.Tensor):
    """The version counter, or None where there is none (inference tensors): then never cache."""
    try:
        return t._version      # inference tensors raise
    except RuntimeError:
        return None


def _storage(t: torch.Tensor) -> int:
    """The address of t's storage (what views of one buffer share), without building a
    storage object."""
    try:
        # SymInt only under symbolic tracing (torch.compile), which hands capture no tensors
        return t.data_ptr() - t.storage_offset() * t.element_size()  # type: ignore[return-value]
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return -1


def _block(t: torch.Tensor):
    """(address, numel, dtype) when t's elements fill one memory block exactly (contiguous in
    some order of its dimensions), else None."""
    if t.layout != torch.strided or t.is_meta:
        return None
    if not t.is_contiguous():
        expected = 1
        for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1):
            if stride != expected:
                return None
            expected *= size
    try:
        return (t.data_ptr(), t.numel(), t.dtype)
    except (RuntimeError, NotImplementedError):
        return None


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)   # never fake tensors
_DTYPE_NAMES: dict = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


_is_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None) or (lambda t: True)


def _unwrapped(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor under torch.func's wrappers (vmap's batched, grad's tracking tensors):
    their values cannot be read (.item() raises inside a transform); the whole batch can."""
    functorch = torch._C._functorch
    while functorch.is_batchedtensor(t) or functorch.is_gradtrackingtensor(t) \
            or functorch.is_functionaltensor(t):
        t = functorch.get_unwrapped(t)
    return t


def _short_repr(value) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= _MAX_REPR else text[:_MAX_REPR - 3] + "..."


def tensors_in(value, depth: int = 0):
    """Every tensor in a (nested) argument, in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)) and depth < 4:
        for v in value:
            yield from tensors_in(v, depth + 1)
    elif isinstance(value, dict) and depth < 4:
        for v in value.values():
            yield from tensors_in(v, depth + 1)
