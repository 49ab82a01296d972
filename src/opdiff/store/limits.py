"""How large a tensor opdiff will make while reading a dump: `--max-tensor-mb`.

A dump is untrusted input. Its bytes bound most tensors read from it (a saved tensor is a map of
its file), but a few are made from what a dump only *claims*: a reference (`ref:`) with a stride
of 0 over a small base is a view that `.contiguous()` would blow up, a statistics record's shape
is all `opdiff check` has to make its inputs from, and a replayed op may allocate what its
arguments ask for. Every such tensor is checked against one limit first:

    from opdiff.store.limits import check_size
    check_size("Tensor.add.0.forward.input.0", numel * itemsize)   # TensorTooLarge when over

The limit is OPDIFF_MAX_TENSOR_MB (megabytes, default `DEFAULT_MB`): the CLI's `--max-tensor-mb`
sets it in the environment, so worker processes (spawned, Ray) see the same one. A tensor over it
is not made: the compare falls back to the tensor's statistics, replay and check report the op as
not replayed / not checked with the message, never the whole command.
"""
from __future__ import annotations

import os

from ..errors import ConfigError

ENV = "OPDIFF_MAX_TENSOR_MB"
DEFAULT_MB = 4096
_MB = 1 << 20


class TensorTooLarge(ValueError):
    """A tensor a dump asks for is larger than `--max-tensor-mb` (a ValueError: readers treat
    it as a tensor they cannot read, and fall back to statistics)."""


def parse_mb(text: str, option: str = "--max-tensor-mb") -> int:
    """A limit in megabytes (a whole number, 1 or more), or ConfigError in one line."""
    try:
        value = int(str(text).strip())
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{option} expects a whole number of megabytes (1 or more), got {text!r}")
    return value


def max_tensor_mb() -> int:
    """The limit in force (OPDIFF_MAX_TENSOR_MB, else `DEFAULT_MB`)."""
    text = os.environ.get(ENV, "").strip()
    return parse_mb(text, ENV) if text else DEFAULT_MB


def set_max_tensor_mb(mb: int | str | None) -> None:
    """Set the limit for this process and the workers it starts (None: leave it as it is)."""
    if mb is not None:
        os.environ[ENV] = str(parse_mb(str(mb)))


def check_size(what: str, nbytes: int, why: str = "") -> None:
    """Raise TensorTooLarge when a tensor of `nbytes` bytes is over the limit.
    why: what asks for it (e.g. "a stride-0 reference over 4096 bytes")."""
    limit = max_tensor_mb()
    if nbytes > limit * _MB:
        need = -(-nbytes // _MB)
        raise TensorTooLarge(f"tensor {what} needs {need} MB, over --max-tensor-mb {limit}"
                             f"{': ' + why if why else ''}")


def numel(shape: object) -> int:
    """The element count a claimed shape asks for; ValueError for one that is not a list of
    whole numbers of 0 or more."""
    if not isinstance(shape, (list, tuple)):
        raise ValueError(f"a shape must be a list of sizes, not {shape!r:.60}")
    n = 1
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"a shape holds sizes of 0 or more, not {s!r:.60}")
        n *= s
    return n


__all__ = ["ENV", "DEFAULT_MB", "TensorTooLarge", "parse_mb", "max_tensor_mb",
           "set_max_tensor_mb", "check_size", "numel"]
