"""Turn call arguments into descriptors (see store/records.py) and queue their statistics."""
from __future__ import annotations

import weakref

import torch

from ..store.records import scalar_descriptor
from ..store.schema import tensor_name
from ..lowp.subclass import stands_for
from . import collectives
from .host_stage import one_block

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
        self._stats: dict = {}   # id(tensor) -> (weakref, version, stats handle, head or None)
        self._blocks: dict = {}  # (address, numel, dtype) of a dense tensor -> same as _stats
        self._by_storage: dict = {}   # storage address -> ids of cached tensors viewing it
        # A read is verified (handles.py) unless the tensor was described or verified since the
        # last op began (`epoch`, advanced by Session.describe_inputs): a module's output read
        # right after its last op made it, a parameter read by its op and its module.
        self.epoch = 0
        self._seen: dict = {}    # id(tensor) -> epoch it was last described or verified in
        # Dataflow: id(tensor) -> (weakref, version, seq, slot) of the forward op record that
        # made it; an input descriptor of a tensor found here says `"producer": [seq, slot]`.
        # `outs` holds the outputs described since the last record was emitted (`produced`).
        self.producers: dict = {}
        self.outs: list = []
        # At L2 views are not recorded, and Inductor's kernels (capture/inductor.py) write their
        # outputs through raw pointers and hand their readers fresh views of those buffers: with
        # `buffers` set, a tensor not found by identity is found by its data address and
        # version (which a view at offset 0 shares with what it views).
        # An L2 op that writes into a tensor it was given (`out=`, in-place) is seen before
        # autograd bumps that tensor's version: `read` holds the ids of the tensors read since
        # the last record, and such an output is its readers' at the next version.
        self.buffers = False
        self.by_buffer: dict = {}
        self.read: set = set()
        self._prune_at = 4096
        if stats is not None:
            stats.on_outside = self._changed_outside

    def _changed_outside(self, desc: dict, values, where: tuple) -> None:
        """A shared description's tensor held other values when it was read again (handles.py):
        mark the reader's descriptor, forget the tensor's cached description, and with
        task="tensor" save the values the reader saw (`values`: their float64 copy, or None
        when the tensor was saved again as it was read)."""
        record, role, slot, key, dtype = where
        name = tensor_name(record, role, slot)
        desc["outside"] = True
        desc["leaf"] = "outside"
        desc["fqn"] = name
        self._stats.pop(key, None)
        self._saved.pop(key, None)
        self._seen.pop(key, None)
        if self.save and values is not None and "key" in desc:
            self.writer.save_tensor(name, torch.from_numpy(values).view(desc["shape"]).to(dtype))
            desc["key"] = name

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

    def written_unseen(self, values) -> None:
        """`values` may have been written by code capture did not see (a custom autograd
        Function's backward): what was described of them is stale, and the op that made them
        is no longer what they hold, so later readers name no producer."""
        self.forget(values)
        for t in tensors_in(values):
            self.producers.pop(id(t), None)

    def _remember(self, table: dict, t: torch.Tensor, entry: tuple) -> None:
        try:
            table[id(t)] = (weakref.ref(t),) + entry
        except TypeError:
            return
        self._by_storage.setdefault(_storage(t), set()).add(id(t))

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
        if self.buffers:
            self.read.add(id(value))
        desc = _head(value)
        desc["stats"] = None
        desc[why] = True
        return desc

    def tensor(self, t: torch.Tensor, record: str, role: str, slot) -> dict:
        desc = self._tensor(t, record, role, slot)
        if role == "output":
            try:     # (a weak reference: a gradient held here would make autograd copy it)
                self.outs.append((weakref.ref(t), slot, record))
            except TypeError:
                pass
        else:
            if self.buffers:
                self.read.add(id(t))
            entry = self.producers.get(id(t))
            if entry is not None and entry[0]() is t and entry[1] == _version(t):
                desc["producer"] = [entry[2], entry[3]]
            elif self.buffers:
                entry = self.by_buffer.get(_address(t))
                if entry is not None and entry[0]() is not None and \
                        entry[1] in (None, _version(t)):
                    desc["producer"] = [entry[2], entry[3]]
        return desc

    def produced(self, seq: int, record: str, written: bool = False,
                 inductor: bool = False) -> None:
        """The record `record` was emitted as `seq`: its outputs described since the last
        record are its products (later readers' descriptors name it). `written`: the record
        was made after its call wrote its outputs (a torch call, whose `out=` has bumped the
        version already; an Inductor kernel, whose raw writes bump none), unlike an aten op
        seen before autograd bumps it. `inductor`: a call of Inductor's generated code, whose
        readers get its buffers through `reinterpret_tensor` views, each with a version counter
        of its own: found by address at any version (every write there is such a recorded
        call, which registers the address again)."""
        producers = self.producers
        for ref, slot, name in self.outs:
            t = ref()
            if name != record or t is None:
                continue
            version = _version(t)
            if version is not None:
                if self.buffers:
                    version += not written and id(t) in self.read
                    # alive while the buffer lives (the view may not)
                    base = t._base if t._base is not None else t
                    # (Inductor drops a buffer's tensor when it reuses the memory through a
                    # view: its storage, which every view keeps alive, is what lives)
                    self.by_buffer[_address(t)] = (
                        weakref.ref(t.untyped_storage() if inductor else base),
                        None if inductor else version, seq, slot)
                producers[id(t)] = (ref, version, seq, slot)
                if type(t) not in _PLAIN_TYPES:     # a DTensor: readers of its local shard
                    # (DTensor's to_local view) are its readers too (comparison/layouts)
                    local = getattr(t, "_local_tensor", None)
                    if isinstance(local, torch.Tensor):
                        producers[id(local)] = (weakref.ref(local), _version(local), seq, slot)
        self.outs.clear()
        self.read.clear()
        if len(producers) > self._prune_at:     # drop the dead (amortised: the limit doubles)
            for key in [k for k, v in producers.items() if v[0]() is None]:
                del producers[key]
            self._prune_at = max(4096, 2 * len(producers))

    def _tensor(self, t: torch.Tensor, record: str, role: str, slot) -> dict:
        # Read again before any user op ran (a module's output after its last op, a parameter
        # after its op, every gradient in backward): shape, dtype and device are as described,
        # the statistics are shared unverified (see below).
        key = id(t)
        cached = self._stats.get(key)
        if cached is not None and cached[3] is not None and self._seen.get(key) == self.epoch \
                and cached[0]() is t and cached[1] == t._version:
            desc = cached[3].copy()
            desc["requires_grad"] = t.requires_grad
            self.stats.share(desc, cached[2])
            if self.save:
                desc["key"] = self._save(t, record, role, slot)
            return desc
        if t.is_cpu and type(t) in _PLAIN_TYPES and self.stats is not None and not _is_wrapped(t):
            return self._plain_cpu(t, key, cached, record, role, slot)
        if _is_wrapped(t):
            t = _unwrapped(t)
        if type(t) not in _PLAIN_TYPES:     # torchao's float8 tensor: the value it stands for
            t = stands_for(t)
        # a DTensor: this rank's shard, and where it sits (collectives.local_shard)
        wrapper = t
        t, placed = collectives.local_shard(t) if type(t) not in _PLAIN_TYPES else (t, None)
        dtype = t.dtype
        desc = {"type": "tensor", "dtype": _DTYPE_NAMES.get(dtype) or _dtype_name(dtype),
                "shape": list(t.shape), "device": "cpu" if t.is_cpu else str(t.device),
                "requires_grad": t.requires_grad}
        if placed is not None:
            desc["placement"] = placed
        if t.is_meta or (type(t) not in _PLAIN_TYPES and getattr(t, "_is_fake", False)):
            desc["stats"] = None
            return desc
        if self.stats is None:      # overflow_check: descriptors only, numbers on demand
            return desc
        # The same unchanged tensor is often described several times (an op's output is the
        # next op's input and its module's output): reduce it once.
        try:
            version = t._version      # inference tensors have none: never cached
            if placed is not None:    # DTensor's in-place ops bump its own counter, not its
                version += wrapper._version << 32     # shard's (an optimizer step on it)
        except RuntimeError:
            version = None
        if version is None:
            self.stats.add(desc, t)
        else:
            key = id(t)
            cached = self._stats.get(key)
            if cached is not None and cached[1] == version and cached[0]() is t:
                if self._seen.get(key) == self.epoch:    # no user code ran since it was read
                    self.stats.share(desc, cached[2])
                else:   # verified: a write outside torch leaves the version counter as it was
                    # (against its first description: every later reader of changed values is
                    # marked, the comparison names the first)
                    self._seen[key] = self.epoch
                    self.stats.share(desc, cached[2], t, (record, role, slot, key, dtype))
            else:
                self._add_stats(desc, t, key, version, record, role, slot)
        if self.save and t.layout == torch.strided:
            desc["key"] = self._save(t, record, role, slot, version)
        return desc

    def _plain_cpu(self, t: torch.Tensor, key: int, cached, record: str, role: str, slot) -> dict:
        """`_tensor` for a plain CPU tensor (most of what a step describes), each of its
        attributes read once; the same descriptor and the same caching as the general path."""
        dtype = t.dtype
        desc = {"type": "tensor", "dtype": _DTYPE_NAMES.get(dtype) or _dtype_name(dtype),
                "shape": list(t.shape), "device": "cpu", "requires_grad": t.requires_grad}
        stats = self.stats
        try:
            version = t._version      # inference tensors have none: never cached
        except RuntimeError:
            version = None
        if version is None:
            stats.add(desc, t)
        elif cached is not None and cached[1] == version and cached[0]() is t:
            if self._seen.get(key) == self.epoch:    # no user code ran since it was read
                stats.share(desc, cached[2])
            else:   # verified (see _tensor)
                self._seen[key] = self.epoch
                stats.share(desc, cached[2], t, (record, role, slot, key, dtype))
        elif t.layout != torch.strided:
            stats.add(desc, t)
        else:
            self._add_cpu_stats(desc, t, key, version, dtype, record, role, slot)
        if self.save and t.layout == torch.strided:
            desc["key"] = self._save(t, record, role, slot)
        return desc

    def _add_cpu_stats(self, desc: dict, t: torch.Tensor, key: int, version: int, dtype,
                       record: str, role: str, slot) -> None:
        """`_add_stats` of a plain, strided CPU tensor."""
        try:
            ptr = t.data_ptr()
            address = ptr - t.storage_offset() * dtype.itemsize
        except (RuntimeError, NotImplementedError):   # storage-less tensors
            self.stats.add(desc, t)
            return
        numel = t.numel()
        contiguous = t.is_contiguous()
        block = (ptr, numel, dtype) if contiguous or one_block(t) else None
        handle = self._same_block(block, version) if block is not None and block in self._blocks \
            else None
        ref = weakref.ref(t)
        if handle is not None:
            self.stats.share(desc, handle, t, (record, role, slot, key, dtype))
            block = None     # the block's entry stays its first tensor's
        elif contiguous:
            handle = self.stats.add_contiguous(desc, t, dtype, numel, ptr, ref)
        else:
            handle = self.stats.add(desc, t)
        entry = (ref, version, handle,
                 {"type": "tensor", "dtype": desc["dtype"], "shape": desc["shape"], "device": "cpu"})
        self._keep_stats(key, entry, address, block)

    def _add_stats(self, desc: dict, t: torch.Tensor, key: int, version: int, record: str,
                   role: str, slot) -> None:
        """Statistics of a tensor not described before (or changed since): shared with a live,
        unchanged tensor over exactly the same elements, else queued; remembered either way."""
        if t.layout != torch.strided:
            self.stats.add(desc, t)
            return
        try:
            ptr = t.data_ptr()
            # SymInt only under symbolic tracing (torch.compile), which hands capture no tensors
            address = ptr - t.storage_offset() * t.element_size()
        except (RuntimeError, NotImplementedError):   # storage-less tensors
            self.stats.add(desc, t)
            return
        # A view over exactly the same elements (a transpose, a reshape) holds the same values,
        # and statistics do not depend on their order.
        block = (ptr, t.numel(), t.dtype) if one_block(t) else None
        handle = self._same_block(block, version) if block is not None and block in self._blocks \
            else None
        if handle is not None:
            self.stats.share(desc, handle, t, (record, role, slot, key, t.dtype))
            block = None     # the block's entry stays its first tensor's
        else:
            handle = self.stats.add(desc, t)
        # (what a read in the same epoch copies: not a DTensor's shard, described with its
        # placement, nor a tensor subclass)
        head = None if "placement" in desc or type(t) not in _PLAIN_TYPES else \
            {"type": "tensor", "dtype": desc["dtype"], "shape": desc["shape"],
             "device": desc["device"]}
        try:
            entry = (weakref.ref(t), version, handle, head)
        except TypeError:
            return
        self._keep_stats(key, entry, address, block)

    def _keep_stats(self, key: int, entry: tuple, address: object, block: "tuple | None") -> None:
        """A described tensor's statistics entry, kept under its key, its storage's address and
        (when it is the first over its memory block) the block."""
        self._stats[key] = entry
        self._seen[key] = self.epoch
        keys = self._by_storage.get(address)
        if keys is None:
            keys = self._by_storage[address] = set()
        keys.add(key)
        if block is not None:
            self._blocks[block] = entry
            keys.add(block)

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

    def _save(self, t: torch.Tensor, record: str, role: str, slot, version=False) -> str:
        # (version: the caller's, where it counts more than the tensor's own: a DTensor's shard)
        version = _version(t) if version is False else version
        entry = self._saved.get(id(t)) if version is not None else None
        if entry is not None:
            ref, saved_version, key = entry
            if ref() is t and saved_version == version:
                return key
        name = tensor_name(record, role, slot)
        # CPU tensors are written at once; a device tensor is written later, from a copy (the
        # original tells the writer which saved tensor's memory it views, if any).
        if t.is_cpu:
            self.writer.save_tensor(name, t.detach())
        else:
            self.writer.save_tensor(name, t.detach().clone(), origin=t)
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


def _address(t: torch.Tensor) -> int:
    """Where t's first element is (-1 where a layout has none)."""
    try:
        return t.data_ptr()
    except (RuntimeError, NotImplementedError):
        return -1


def _storage(t: torch.Tensor) -> int:
    """The address of t's storage (what views of one buffer share), without building a
    storage object."""
    try:
        # SymInt only under symbolic tracing (torch.compile), which hands capture no tensors
        return t.data_ptr() - t.storage_offset() * t.element_size()  # type: ignore[return-value]
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return -1


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


def tensors_in(value, depth: int = 0) -> list:
    """Every tensor in a (nested) argument, in order (lists, tuples and dicts, 4 levels deep)."""
    if isinstance(value, torch.Tensor):
        return [value]
    out: list = []
    _collect(value, out, depth)
    return out


def _collect(value, out: list, depth: int) -> None:
    if depth >= 4:
        return
    items = value if isinstance(value, (list, tuple)) else \
        value.values() if isinstance(value, dict) else ()
    for v in items:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple, dict)):
            _collect(v, out, depth + 1)
