"""Tensor statistics reduced on the tensor's device, fetched to the host in batches.

Each tensor becomes (max, min, mean, L2 norm, nan count, inf count), accumulated in float32 or
wider. On accelerators a large tensor's six are reduced on the device into one float64 vector,
and every pending vector is copied to the host in one transfer per device at flush (no `.item()`,
no sync per tensor). A small device tensor (biases, norms' weights, scalars: most of what a step
describes) is instead copied, in stream order, into a staging buffer on its device: one kernel
where its own reduction would launch some twenty. The buffers reach the host in one copy each
at flush, into host memory kept from flush to flush, and are reduced where they land.

On the CPU there is no transfer to save, so the cheap part (aminmax, sum, sum of squares) is
read at once, and the NaN/inf counts, which need extra passes, are computed only when those
numbers show the tensor is not finite (NaN propagates through min/max, inf shows in them).
With NaN present, max and min describe the values that are not NaN; mean and norm are NaN.
"""
from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import torch

from ..store.records import encode_float
from . import handles
from .device_stage import DeviceStaging, settle
from .handles import NO_STATS, STAGED, DeviceVector, Handle, Known, Small
from .handles import SUMMED_AS_IS as _FLOATING_WIDE
from .host_stage import HOST_DTYPES as _HOST_DTYPES
from .host_stage import HostStaging, columns_of, flat_in_memory_order, one_block, stageable


_NATIVE = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _prepared(t: torch.Tensor) -> torch.Tensor | None:
    """t as the device path reads it: float32/64 and bf16/fp16 as they are (the reductions
    accumulate in float32 or wider), complex as magnitudes, fp8 as float32, integers and bools
    as float64 (exact up to 2**53)."""
    if t.numel() == 0 or t.is_meta or t.layout != torch.strided:
        return None
    x = t.detach()
    if x.is_complex():
        x = x.abs()
    if x.dtype not in _NATIVE:
        x = x.to(torch.float32 if x.is_floating_point() else torch.float64)
    return x


def _as_stats(mx, mn, mean, norm, nan, inf) -> dict:
    return {"max": encode_float(mx), "min": encode_float(mn), "mean": encode_float(mean),
            "norm": encode_float(norm), "nan": int(nan), "inf": int(inf)}


_ROW = 1024


# Devices whose reductions accumulate in float64 at no real cost (reading float32 or bf16 is
# what takes the time). Elsewhere (Ascend NPU, MPS: float64 is slow or missing) rows of values
# beyond about 1e19 overflow float32 in the sum of squares, as a float32 norm would.
_WIDE_DEVICES = ("cuda", "cpu")


def _sum_and_norm(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum and L2 norm of x as float64 scalars on x's device, in four kernels.

    One float32 pass over millions of elements loses accuracy (torch's norm of 4M values near
    1000 is off by 3e-3 on the CPU). Rows of 1024 elements are reduced on their own, in float64
    on CUDA (float32 on devices without cheap float64), and the row sums and row norms combined
    in float64: relative error about 1e-8, and finite values give finite sums.
    """
    acc = torch.float64 if x.dtype == torch.float64 or x.device.type in _WIDE_DEVICES \
        else torch.float32
    flat = x.reshape(-1)
    n = flat.numel()
    rows = n // _ROW
    if rows < 16:
        return flat.sum(dtype=torch.float64), torch.linalg.vector_norm(flat, dtype=torch.float64)
    body = flat[:rows * _ROW].view(rows, _ROW)
    sums = body.sum(1, dtype=acc)
    norms = torch.linalg.vector_norm(body, dim=1, dtype=acc)
    if n % _ROW:     # the last elements count as rows of one
        tail = flat[rows * _ROW:].to(acc)
        sums, norms = torch.cat([sums, tail]), torch.cat([norms, tail])
    return sums.sum(dtype=torch.float64), torch.linalg.vector_norm(norms, dtype=torch.float64)


def cpu_stats(t: torch.Tensor) -> dict | None:
    """Statistics of a CPU tensor, computed now (a CPU read needs no device sync)."""
    values = _small_snapshot(t)
    if values is not None:      # the batched path, with a batch of one
        small = Small(values, {})
        _reduce_small([small])
        return small.stats
    if t.numel() == 0 or t.is_meta or t.layout != torch.strided:
        return None
    x = t.detach() if t.requires_grad else t   # (reductions below run under no_grad)
    if x.is_complex():
        x = x.abs()
    flat = flat_in_memory_order(x)
    n = flat.numel()
    if flat.dtype in _FLOATING_WIDE:   # reduced where it lies: no copy, no chunks
        mn, mx, total, squares = _reduce(flat)
        return _finish(x, n, mn.item(), mx.item(), total.item(), squares.item())
    # bf16/fp16/fp8 accumulate in float32, integers and bools in float64 (exact up to 2**53):
    # converted one chunk at a time into a reusable buffer (a fresh temporary per tensor made
    # the allocator fault in new pages).
    acc = torch.float32 if flat.is_floating_point() else torch.float64
    scratch = _scratch(acc, min(n, _CHUNK))
    parts = []
    for chunk in flat.split(_CHUNK):
        parts += _reduce(scratch[:chunk.numel()].copy_(chunk))
    table = torch.stack(parts).view(-1, 4)
    mn, mx = table[:, 0].min().item(), table[:, 1].max().item()
    total, squares = table[:, 2:].double().sum(0).tolist()
    return _finish(x, n, mn, mx, total, squares)


def _reduce(flat: torch.Tensor) -> list:
    """min, max, sum and sum of squares of a 1-D tensor, as 0-d tensors: three passes.

    The sum is torch's cascade sum: float32 sums of millions of values stay within 1e-7. The
    squares come from norms of rows of _ROW elements (short float32 accumulations), whose
    squares are then summed the same way; one float32 pass over millions of squares is 3e-3
    off on 4M values near 1000, and squaring into a buffer first costs a pass of writes.
    """
    mn, mx = torch.aminmax(flat)
    rows = flat.numel() // _ROW
    squares = torch.linalg.vector_norm(flat[:rows * _ROW].view(rows, _ROW), dim=1).square_().sum()
    if flat.numel() % _ROW:
        squares += flat[rows * _ROW:].square().sum()
    return [mn, mx, flat.sum(), squares]


_CHUNK = 1 << 20     # elements reduced per pass through the scratch buffer
_scratch_local = threading.local()


def _scratch(dtype: torch.dtype, numel: int) -> torch.Tensor:
    """A reusable work buffer of at least `numel` elements (at most 8 MB, one per thread and dtype)."""
    buffers = _scratch_local.__dict__.setdefault("buffers", {})
    buf = buffers.get(dtype)
    if buf is None or buf.numel() < numel:
        buf = buffers[dtype] = torch.empty(numel, dtype=dtype)
    return buf


def _finish(x, n: int, mn: float, mx: float, total: float, squares: float) -> dict:
    """Fix up what a plain reduction gets wrong (overflow, NaN), then build the stats dict.

    `x` (a tensor or a NumPy array, n elements) is read again only in those rare cases.
    """
    if math.isfinite(mn) and math.isfinite(mx) and not (math.isfinite(total) and math.isfinite(squares)):
        # finite values whose float32 sums overflowed: redo them in float64
        wide = torch.as_tensor(x).double()
        total, squares = wide.sum().item(), wide.square().sum().item()
    nan = inf = 0
    if not (math.isfinite(mn) and math.isfinite(mx) and math.isfinite(total)):
        x = torch.as_tensor(x)
        nan = int(torch.isnan(x).sum())
        inf = int(torch.isinf(x).sum())
        if nan and nan < n:   # max/min describe the values that are not NaN
            finite = x[~torch.isnan(x)]
            mn, mx = finite.min().item(), finite.max().item()
    return _as_stats(mx, mn, total / n, math.sqrt(squares), nan, inf)


# Below this many elements a tensor's statistics cost more in per-call overhead than in
# arithmetic: such tensors are copied and reduced together through NumPy (see StatsBatch).
# Only reductions: NumPy's BLAS calls, such as dot, start threads that fight torch's.
_SMALL = 1 << 14
_NUMPY_EXACT = {torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8, torch.int16,
                torch.int32, torch.int64, torch.bool}


def device_vector(t: torch.Tensor) -> torch.Tensor | None:
    """(max, min, sum, L2 norm, nan count, inf count) as one float64 tensor on t's device,
    resolved later in a batch (`vector_stats` turns it into statistics). Thirteen kernels, and
    bf16/fp16 tensors are read as they are, not copied to float32 first."""
    x = _prepared(t)
    if x is None:
        return None
    isnan = torch.isnan(x)
    # max/min of the values that are not NaN (-inf/inf when all are: vector_stats fixes that)
    mx = x.masked_fill(isnan, -math.inf).amax()
    mn = x.masked_fill(isnan, math.inf).amin()
    total, norm = _sum_and_norm(x)
    return _stack64([mx, mn, total, norm, isnan.sum(), torch.isinf(x).sum()])


_promoting_stack = True


def _stack64(parts: list) -> torch.Tensor:
    """One float64 vector of 0-d tensors of mixed dtypes: a single stack where the device's
    stack promotes dtypes, a cast each where it does not."""
    global _promoting_stack
    if _promoting_stack:
        try:
            return torch.stack(parts).to(torch.float64)
        except (RuntimeError, TypeError):
            _promoting_stack = False
    return torch.stack([p.to(torch.float64) for p in parts])


def vector_stats(row, numel: int) -> dict:
    """The statistics of a resolved `device_vector`."""
    mx, mn, total, norm, nan, inf = row
    if nan >= numel:
        mx = mn = math.nan
    return _as_stats(mx, mn, total / numel, norm, nan, inf)


def _small_snapshot(t: torch.Tensor):
    """A float64 NumPy copy of a small CPU tensor (its values now), or None. The copy is made
    by torch: a NumPy view of the user's tensor would make its storage unresizable."""
    if t.numel() > _SMALL or t.dtype not in _NUMPY_EXACT or t.layout != torch.strided or t.numel() == 0:
        return None
    try:
        return t.detach().to(torch.float64, copy=True).reshape(-1).numpy()
    except (RuntimeError, TypeError):   # conjugate/negative views, tensor subclasses
        return None


_Small = Small      # (the name the capture tests know it by)
_PLAIN_CPU = (torch.Tensor, torch.nn.Parameter)


def _reduce_small(pending: list) -> None:
    """All pending small tensors at once: four NumPy calls for the lot instead of four each
    (those reduced in their host staging buffer already, see host_stage.py, are not copied)."""
    rest = [p for p in pending if p.columns is None]
    if rest:
        flat = np.concatenate([p.values for p in rest])
        starts = np.zeros(len(rest), dtype=np.intp)
        np.cumsum([p.values.size for p in rest[:-1]], out=starts[1:])
        for p, columns in zip(rest, columns_of(flat, flat, starts)):
            p.columns = columns
    for p in pending:
        mn, mx, total, squares, ok = p.columns
        p.columns = None
        n = p.values.size
        if ok:      # the common case, without _finish's checks (all four numbers are finite)
            p.stats = {"max": mx, "min": mn, "mean": total / n, "norm": math.sqrt(squares),
                       "nan": 0, "inf": 0}
        else:
            p.stats = _finish(p.values, n, mn, mx, total, squares)
        for desc in p.descs:
            desc["stats"] = p.stats
        if p.original is None:      # (a check keeps its values until it is settled)
            p.values = None
            p.descs = []


def _host_values(pending: list, digests: bool = True) -> None:
    """Clones of small CPU tensors (see StatsBatch.snapshot) as float64 NumPy values: one
    concatenation and one conversion per dtype; the bytes of a clone over one memory block
    hashed first (`handles.AT_FLUSH`), where `digests`."""
    groups: dict = {}
    for p in pending:
        if isinstance(p.values, torch.Tensor):
            groups.setdefault(p.values.dtype, []).append(p)
            if p.digest == handles.AT_FLUSH:
                p.digest = handles.digest(p.values) if digests and one_block(p.values) else None
    for dtype, group in groups.items():
        flat = torch.cat([p.values.reshape(-1) for p in group])
        if dtype not in _NUMPY_EXACT:      # bf16, fp8: exact in float32
            flat = flat.float()
        host = flat.numpy().astype(np.float64)
        start = 0
        for p in group:
            n = p.values.numel()
            p.values = host[start:start + n]
            start += n


def _small(t: torch.Tensor) -> bool:
    return 0 < t.numel() <= _SMALL and t.layout == torch.strided and not t.is_meta


class StatsBatch:
    """Fills descriptors' "stats". Large CPU tensors are reduced at once; small tensors are
    copied (CPU ones to NumPy, device ones into a staging buffer on their device) and reduced
    together at flush: per-call overhead, not arithmetic, is their cost. Large device tensors
    are reduced on the device and fetched in one copy per device at flush."""

    def __init__(self, cpu_as_device: bool = False):
        self._descs: list[dict] = []
        self._vectors: list[DeviceVector] = []
        self._small: list[Small] = []
        self._staging: dict = {}          # (device, staging dtype) -> DeviceStaging
        self._host: dict = {}             # dtype -> HostStaging (small CPU tensors, host_stage.py)
        self._unstageable: set = set()    # (device, dtype) whose copy into staging failed
        self._cpu_as_device = cpu_as_device   # tests: take the device path with CPU tensors
        # on_outside(desc, values, where): a tensor shared from an earlier description holds
        # other values now (see handles.py); None: shared descriptions are not verified
        self.on_outside = None

    def add(self, desc: dict, t: torch.Tensor) -> Handle:
        """Describe t's statistics into desc; returns a handle that `share` can reuse."""
        if t.is_cpu and not self._cpu_as_device:    # the common case first, in one place
            dtype = t.dtype
            if dtype in _HOST_DTYPES and 0 < t.numel() <= _SMALL and type(t) in _PLAIN_CPU \
                    and t.layout == torch.strided and t.is_contiguous() and not t.is_neg():
                stage = self._host.get(dtype)
                if stage is None:
                    stage = self._host[dtype] = HostStaging(dtype)
                staged = Small(STAGED, desc)
                stage.put(staged, t)
                self._small.append(staged)
                return staged
        small = self.snapshot(desc, t)
        if small is not None:
            return small
        if t.is_cpu and not self._cpu_as_device:
            stats = desc["stats"] = cpu_stats(t)
            return Known(stats) if stats is not None else NO_STATS
        vec = device_vector(t)
        if vec is None:
            desc["stats"] = None
            return NO_STATS
        handle = DeviceVector(vec, t.numel())
        self._descs.append(desc)
        self._vectors.append(handle)
        return handle

    def add_contiguous(self, desc: dict, t: torch.Tensor, dtype: torch.dtype, numel: int,
                       ptr: int, ref: Any = None) -> Handle:
        """`add` for a plain, strided, contiguous CPU tensor whose dtype, element count and
        data pointer the caller has read (the describer's common case). `ref`: a weak
        reference to t, through which the flush finds it dead (its bytes then go unhashed:
        no later read of it can be verified)."""
        if dtype in _HOST_DTYPES and 0 < numel <= _SMALL and not self._cpu_as_device \
                and not t.is_neg():
            stage = self._host.get(dtype)
            if stage is None:
                stage = self._host[dtype] = HostStaging(dtype)
            staged = Small(STAGED, desc)
            staged.ref = ref
            stage.put_block(staged, ptr, numel)
            self._small.append(staged)
            return staged
        return self.add(desc, t)

    def queue_vector(self, desc: dict, handle: DeviceVector) -> None:
        """Fill desc from a device tensor's vector at the next flush (`DeviceVector.share`)."""
        self._descs.append(desc)
        self._vectors.append(handle)

    def reduce_now(self, t: torch.Tensor) -> dict | None:
        """A CPU tensor's statistics, reduced now (`Known.verify`)."""
        return cpu_stats(t)

    def snapshot(self, desc: dict, t: torch.Tensor) -> Small | None:
        """Queue a copy of a small tensor's values as they are now (reduced at flush with the
        others): a device tensor's into a staging buffer there; a contiguous CPU tensor's bytes
        into a host buffer (host_stage.py), other CPU tensors cloned. None for a tensor that is
        not small (or cannot be staged). Never through `t.numpy()`: NumPy's view makes the
        user's storage unresizable for good (FSDP2 frees its parameters with `resize_(0)`)."""
        if not _small(t):
            return None
        if t.is_cpu and not self._cpu_as_device and not t.is_complex():
            if stageable(t):
                stage = self._host.get(t.dtype)
                if stage is None:
                    stage = self._host[t.dtype] = HostStaging(t.dtype)
                small = Small(STAGED, desc)
                stage.put(small, t)
                self._small.append(small)
                return small
            try:
                values = t.clone()
            except (RuntimeError, TypeError, NotImplementedError):   # tensor subclasses
                return None
            small = Small(values, desc)
            if one_block(t):    # verified against the clone's bytes (handles.same_clone)
                small.digest = handles.AT_FLUSH
            self._small.append(small)
            return small
        return self._stage(desc, t)

    def _stage(self, desc: dict, t: torch.Tensor) -> Small | None:
        """Queue a small device tensor's copy into its staging buffer; None where it cannot be
        staged (complex, or a device that refuses the copy: it is then reduced on its own)."""
        if t.is_complex():
            return None
        if (t.device, t.dtype) in self._unstageable:
            return None
        wide = torch.float32 if t.is_floating_point() and t.element_size() <= 4 else torch.float64
        pending = Small(STAGED, desc)
        try:
            stage = self._staging.get((t.device, wide))
            if stage is None:
                stage = self._staging[(t.device, wide)] = DeviceStaging(t.device, wide)
            stage.put(pending, t.detach())
        except torch.OutOfMemoryError:
            return None     # this once: reduced on its own
        except (RuntimeError, TypeError, NotImplementedError):
            # e.g. no float64 or no copy from fp8 on this device: reduced on its own from now on
            self._unstageable.add((t.device, t.dtype))
            return None
        self._small.append(pending)
        return pending

    def share(self, desc: dict, handle: Handle, t: torch.Tensor | None = None, where=None) -> Handle:
        """Give desc the statistics of a tensor already described (same object, same version
        counter). With `t`, verify that its values did not change outside torch meanwhile (see
        handles.py; `where` comes back to `on_outside` if they did). Returns the handle desc
        was filled from: `handle`, or the check made of t's values now."""
        if t is not None and self.on_outside is not None:
            check = handle.verify(self, desc, t, where)
            if check is not None:
                return check
        handle.share(self, desc)
        return handle

    def __len__(self) -> int:
        return len(self._descs) + len(self._small)

    def resolve(self, digests: bool = True) -> None:
        """Fill every pending descriptor: small CPU tensors together, device tensors with one
        host copy per device. `digests=False`: no later read will be verified against these
        tensors (the step's last flush), so their bytes are not hashed."""
        if self._small:
            pending, self._small = self._small, []
            try:
                for stage in self._staging.values():
                    if stage.waiting:
                        stage.fetch()
                for host in self._host.values():
                    if host.waiting:
                        host.fetch(digests)
                _host_values(pending, digests)
                _reduce_small(pending)
                handles.settle(pending, self.on_outside)
            except Exception:
                for p in pending:   # the records keep their descriptors, without numbers
                    for desc in p.descs:
                        desc["stats"] = None
                    p.values, p.descs, p.columns = None, [], None
                self._staging.clear()
                self._host.clear()
                raise
            finally:     # (the values viewing their buffers are read)
                for stage in list(self._host.values()) + list(self._staging.values()):
                    stage.release()
        if not self._descs:
            return
        by_device: dict = {}
        for i, handle in enumerate(self._vectors):
            by_device.setdefault(handle.vector.device, []).append(i)
        rows: list = [None] * len(self._descs)
        for device, idx in by_device.items():
            settle(device)
            block = torch.stack([self._vectors[i].vector for i in idx]).cpu().tolist()
            for i, row in zip(idx, block):
                rows[i] = row
        for desc, row, handle in zip(self._descs, rows, self._vectors):
            desc["stats"] = vector_stats(row, handle.numel)
        self._descs.clear()
        self._vectors.clear()
