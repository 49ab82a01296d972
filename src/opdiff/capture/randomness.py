"""A fingerprint of the random generator a random op draws from, taken just before it runs.

Two runs whose random ops draw from generators in the same state draw the same numbers (on one
device type); when an op's draws differ, comparing the fingerprints tells "the generators were
in different states" (origin "random": seed both runs alike) from "the op computes differently".

- CPU: a CRC of `torch.get_rng_state()` (a 5 KB copy: paid by random ops alone);
- CUDA and other accelerators: the default generator's seed and offset, read without a device
  sync (untested here: no accelerator on the machines this was written on).

Ops that only sometimes draw (attention with dropout) are fingerprinted when their dropout
probability is above 0.
"""
from __future__ import annotations

import zlib
from typing import Any, Optional

import torch

from .. import ops

# op -> (position, keyword) of its dropout probability: random only when it is above 0
_DROPOUT_ARG = {"Functional.multi_head_attention_forward": (10, "dropout_p"),
                "Functional.scaled_dot_product_attention": (4, "dropout_p"),
                "Aten._scaled_dot_product_flash_attention_for_cpu": (3, "dropout_p")}


def draws(op: str, args: tuple, kwargs: dict) -> bool:
    """Whether this call of `op` draws random numbers."""
    if ops.traits(op).random:
        return True
    where = _DROPOUT_ARG.get(op)
    if where is None:
        return False
    p = kwargs.get(where[1], args[where[0]] if len(args) > where[0] else 0.0)
    return isinstance(p, (int, float)) and p > 0 and kwargs.get("training", True) is not False


def fingerprint(args: tuple, kwargs: dict) -> Optional[str]:
    """"cpu:<crc32>" or "<device>:<seed>:<offset>" of the generator the call draws from."""
    device = next((v.device for v in list(args) + list(kwargs.values())
                   if isinstance(v, torch.Tensor)), None)
    dev = kwargs.get("device")
    if device is None and dev is not None:
        device = torch.device(dev)
    gen: Any = kwargs.get("generator")
    if device is None or device.type == "cpu":
        state = gen.get_state() if isinstance(gen, torch.Generator) else torch.get_rng_state()
        return f"cpu:{zlib.crc32(state.numpy().tobytes()):08x}"
    try:    # accelerators: seed and offset, no sync (untested here)
        if not isinstance(gen, torch.Generator):
            module = getattr(torch, device.type)
            index = device.index if device.index is not None else module.current_device()
            gen = module.default_generators[index]
        offset = gen.get_offset() if hasattr(gen, "get_offset") else "?"
        return f"{device.type}:{gen.initial_seed()}:{offset}"
    except Exception:
        return None


def device_type(print_: Optional[str]) -> Optional[str]:
    """The device type a fingerprint was taken on."""
    return print_.split(":", 1)[0] if print_ else None


__all__ = ["draws", "fingerprint", "device_type"]
