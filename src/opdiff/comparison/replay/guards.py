"""What replay checks of a rebuilt call before its kernel sees it: a dump is untrusted, and
some of torch's CPU kernels trust their arguments (an index tensor's values, a view's sizes and
strides, optional statistics that must be there, an integer cast to an enum). A kernel on
replay's allow-list (`opdiff.ops.REPLAY_SAFE`) checks its arguments itself, or is listed here
(`CHECKED`) with the check replay makes for it; and every call's result is bounded by
`--max-tensor-mb` before anything is allocated. `calls.Call.check_size` asks both for every
rebuilt call (plain records, region chains, kernel programs, `opdiff check`).

    from opdiff.comparison.replay.guards import argument_refusal, result_refusal
    argument_refusal("Aten.embedding_dense_backward", args, kwargs)  # "" or why it must not run
    result_refusal(op, func, args, kwargs)                           # "" or "tensor ... needs"

The result's size comes from its tensors' shapes for ops that make no more than those
(`ops.SIZED_BY_INPUTS`), else from the same call on the meta device (tensors with shapes but
no memory: the size the real kernel will make, by the op's own shape rules), else, for ops
whose result size depends on the values in their tensors (`nonzero`, `bincount`, `one_hot`...),
from those values; a call whose result cannot be bounded either way is refused.
tests/security/test_replay_fuzz.py holds every admitted op to this.
"""
from __future__ import annotations

import functools
import math
import re
import warnings
from typing import Any, Callable

import torch

from ... import ops
from ...store.limits import TensorTooLarge, check_size, max_tensor_mb

Args = list[Any]
Kwargs = dict[str, Any]


def _arg(args: Args, kwargs: Kwargs, i: int, name: str) -> Any:
    return args[i] if len(args) > i else kwargs.get(name)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _indices_within(what: str, t: Any, low: int, high: int, allowed: Any = None) -> str:
    """"" when `t` is an integer tensor whose values lie in [low, high) (or equal `allowed`)."""
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int64, torch.int32):
        return f"its {what} is not an int64 or int32 tensor"
    if t.numel() == 0:
        return ""
    bad = (t < low) | (t >= high)
    if _int(allowed):
        bad &= t != allowed
    if bool(bad.any()):
        return f"its {what} hold values outside [{low}, {high}) (a kernel that does not check them)"
    return ""


def _embedding_backward(args: Args, kwargs: Kwargs) -> str:
    # (grad_output, indices, num_weights, padding_idx, scale_grad_by_freq[, sparse]): the CPU
    # kernel adds rows of grad_output at the indices, and counts them, unchecked
    n = _arg(args, kwargs, 2, "num_weights")
    if not _int(n) or n < 0:
        return "its num_weights is not a whole number of 0 or more"
    return _indices_within("indices", _arg(args, kwargs, 1, "indices"), 0, n,
                           _arg(args, kwargs, 3, "padding_idx"))


def _pool_backward(index: int, dims: int) -> Callable[[Args, Kwargs], str]:
    """max_pool*_with_indices_backward, adaptive_max_pool*_backward: grad_input[indices] +=
    grad_output, per plane, the indices unchecked."""
    def check(args: Args, kwargs: Kwargs) -> str:
        grad, x = _arg(args, kwargs, 0, "grad_output"), _arg(args, kwargs, 1, "self")
        indices = _arg(args, kwargs, index, "indices")
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
    x, size, stride = (_arg(args, kwargs, 0, "self"), _arg(args, kwargs, 1, "size"),
                       _arg(args, kwargs, 2, "stride"))
    offset = _arg(args, kwargs, 3, "storage_offset")
    offset = x.storage_offset() if offset is None and isinstance(x, torch.Tensor) else offset
    if not isinstance(x, torch.Tensor) or not isinstance(size, (list, tuple, torch.Size)) \
            or not isinstance(stride, (list, tuple)) or len(size) != len(stride) \
            or not all(_int(v) and v >= 0 for v in [*size, *stride, offset]):
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
        x = _arg(args, kwargs, 0, "input")
        if not isinstance(x, torch.Tensor) or x.dim() < 2:
            return "its input is not a tensor of 2 or more dimensions"
        channels = x.shape[1]
        no_stats = isinstance(_arg(args, kwargs, 3, "training"), bool)
        where = {"weight": 1, "bias": 2, "running_mean": 3, "running_var": 4}
        values = {name: (None if no_stats and i > 2 else _arg(args, kwargs, i, name))
                  for name, i in where.items()}
        for name, t in values.items():
            if t is not None and (not isinstance(t, torch.Tensor) or t.dim() != 1
                                  or t.shape[0] != channels):
                return f"its {name} is not one value per channel ({channels})"
        at = 3 if no_stats else training
        train = _arg(args, kwargs, at, "training") if at >= 0 else False
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
        if kind is not None and _int(v) and v not in _ENUMS[kind]:
            return f"it passes {v} where the op takes a {kind}"
    if scalar and not _tensors(args, kwargs):
        return "it computes on plain numbers only (no tensor)"
    return ""


def _count(index: int, name: str, bound: Callable[[Args, Kwargs], int], what: str
           ) -> Callable[[Args, Kwargs], str]:
    """A whole-number argument that sets how much the kernel makes besides its result
    (mvlgamma's p, tensor_split's sections, combinations' r)."""
    def check(args: Args, kwargs: Kwargs) -> str:
        v = _arg(args, kwargs, index, name)
        if _int(v) and not 0 <= v <= bound(args, kwargs):
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
        x = _arg(args, kwargs, x_at, "input")
        n, c, hw, group = (_arg(args, kwargs, n_at + i, name)
                           for i, name in enumerate(("N", "C", "HxW", "group")))
        if not isinstance(x, torch.Tensor) or not all(_int(v) and v >= 0 for v in (n, c, hw)) \
                or not _int(group) or group <= 0 or c % group or n * c * hw != x.numel():
            return "its N, C, HxW and group do not describe its input"
        return ""
    return check


def _pdist(args: Args, kwargs: Kwargs) -> str:
    x = _arg(args, kwargs, 0, "input")
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[0] == 0:
        return "its input has no rows (its gradient kernel reads past them)"
    return ""


def _padding(at: int, dims: int) -> Callable[[Args, Kwargs], str]:
    """reflection_pad*d_backward and replication_pad*d_backward read 2 * dims paddings without
    counting them."""
    def check(args: Args, kwargs: Kwargs) -> str:
        padding = _arg(args, kwargs, at, "padding")
        if not isinstance(padding, (list, tuple)) or len(padding) != 2 * dims:
            return f"its padding is not {2 * dims} numbers"
        return ""
    return check


def _margin(at: int, multilabel: bool) -> Callable[[Args, Kwargs], str]:
    """multi_margin_loss and multilabel_margin_loss (their backwards above all) index their
    input's classes by the target's values, and frames by its length."""
    def check(args: Args, kwargs: Kwargs) -> str:
        x, target = _arg(args, kwargs, at - 1, "self"), _arg(args, kwargs, at, "target")
        if not isinstance(x, torch.Tensor) or not isinstance(target, torch.Tensor) \
                or x.dim() not in (1, 2) or x.numel() == 0:
            return "its input and target are not a 1-D or 2-D input and a tensor"
        classes = x.shape[-1]
        frames = x.shape[0] if x.dim() == 2 else 1
        if tuple(target.shape) != (tuple(x.shape) if multilabel else (frames,)[:target.dim()]) \
                or target.numel() != (x.numel() if multilabel else frames):
            return f"its target {list(target.shape)} does not fit its input {list(x.shape)}"
        weight = None if multilabel else _arg(args, kwargs, at + 3, "weight")
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


# -- the result's size, before it is made -----------------------------------------------------

def _to_meta(value: Any, depth: int = 0) -> Any:
    """The argument on the meta device; floating tensors all float64 (a call recorded under
    autocast mixes float dtypes, which only its autocast reconciles; sizes do not depend on
    them)."""
    if isinstance(value, torch.Tensor):
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


def _tensors(args: Args, kwargs: Kwargs) -> list[torch.Tensor]:
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
    tensors = _tensors(args, kwargs)
    numel = sum(t.numel() for t in tensors)
    ranks = max((t.dim() for t in tensors), default=1)
    if method == "bincount":
        x, minlength = _arg(args, kwargs, 0, "self"), _arg(args, kwargs, 2, "minlength")
        top = int(x.max()) + 1 if isinstance(x, torch.Tensor) and x.numel() and \
            not x.is_floating_point() else 0
        return max(top, minlength if _int(minlength) else 0)
    if method == "one_hot":
        x, classes = _arg(args, kwargs, 0, "tensor"), _arg(args, kwargs, 1, "num_classes")
        if not isinstance(x, torch.Tensor) or x.is_floating_point():
            return 0
        top = int(x.max()) + 1 if x.numel() else 0
        return x.numel() * (classes if _int(classes) and classes > 0 else top)
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
        bins = _arg(args, kwargs, 1, "bins") if method == "histc" else 0
        return numel * (ranks + 3) + (bins if _int(bins) and bins > 0 else 0)
    return -1


def result_refusal(op: str, func: Callable[..., Any], args: Args, kwargs: Kwargs) -> str:
    """Why the call's result would be over `--max-tensor-mb` (in float64), or "". An op whose
    result is no larger than its tensor arguments broadcast together (`ops.OpTraits.
    sized_by_inputs`: elementwise ops, reductions, views) is sized from their shapes; any other
    on the meta device, else from its tensors' values (`_by_values`). A call that fails on the
    meta device (its arguments do not fit the op: some kernels allocate before they check) or
    whose size cannot be told is refused."""
    tensors = _tensors(args, kwargs)
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
    factory = not _tensors(args, kwargs)
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


__all__ = ["argument_refusal", "result_refusal", "broadcast", "CHECKED"]
