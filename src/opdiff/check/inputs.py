"""Made-up inputs for checking a statistics dump: a tensor of the dumped shape and dtype, uniform
within the dumped min/max, with as many inf/NaN re-inserted as the dump counted. A shape whose
tensor would be over `--max-tensor-mb` is not made (the op is not checked, with the message).

    records = with_synthetic_keys(records)      # every tensor descriptor gets a key
    load = SyntheticTensors(records)            # key -> the made-up tensor (the same every call)

The inputs are not the run's: a statistics check tells whether the device's kernel computes
what float64 computes on inputs like the run's, not whether the run's own values were right.
"""
from __future__ import annotations

import copy
import math
import zlib
from typing import Any, Iterable, Optional

import torch

from ..comparison.replay.calls import NotReplayable
from ..dtypes import canonical_dtype
from ..store.limits import TensorTooLarge, check_size, numel


def with_synthetic_keys(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of the records whose tensor descriptors without a key get their tensor name."""
    out = []
    for rec in records:
        rec = copy.deepcopy(rec)
        for role in ("inputs", "outputs"):
            for i, d in enumerate(rec[role]):
                _key(d, f"{rec['name']}.{role[:-1]}.{i}")
        for k, d in rec["kwargs"].items():
            _key(d, f"{rec['name']}.input.{k}")
        out.append(rec)
    return out


def _key(d: Any, name: str, depth: int = 0) -> None:
    if not isinstance(d, dict) or depth > 4:
        return
    if d.get("type") == "tensor":
        d.setdefault("key", name)
    elif d.get("type") in ("list", "tuple"):
        for i, item in enumerate(d.get("items", [])):
            _key(item, f"{name}.{i}", depth + 1)
    elif d.get("type") == "dict":
        for k, item in d.get("items", {}).items():
            _key(item, f"{name}.{k}", depth + 1)


class SyntheticTensors:
    """key -> a made-up tensor from the descriptor's shape, dtype and statistics."""

    def __init__(self, records: Iterable[dict[str, Any]]):
        self.descs: dict[str, dict[str, Any]] = {}
        for rec in records:
            for d in _tensors(list(rec["inputs"]) + list(rec["outputs"])
                              + list(rec["kwargs"].values())):
                self.descs.setdefault(d["key"], d)

    def __call__(self, key: str) -> Optional[torch.Tensor]:
        d = self.descs.get(key)
        return make_tensor(d, seed=zlib.crc32(key.encode())) if d else None


def _tensors(descs: list[Any], depth: int = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for d in descs:
        if not isinstance(d, dict) or depth > 4:
            continue
        if d.get("type") == "tensor" and d.get("key"):
            out.append(d)
        elif d.get("type") in ("list", "tuple"):
            out += _tensors(d.get("items", []), depth + 1)
        elif d.get("type") == "dict":
            out += _tensors(list(d.get("items", {}).values()), depth + 1)
    return out


def _finite(x: Any, default: float) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


def make_tensor(desc: dict[str, Any], seed: int = 0) -> torch.Tensor:
    """One tensor like the descriptor (see the module docstring)."""
    dtype = getattr(torch, canonical_dtype(str(desc.get("dtype"))) or "float32", torch.float32)
    try:
        n = numel(desc.get("shape") or [])
    except ValueError as exc:
        raise NotReplayable(f"{desc.get('key')}: {exc}") from None
    try:     # a statistics record's shape is only a claim: made up in float64, with a permutation
        check_size(str(desc.get("key")), n * 16, "made up from a statistics record's shape")
    except TensorTooLarge as exc:
        raise NotReplayable(str(exc)) from None
    shape = [int(s) for s in desc.get("shape") or []]
    stats = desc.get("stats") or {}
    lo, hi = _finite(stats.get("min"), -1.0), _finite(stats.get("max"), 1.0)
    if hi < lo:
        lo, hi = hi, lo
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if not (dtype.is_floating_point or dtype.is_complex):
        return torch.randint(int(math.floor(lo)), int(math.floor(hi)) + 1, shape,
                             generator=gen).to(dtype)
    t = (torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo)
    flat = t.view(-1)
    if flat.numel():
        flat[0], flat[-1] = lo, hi          # the dumped extremes are reached
        spots = torch.randperm(flat.numel(), generator=gen)
        n_nan, n_inf = int(_finite(stats.get("nan"), 0)), int(_finite(stats.get("inf"), 0))
        flat[spots[:n_nan]] = math.nan
        flat[spots[n_nan:n_nan + n_inf]] = math.inf
    return t.to(dtype)
