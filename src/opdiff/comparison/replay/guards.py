"""What replay checks of a rebuilt call's arguments before its kernel sees them: a dump is
untrusted, and some of torch's CPU kernels trust their arguments (an index tensor's values, a
view's sizes and strides, optional statistics that must be there, an integer cast to an enum).
An op on replay's allow-list (`opdiff.ops.REPLAY_SAFE`) has a kernel that checks its arguments
itself, or is listed here (`CHECKED`) with the check replay makes for it. `calls.Call.check_size`
asks this for every rebuilt call (plain records, region chains, kernel programs, `opdiff
check`), then `sizes.result_refusal` for the size of its result.

    from opdiff.comparison.replay.guards import argument_refusal
    argument_refusal("Aten.embedding_dense_backward", args, kwargs)  # "" or why it must not run

tests/security/test_replay_fuzz.py holds every admitted op to this.
"""
from __future__ import annotations

import functools
import math
import re
from typing import Any, Callable

import torch

from ... import ops
from ...store.limits import max_tensor_mb
from .sizes import arg, number, tensors_in, whole

Args = list[Any]
Kwargs = dict[str, Any]


def _indices_within(what: str, t: Any, low: int, high: int, allowed: Any = None) -> str:
    """"" when `t` is an integer tensor whose values lie in [low, high) (or equal `allowed`)."""
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int64, torch.int32):
        return f"its {what} is not an int64 or int32 tensor"
    if t.numel() == 0:
        return ""
    bad = (t < low) | (t >= high)
    if whole(allowed):
        bad &= t != allowed
    if bool(bad.any()):
        return f"its {what} hold values outside [{low}, {high}) (a kernel that does not check them)"
    return ""


def _embedding_backward(args: Args, kwargs: Kwargs) -> str:
    # (grad_output, indices, num_weights, padding_idx, scale_grad_by_freq[, sparse]): the CPU
    # kernel adds rows of grad_output at the indices, and counts them, unchecked
    n = arg(args, kwargs, 2, "num_weights")
    if not whole(n) or n < 0:
        return "its num_weights is not a whole number of 0 or more"
    return _indices_within("indices", arg(args, kwargs, 1, "indices"), 0, n,
                           arg(args, kwargs, 3, "padding_idx"))


def _pool_backward(index: int, dims: int) -> Callable[[Args, Kwargs], str]:
    """max_pool*_with_indices_backward, adaptive_max_pool*_backward: grad_input[indices] +=
    grad_output, per plane, the indices unchecked."""
    def check(args: Args, kwargs: Kwargs) -> str:
        grad, x = arg(args, kwargs, 0, "grad_output"), arg(args, kwargs, 1, "self")
        indices = arg(args, kwargs, index, "indices")
        if not all(isinstance(t, torch.Tensor) for t in (grad, x, indices)):
            return "its gradient, input and indices are not all tensors"
        if x.dim() < dims or grad.dim() != x.dim() or tuple(indices.shape) != tuple(grad.shape) \
                or tuple(grad.shape[:-dims]) != tuple(x.shape[:-dims]):
            return (f"its indices {list(indices.shape)}, gradient {list(grad.shape)} and input "
                    f"{list(x.shape)} do not fit each other")
        if indices.dtype != torch.int64:
            return "its indices are not an int64 tensor"
        return _indices_within("indices", indices, 0, math.prod(x.shape[-dims:]))
    return check


def _view(args: Args, kwargs: Kwargs) -> str:
    # _reshape_alias(self, size, stride), as_strided(self, size, stride, storage_offset): a view
    # of self's storage that the CPU kernel (_reshape_alias) does not check against it
    x, size, stride = (arg(args, kwargs, 0, "self"), arg(args, kwargs, 1, "size"),
                       arg(args, kwargs, 2, "stride"))
    offset = arg(args, kwargs, 3, "storage_offset")
    offset = x.storage_offset() if offset is None and isinstance(x, torch.Tensor) else offset
    if not isinstance(x, torch.Tensor) or not isinstance(size, (list, tuple, torch.Size)) \
            or not isinstance(stride, (list, tuple)) or len(size) != len(stride) \
            or not all(whole(v) and v >= 0 for v in [*size, *stride, offset]):
        return "its sizes, strides and offset are not whole numbers of 0 or more, one per dimension"
    if 0 in size:
        return ""
    last = offset + sum((s - 1) * st for s, st in zip(size, stride))
    if last >= x.untyped_storage().nbytes() // max(x.element_size(), 1):
        return "its sizes and strides reach past the tensor's storage"
    return ""


def _batch_norm(training: int) -> Callable[[Args, Kwargs], str]:
    """The batch norm kernels index their weight, bias and running statistics by channel and
    read the statistics in eval mode without checking that they are there. Arguments: (input,
    weight, bias, running_mean, running_var, training at `training`, ...), or `training` -1:
    never training (`_no_training`); `_native_batch_norm_legit.no_stats` has no statistics and
    its `training` at 3."""
    def check(args: Args, kwargs: Kwargs) -> str:
        x = arg(args, kwargs, 0, "input")
        if not isinstance(x, torch.Tensor) or x.dim() < 2:
            return "its input is not a tensor of 2 or more dimensions"
        channels = x.shape[1]
        no_stats = isinstance(arg(args, kwargs, 3, "training"), bool)
        where = {"weight": 1, "bias": 2, "running_mean": 3, "running_var": 4}
        values = {name: (None if no_stats and i > 2 else arg(args, kwargs, i, name))
                  for name, i in where.items()}
        for name, t in values.items():
            if t is not None and (not isinstance(t, torch.Tensor) or t.dim() != 1
                                  or t.shape[0] != channels):
                return f"its {name} is not one value per channel ({channels})"
        at = 3 if no_stats else training
        train = arg(args, kwargs, at, "training") if at >= 0 else False
        if train is not True and (values["running_mean"] is None or values["running_var"] is None):
            return "it normalises by running statistics it was not given"
        return ""
    return check


_ENUMS = {"ScalarType": frozenset(range(12)) | {15}, "MemoryFormat": frozenset(range(4)),
          "Layout": frozenset({0}), "reduction": frozenset(range(3))}


_ENUM_ARG = re.compile(r"\b(ScalarType|MemoryFormat|Layout)\??\s+(\w+)")


@functools.lru_cache(maxsize=1024)
def _schema_facts(packet: str) -> tuple[dict[Any, str], bool, frozenset[str]]:
    """For an aten packet: {position or name: enum type} of the arguments that are an enum in
    some overload, whether some overload takes and returns plain numbers only (TorchScript's
    `remainder.int`, whose C++ divides by zero unchecked), and the keyword arguments an
    overload writes into (`out`, `grad_input`: the packet picks that overload when one is
    given)."""
    found = getattr(torch.ops.aten, packet, None)
    enums: dict[Any, str] = {}
    scalar = False
    written: set[str] = set()
    if not isinstance(found, torch._ops.OpOverloadPacket):
        return enums, scalar, frozenset(written)
    for name in found.overloads():
        schema = getattr(found, name)._schema
        # (the Python schema types call them ints; the schema's text names them)
        named = dict((n, k) for k, n in _ENUM_ARG.findall(str(schema).split(") ->")[0]))
        named.update({"reduction": "reduction"} if "int reduction" in str(schema) else {})
        for i, a in enumerate(schema.arguments):
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write:
                written.add(a.name)
            kind = named.get(a.name)
            if kind is not None:
                enums[a.name] = kind
                if not a.kwarg_only:
                    enums[i] = kind
        if not any("Tensor" in str(r.type) for r in schema.returns):
            scalar = True
    return enums, scalar, frozenset(written)


def _aten_refusal(op: str, args: Args, kwargs: Kwargs) -> str:
    """An aten call through its packet takes plain integers for dtypes, layouts and memory
    formats, and casts them to the enum unchecked; and its overloads for plain numbers run
    TorchScript's integer arithmetic (a division by zero kills the process)."""
    if not op.startswith("Aten."):
        return ""
    enums, scalar, written = _schema_facts(ops.method_of(op))
    if written & set(kwargs):
        return f"it writes into the tensor it is given as {sorted(written & set(kwargs))[0]}="
    for key, v in list(enumerate(args)) + list(kwargs.items()):
        kind = enums.get(key)
        if kind is not None and whole(v) and v not in _ENUMS[kind]:
            return f"it passes {v} where the op takes a {kind}"
    if scalar and not tensors_in(args, kwargs):
        return "it computes on plain numbers only (no tensor)"
    return ""


def _count(index: int, name: str, bound: Callable[[Args, Kwargs], int], what: str
           ) -> Callable[[Args, Kwargs], str]:
    """A whole-number argument that sets how much the kernel makes besides its result
    (mvlgamma's p, tensor_split's sections, combinations' r)."""
    def check(args: Args, kwargs: Kwargs) -> str:
        v = number(arg(args, kwargs, index, name))
        if whole(v) and not 0 <= v <= bound(args, kwargs):
            return f"its {name} ({v}) asks for {what}"
        return ""
    return check


def _range(args: Args, kwargs: Kwargs) -> str:
    """arange/range in an integer dtype divide by their step cast to it (0.5 becomes 0: a
    division by zero that kills the process)."""
    dtype = kwargs.get("dtype")
    if dtype is None or (isinstance(dtype, torch.dtype) and (dtype.is_floating_point
                                                             or dtype.is_complex)):
        return ""
    numbers = [v for v in args if isinstance(v, (int, float))]
    if any(isinstance(v, float) and not v.is_integer() for v in numbers) or \
            (len(numbers) >= 3 and int(numbers[2]) == 0):
        return "its start, end or step is not a whole nonzero number for an integer dtype"
    return ""


def _group_norm(x_at: int, n_at: int) -> Callable[[Args, Kwargs], str]:
    """native_group_norm(_backward) take N, C, HxW and group besides the input, and allocate
    their statistics from them before they check them against it."""
    def check(args: Args, kwargs: Kwargs) -> str:
        x = arg(args, kwargs, x_at, "input")
        n, c, hw, group = (arg(args, kwargs, n_at + i, name)
                           for i, name in enumerate(("N", "C", "HxW", "group")))
        if not isinstance(x, torch.Tensor) or not all(whole(v) and v >= 0 for v in (n, c, hw)) \
                or not whole(group) or group <= 0 or c % group or n * c * hw != x.numel():
            return "its N, C, HxW and group do not describe its input"
        return ""
    return check


def _pdist(args: Args, kwargs: Kwargs) -> str:
    x = arg(args, kwargs, 0, "input")
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[0] == 0:
        return "its input has no rows (its gradient kernel reads past them)"
    return ""


def _padding(at: int, dims: int) -> Callable[[Args, Kwargs], str]:
    """reflection_pad*d_backward and replication_pad*d_backward read 2 * dims paddings without
    counting them."""
    def check(args: Args, kwargs: Kwargs) -> str:
        padding = arg(args, kwargs, at, "padding")
        if not isinstance(padding, (list, tuple)) or len(padding) != 2 * dims:
            return f"its padding is not {2 * dims} numbers"
        return ""
    return check


def _margin(at: int, multilabel: bool) -> Callable[[Args, Kwargs], str]:
    """multi_margin_loss and multilabel_margin_loss (their backwards above all) index their
    input's classes by the target's values, and frames by its length."""
    def check(args: Args, kwargs: Kwargs) -> str:
        x, target = arg(args, kwargs, at - 1, "self"), arg(args, kwargs, at, "target")
        if not isinstance(x, torch.Tensor) or not isinstance(target, torch.Tensor) \
                or x.dim() not in (1, 2) or x.numel() == 0:
            return "its input and target are not a 1-D or 2-D input and a tensor"
        classes = x.shape[-1]
        frames = x.shape[0] if x.dim() == 2 else 1
        if tuple(target.shape) != (tuple(x.shape) if multilabel else (frames,)[:target.dim()]) \
                or target.numel() != (x.numel() if multilabel else frames):
            return f"its target {list(target.shape)} does not fit its input {list(x.shape)}"
        weight = None if multilabel else arg(args, kwargs, at + 3, "weight")
        if weight is not None and (not isinstance(weight, torch.Tensor)
                                   or weight.numel() != classes):
            return f"its weight is not one value per class ({classes})"
        return _indices_within("target", target, -1 if multilabel else 0, classes)
    return check


def _elements(args: Args, kwargs: Kwargs) -> int:
    """Elements of float64 that --max-tensor-mb allows."""
    return max_tensor_mb() * (1 << 20) // 8


def _numel0(args: Args, kwargs: Kwargs) -> int:
    x = args[0] if args else kwargs.get("self", kwargs.get("input"))
    return x.numel() if isinstance(x, torch.Tensor) else 0


# Checked by replay, by method name (see the module's docstring).
_CHECKS: dict[str, Callable[[Args, Kwargs], str]] = {
    "embedding_dense_backward": _embedding_backward,
    "embedding_backward": _embedding_backward,
    "max_pool2d_with_indices_backward": _pool_backward(7, 2),
    "max_pool3d_with_indices_backward": _pool_backward(7, 3),
    "adaptive_max_pool2d_backward": _pool_backward(2, 2),
    "adaptive_max_pool3d_backward": _pool_backward(2, 3),
    "_reshape_alias": _view,
    "as_strided": _view,
    "native_batch_norm": _batch_norm(5),
    "_native_batch_norm_legit": _batch_norm(5),
    "_native_batch_norm_legit_no_training": _batch_norm(-1),
    "_native_batch_norm_legit_functional": _batch_norm(5),
    "native_group_norm": _group_norm(0, 3),
    "native_group_norm_backward": _group_norm(1, 5),
    "pdist": _pdist,
    **{f"{kind}_pad{d}d_backward": _padding(2, d) for kind in ("reflection", "replication")
       for d in (1, 2, 3)},
    "multi_margin_loss": _margin(1, False),
    "multi_margin_loss_backward": _margin(2, False),
    "multilabel_margin_loss": _margin(1, True),
    "multilabel_margin_loss_forward": _margin(1, True),
    "multilabel_margin_loss_backward": _margin(2, True),
    # (histc makes its bins before it checks its range)
    "histc": _count(1, "bins", _elements, "more bins than --max-tensor-mb allows"),
    "arange": _range,
    "range": _range,
    "mvlgamma": _count(1, "p", lambda a, k: 1 << 16, "that many terms"),
    "mvlgamma_": _count(1, "p", lambda a, k: 1 << 16, "that many terms"),
    "tensor_split": _count(1, "sections", lambda a, k: max(_numel0(a, k), 1 << 12),
                           "that many tensors"),
    "combinations": _count(1, "r", lambda a, k: max(_numel0(a, k), 1), "that many factors"),
}
CHECKED = frozenset(_CHECKS)


def argument_refusal(op: str, args: Args, kwargs: Kwargs) -> str:
    """Why the call's arguments must not reach its kernel, or ""."""
    check = _CHECKS.get(ops.method_of(op))
    return (check(args, kwargs) if check is not None else "") or _aten_refusal(op, args, kwargs)


__all__ = ["argument_refusal", "CHECKED"]
