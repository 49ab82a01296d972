"""A low-precision training tensor (a tensor subclass holding float8 data and its scale, as
torchao's `Float8TrainingTensor`) as the high-precision value it stands for.

    value = stands_for(t)       # t itself for any other tensor

Capture describes such a tensor by this value (`capture/describe.py`): its statistics and saved
values are those of `data / scale` in its original dtype, what the op reading it computes with
and what a bf16 golden holds at the same place. Reducing the subclass itself would run its own
ops (torchao's `cat` fails on a mix with plain tensors) and cannot be saved as plain values.
The float8 data and its scale are recorded where they were made: the cast that produced the
data is a quantize op of the run (`units.py`).
"""
from __future__ import annotations

from typing import Any

import torch

from .formats import is_low_precision


def stands_for(t: Any) -> Any:
    """`data / scale` in the original dtype for a tensor subclass with float8 `_data`, a tensor
    `_scale` (a multiplier: data = value * scale) and `_orig_dtype`; t for anything else."""
    data, scale = getattr(t, "_data", None), getattr(t, "_scale", None)
    if type(data) is not torch.Tensor or type(scale) is not torch.Tensor:
        return t
    if not is_low_precision(str(data.dtype)):
        return t
    dtype = getattr(t, "_orig_dtype", None)
    with torch.no_grad():
        value = data.to(torch.float32) / scale.to(torch.float32)
        return value.to(dtype) if isinstance(dtype, torch.dtype) else value


__all__ = ["stands_for"]
