"""How large a replayed call's result will be, worked out before it runs, for
`--max-tensor-mb` (`calls.Call.check_size` asks it for every rebuilt call; the argument checks
are `guards.py`'s).

    from opdiff.comparison.replay.sizes import result_refusal
    result_refusal(op, func, args, kwargs)      # "" or "tensor result needs N MB, over ..."

The size comes from the tensors' shapes for ops that make no more than those
(`ops.SIZED_BY_INPUTS`: elementwise ops, reductions, views), else from the same call on the
meta device (tensors with shapes but no memory: the size the real kernel will make, by the op's
own shape rules), else, for ops whose result size depends on the values in their tensors
(`nonzero`, `bincount`, `one_hot`...), from those values. A call that fails on the meta device
(its arguments do not fit the op: some kernels allocate before they check), or whose size
cannot be told, is refused.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import torch

from ... import ops
from ...store.limits import TensorTooLarge, check_size

Args = list[Any]
Kwargs = dict[str, Any]


def arg(args: Args, kwargs: Kwargs, i: int, name: str) -> Any:
    """The argument at position i, else the keyword argument `name`."""
    return args[i] if len(args) > i else kwargs.get(name)


def number(v: Any) -> Any:
    """A 0-dim integer tensor as the int it holds (torch reads it so where an int goes), else
    the value itself."""
    if isinstance(v, torch.Tensor) and v.dim() == 0 and not v.is_floating_point() \
            and not v.is_complex() and v.dtype != torch.bool:
        return int(v)
    return v


def whole(v: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def _to_meta(value: Any, depth: int = 0) -> Any:
    """The argument on the meta device; floating tensors all float64 (a call recorded under
    autocast mixes float dtypes, which only its autocast reconciles; sizes do not depend on
    them)."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0 and not value.is_floating_point():
            return value.clone()     # (may stand for a number: `histc(x, bins=tensor(2**40))`)
        dtype = torch.float64 if value.is_floating_point() else value.dtype
        return torch.empty_strided(value.shape, value.stride(), dtype=dtype, device="meta")
    if isinstance(value, torch.device):
        return torch.device("meta")
    if isinstance(value, (list, tuple)) and depth < 6:
        items = [_to_meta(v, depth + 1) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict) and depth < 6:
        return {k: _to_meta(v, depth + 1) for k, v in value.items()}
    return value


def _made(value: Any, depth: int = 0) -> int:
    """Elements of every tensor in a (nested) result."""
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, (list, tuple)) and depth < 6:
        return sum(_made(v, depth + 1) for v in value)
    return 0


def tensors_in(args: Args, kwargs: Kwargs) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []

    def walk(v: Any, depth: int) -> None:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)) and depth < 6:
            for item in v:
                walk(item, depth + 1)
    walk(list(args) + list(kwargs.values()), 0)
    return out


def _by_values(method: str, args: Args, kwargs: Kwargs) -> int:
    """Elements made by an op whose result size depends on its tensors' values (the meta
    device cannot tell), from those values; -1 for an op this does not know."""
    tensors = tensors_in(args, kwargs)
    numel = sum(t.numel() for t in tensors)
    ranks = max((t.dim() for t in tensors), default=1)
    if method == "bincount":
        x, minlength = arg(args, kwargs, 0, "self"), arg(args, kwargs, 2, "minlength")
        top = int(x.max()) + 1 if isinstance(x, torch.Tensor) and x.numel() and \
            not x.is_floating_point() else 0
        return max(top, minlength if whole(minlength) else 0)
    if method == "one_hot":
        x, classes = arg(args, kwargs, 0, "tensor"), arg(args, kwargs, 1, "num_classes")
        if not isinstance(x, torch.Tensor) or x.is_floating_point():
            return 0
        top = int(x.max()) + 1 if x.numel() else 0
        return x.numel() * (classes if whole(classes) and classes > 0 else top)
    if method == "repeat_interleave":
        repeats = next((v for v in list(args[1:2]) + [kwargs.get("repeats")]
                        if isinstance(v, torch.Tensor)), None)
        if repeats is None and len(args) == 1 and isinstance(args[0], torch.Tensor):
            repeats = args[0]
        if isinstance(repeats, torch.Tensor) and not repeats.is_floating_point():
            return int(repeats.clamp(min=0).sum()) * max(1, numel // max(1, repeats.numel()))
        return -1
    if method in ("nonzero", "argwhere", "nonzero_static", "masked_select", "unique",
                  "unique_consecutive", "_unique", "_unique2", "unique_dim", "__getitem__",
                  "index", "_unsafe_index", "masked_scatter", "histc"):
        # at most one row of indices per element, or the elements themselves
        bins = arg(args, kwargs, 1, "bins") if method == "histc" else 0
        return numel * (ranks + 3) + (bins if whole(bins) and bins > 0 else 0)
    return -1


def result_refusal(op: str, func: Callable[..., Any], args: Args, kwargs: Kwargs) -> str:
    """Why the call's result would be over `--max-tensor-mb` (in float64), or "". An op whose
    result is no larger than its tensor arguments broadcast together (`ops.OpTraits.
    sized_by_inputs`: elementwise ops, reductions, views) is sized from their shapes; any other
    on the meta device, else from its tensors' values (`_by_values`). A call that fails on the
    meta device (its arguments do not fit the op: some kernels allocate before they check) or
    whose size cannot be told is refused."""
    tensors = tensors_in(args, kwargs)
    if ops.sized_by_inputs(op):
        shapes = [tuple(t.shape) for t in tensors]
        total = max([math.prod(s) for s in shapes] + [math.prod(broadcast(shapes))]
                    if shapes else [0])
    else:
        total, error = _on_meta(func, args, kwargs)
        if error:                # (the kernel may allocate before it checks what is wrong)
            return f"its arguments do not fit the op ({error})"
        if total < 0:
            total = _by_values(ops.method_of(op), args, kwargs)
        if total < 0:
            return (f"the size of its result cannot be told before it is made (no shape rule "
                    f"for {op[:80]} on the meta device)")
    try:
        check_size("result", total * 8, "what the call's arguments ask for, in float64")
    except TensorTooLarge as exc:
        return str(exc)
    return ""


def _on_meta(func: Callable[..., Any], args: Args, kwargs: Kwargs) -> tuple[int, str]:
    """(elements the call makes, run on the meta device, "") ; (-1, "") when the meta device
    cannot tell (no meta kernel, a size that depends on values); (-1, why) when the call fails
    there, as the real one will: its arguments do not fit the op."""
    factory = not tensors_in(args, kwargs)
    meta_kwargs = _to_meta(kwargs)
    if factory:                  # (made on the default device unless told otherwise)
        meta_kwargs["device"] = torch.device("meta")
    try:
        with warnings.catch_warnings(), torch._C.DisableTorchFunction():
            warnings.simplefilter("ignore")
            return _made(func(*_to_meta(args), **meta_kwargs)), ""
    except NotImplementedError:
        return -1, ""
    except Exception as exc:     # (a shape error, unless it says the meta device cannot tell)
        text = str(exc).strip()
        low = text.lower()
        if factory or "meta" in low or "data-dependent" in low or "item()" in low:
            return -1, ""
        return -1, (text.splitlines() or [type(exc).__name__])[0][:160]


def broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The shape the tensors broadcast to, () when they do not. (`torch.broadcast_shapes`
    imports sympy on its first call: seconds, for the first replay of a compare.)"""
    out: list[int] = []
    for dims in zip(*(s[::-1] + (1,) * (max(map(len, shapes)) - len(s)) for s in shapes)):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            return ()
        out.append(sizes.pop() if sizes else 1)
    return tuple(out[::-1])


__all__ = ["result_refusal", "broadcast", "arg", "number", "whole", "tensors_in"]
