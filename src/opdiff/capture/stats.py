"""Tensor statistics reduced on the tensor's device and fetched to the host in batches.

Each tensor becomes a 6-vector (max, min, mean, L2 norm, nan count, inf count) in float64 on its
own device; `StatsBatch.resolve()` stacks every pending vector per device and copies it to the host
in one transfer, so there is no `.item()` (and no device sync) per tensor.
"""
from __future__ import annotations

import math

import torch

from ..store.records import STAT_KEYS, encode_float

_FLOATING_WIDE = (torch.float32, torch.float64)


def stat_vector(t: torch.Tensor) -> torch.Tensor | None:
    """The statistics of t as a float64 tensor on t's device, or None for empty/unsupported tensors.

    Must be called under torch.no_grad(). Never changes t and never touches a random generator.
    """
    if t.numel() == 0 or t.is_meta or t.layout != torch.strided:
        return None
    x = t.detach()
    if x.is_complex():
        x = x.abs()
    if x.dtype not in _FLOATING_WIDE:
        # bf16/fp16/fp8 accumulate in float32; integers and bools in float64 (exact up to 2**53)
        x = x.to(torch.float32 if x.is_floating_point() else torch.float64)
    mn, mx = torch.aminmax(x)
    total = x.sum(dtype=torch.float64)
    norm = torch.linalg.vector_norm(x, dtype=torch.float64)
    if t.is_floating_point() or t.is_complex():
        nan = torch.isnan(x).sum()
        inf = torch.isinf(x).sum()
        parts = (mx, mn, total / x.numel(), norm, nan, inf)
    else:
        zero = torch.zeros((), dtype=torch.float64, device=x.device)
        parts = (mx, mn, total / x.numel(), norm, zero, zero)
    return torch.stack([p.to(torch.float64) for p in parts])


class StatsBatch:
    """Pending statistics: descriptors waiting for their numbers, resolved in one copy per device."""

    def __init__(self):
        self._descs: list[dict] = []
        self._vectors: list[torch.Tensor] = []

    def add(self, desc: dict, t: torch.Tensor) -> None:
        vec = stat_vector(t)
        if vec is None:
            desc["stats"] = None
            return
        self._descs.append(desc)
        self._vectors.append(vec)

    def __len__(self) -> int:
        return len(self._descs)

    def resolve(self) -> None:
        """Fill every pending descriptor's "stats" (JSON-safe numbers)."""
        if not self._descs:
            return
        by_device: dict = {}
        for i, v in enumerate(self._vectors):
            by_device.setdefault(v.device, []).append(i)
        rows: list = [None] * len(self._descs)
        for device, idx in by_device.items():
            block = torch.stack([self._vectors[i] for i in idx]).cpu().tolist()
            for i, row in zip(idx, block):
                rows[i] = row
        for desc, row in zip(self._descs, rows):
            mx, mn, mean, norm, nan, inf = row
            desc["stats"] = {
                "max": encode_float(mx), "min": encode_float(mn),
                "mean": encode_float(mean), "norm": encode_float(norm),
                "nan": int(nan) if math.isfinite(nan) else 0,
                "inf": int(inf) if math.isfinite(inf) else 0,
            }
        self._descs.clear()
        self._vectors.clear()


assert STAT_KEYS == ("max", "min", "mean", "norm", "nan", "inf")
