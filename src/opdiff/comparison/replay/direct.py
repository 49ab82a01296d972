"""Reference gradients computed without running the forward call again, for ops whose backward
kernel does not read the forward's result.

    from opdiff.comparison.replay.direct import backward_reference
    grads = backward_reference(fwd_record, load, leaves, grads, autocast)   # or None

The replay's reference for a backward record is the forward call re-run in the target's
dtypes and differentiated by autograd. For `conv2d` autograd calls
`aten.convolution_backward(grad_output, input, weight, ...)`, which needs the inputs and the
output gradient, not the output: calling it directly gives the same tensors (tested bitwise
against the autograd run) without the forward convolution, which in bfloat16 on a CPU without
bf16 units was about 80% of a conv backward's reference. Under CPU autocast the arguments are
cast to its dtype first and the gradients cast back, as autocast's casts do in autograd.
Anything else (string padding, unbatched input, one tensor passed twice) returns None: the
caller runs autograd. The float64 run of a conv backward takes the same way.

    from opdiff.comparison.replay.direct import forward_float32
    approx, slack = forward_float32(record, load)         # or None

The float64 conv forward was the largest cost left in a healthy pair's replay (77 ms against
12 ms in float32 for a 24x32x32x32 batch, one thread). `forward_float32` gives the conv in
float32 with a proven bound on its distance to the float64 result, for `rules.settle(slack=)`:
every input (float32, bfloat16 or float16) is exact in float32, and a summation-based kernel
(direct or im2col+GEMM, what torch runs for float32 on a CPU at "highest" precision; FMA or not,
in any order) computing y = sum of K products has |fl(y) - y| <= gamma_K * sum |x||w| with
gamma_K = K u / (1 - K u), u = 2^-24 (Higham, Accuracy and Stability, section 3.1). The sums
of |x||w| are bounded by Cauchy-Schwarz from the norms of x and w (no second conv).

    from opdiff.comparison.replay.direct import backward_float32
    bounded = backward_float32(fwd, load, leaves, grads)   # {leaf: (weight gradient, slack)}

The same for a conv's weight gradient, whose float64 run was 66 of a conv backward's 86 ms: a
sum over batch and pixels (24576 products here), computed in float32 a few samples at a time
(K = samples x output pixels <= 2048 products per sum, which keeps the bound well below what
the rules need) and the partial sums added in float64.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Optional

import torch

from ...ops import traits
from .calls import flat_descriptors, rebuild_call
from .calls import Load
from ...store.schema import Record

_CONV2D = ("Functional.conv2d", "Torch.conv2d")


def exact_in_dtype(record: Record, grads: Optional[dict[int, torch.Tensor]] = None
                   ) -> bool:
    """Is the call's result in its inputs' dtype exactly its float64 result (with `grads`, the
    output gradients of a backward: its gradients)? For the ops `ops.traits` calls
    `exact_in_dtype` (and, backward, `exact_backward` with tensors of one shape and no alpha)
    whose tensor arguments and gradients are all of one real floating dtype: a gradient of
    another dtype would be cast on the way. No widening, no float64 autograd: several times
    faster."""
    known = traits(str(record["op"]))
    if not (known.exact_in_dtype or (grads is not None and known.exact_backward)):
        return False
    descs = flat_descriptors(list(record["inputs"])
                             + list(record["kwargs"].values()))
    if known.exact_backward:
        shapes = {tuple(d.get("shape") or ()) for d in descs}
        shapes |= {tuple(g.shape) for g in (grads or {}).values()}
        if len(shapes) != 1 or len(record["inputs"]) != 2 or record["kwargs"]:
            return False
    dtypes = {str(d.get("dtype", "")).replace("torch.", "") for d in descs}
    dtypes |= {str(g.dtype).replace("torch.", "") for g in (grads or {}).values()}
    return len(dtypes) == 1 and dtypes <= {"float32", "float64", "bfloat16", "float16"}


def _conv2d_signature(input: Any, weight: Any, bias: Any = None, stride: Any = 1,
                      padding: Any = 0, dilation: Any = 1, groups: Any = 1) -> None:
    """The parameters of `torch.nn.functional.conv2d`."""


_SIG = inspect.signature(_conv2d_signature)


def _pair(v: Any) -> Optional[list[int]]:
    if isinstance(v, int) and not isinstance(v, bool):
        return [v, v]
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) for x in v):
        return [int(x) for x in v]
    return None


def backward_reference(fwd: Record, load: Load, leaves: list[int],
                       grads: dict[int, torch.Tensor], autocast: Optional[torch.dtype],
                       cast: Optional[torch.dtype] = None
                       ) -> Optional[list[Optional[torch.Tensor]]]:
    """The gradients of the forward call's argument tensors `leaves` (capture order) for the
    recorded output gradients `grads`, as `local._run` computes them (`cast`: the floating
    arguments cast to it first, float64 for the exact run), or None when this module has no
    direct way for the op."""
    if fwd["op"] not in _CONV2D or set(grads) != {0}:
        return None
    call = rebuild_call(fwd, load, cast)
    try:
        bound = _SIG.bind(*call.args, **call.kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    a = bound.arguments
    x, w, b = a["input"], a["weight"], a["bias"]
    stride, padding, dilation = _pair(a["stride"]), _pair(a["padding"]), _pair(a["dilation"])
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dim() == 4
            and w.dim() == 4 and stride and padding and dilation
            and isinstance(a["groups"], int) and (b is None or isinstance(b, torch.Tensor))):
        return None
    role = {id(t): i for i, (_k, t) in enumerate(call.tensors)}
    if len(role) != len(call.tensors):
        return None                     # a tensor passed twice: leave it to autograd
    index = {role.get(id(x)): 0, role.get(id(w)): 1}
    if b is not None:
        index[role.get(id(b))] = 2
    if any(i not in index for i in leaves):
        return None
    compute = autocast
    if compute is None:
        if len({t.dtype for t in (x, w, b) if t is not None}) != 1:
            return None
        compute = x.dtype
    args = [t.to(compute) if t is not None and t.is_floating_point() else t for t in (x, w, b)]
    wanted = {index[i] for i in leaves}
    mask = [k in wanted for k in range(3)]
    g = grads[0].to(compute)
    got = torch.ops.aten.convolution_backward(
        g, args[0], args[1], [w.shape[0]] if b is not None else None, stride, padding,
        dilation, False, [0, 0], a["groups"], mask)
    originals = (x, w, b)
    out: list[Optional[torch.Tensor]] = []
    for i in leaves:
        k = index[i]
        grad = got[k]
        original = originals[k]
        out.append(None if grad is None or original is None else grad.to(original.dtype))
    return out


_EXACT_IN_FLOAT32 = (torch.float32, torch.bfloat16, torch.float16)
_U32 = 2.0 ** -24
_TINY32 = 2.0 ** -149      # float32's smallest subnormal: what underflow may lose per operation


def _conv2d_arguments(call: Any) -> Optional[dict[str, Any]]:
    """The bound arguments of a conv2d call this module handles, else None."""
    try:
        bound = _SIG.bind(*call.args, **call.kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    a = dict(bound.arguments)
    x, w, b = a["input"], a["weight"], a["bias"]
    a["stride"], a["padding"], a["dilation"] = (_pair(a[k]) for k in ("stride", "padding",
                                                                      "dilation"))
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dim() == 4
            and w.dim() == 4 and a["stride"] and a["padding"] and a["dilation"]
            and isinstance(a["groups"], int) and (b is None or isinstance(b, torch.Tensor))):
        return None
    return a


def _ieee_float32() -> bool:
    """Does torch compute float32 convolutions in float32 (no TF32 or bf16 shortcuts)?"""
    conv = getattr(getattr(torch.backends, "mkldnn", None), "conv", None)
    precision = getattr(conv, "fp32_precision", "none")
    return torch.get_float32_matmul_precision() == "highest" and precision in ("none", "ieee")


def forward_float32(record: Record, load: Load
                    ) -> Optional[tuple[list[torch.Tensor], list[float]]]:
    """([output in float32], [L2 bound of its distance to the float64 result]) for a conv2d
    forward record (see the module docstring), or None: another op, an input that float32
    cannot hold exactly, inf/NaN, or float32 not computed as IEEE float32 here."""
    if record["op"] not in _CONV2D or not _ieee_float32():
        return None
    a = _conv2d_arguments(rebuild_call(record, load, None))
    if a is None:
        return None
    x, w, b = a["input"], a["weight"], a["bias"]
    if any(t is not None and (t.dtype not in _EXACT_IN_FLOAT32 or t.is_complex())
           for t in (x, w, b)):
        return None
    x, w = x.float(), w.float()
    b = b.float() if b is not None else None
    rest = (a["stride"], a["padding"], a["dilation"], a["groups"])
    with torch._C.DisableTorchFunction():
        out = torch.conv2d(x, w, b, *rest)
    k = (w.shape[1] * w.shape[2] * w.shape[3]) + (1 if b is not None else 0)
    gamma = k * _U32 / (1 - k * _U32)
    # ||sum |x||w| || over the outputs, by Cauchy-Schwarz per output (within pi/2 of the sums
    # themselves for signs like noise, at no cost): each input element sits in at most kh*kw
    # patches, so it is at most ||w|| ||x|| sqrt(kh kw), plus ||b|| sqrt(outputs per channel).
    norm = _norm(w) * _norm(x) * math.sqrt(w.shape[2] * w.shape[3])
    if b is not None:
        norm += _norm(b) * math.sqrt(out.numel() / max(out.shape[1], 1))
    if not (math.isfinite(norm) and _all_finite(out)) or gamma >= 0.5:
        return None
    # |error| <= gamma * exact sums <= gamma / (1 - gamma) * computed sums, plus what gradual
    # underflow may lose (k operations per element); 1e-6 for the float64 norm's own rounding
    slack = (gamma / (1 - gamma) * norm + 2 * k * _TINY32 * math.sqrt(out.numel())) * (1 + 1e-6)
    return [out], [slack]


_SAMPLE_PRODUCTS = 2048     # products per float32 sum of the weight gradient (see above)


def _all_finite(t: torch.Tensor) -> bool:
    """No inf or NaN in `t`, shown by a finite sum (inf and NaN propagate through a sum; a sum
    that overflows says False, which only sends the caller to float64): one pass, a fifth of
    isfinite().all()'s cost."""
    return math.isfinite(float(t.sum()))


def _norm(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t.reshape(-1), dtype=torch.float64))


def backward_float32(fwd: Record, load: Load, leaves: list[int],
                     grads: dict[int, torch.Tensor]
                     ) -> Optional[dict[int, tuple[torch.Tensor, float]]]:
    """{leaf: (its gradient in float64 from float32 partial sums, L2 bound of its distance to
    the float64 result)} for a conv2d's weight among `leaves` (see the module docstring), or
    None: another op, no weight leaf, or inputs float32 cannot hold exactly."""
    if fwd["op"] not in _CONV2D or set(grads) != {0} or not _ieee_float32():
        return None
    call = rebuild_call(fwd, load, None)
    a = _conv2d_arguments(call)
    if a is None:
        return None
    x, w, g = a["input"], a["weight"], grads[0]
    role = {id(t): i for i, (_k, t) in enumerate(call.tensors)}
    leaf, x_leaf = role.get(id(w)), role.get(id(x))
    if len(role) != len(call.tensors) or g.dim() != 4 or any(
            t.dtype not in _EXACT_IN_FLOAT32 or t.is_complex() for t in (x, w, g)):
        return None
    x, w, g = x.float(), w.float(), g.float()
    out = {}
    if x_leaf in leaves:
        got = _input_gradient_float32(x, w, g, a)
        if got is not None:
            out[x_leaf] = got
    if leaf not in leaves:
        return out or None
    rest = (a["stride"], a["padding"], a["dilation"], False, [0, 0], a["groups"],
            [False, True, False])
    pixels = g.shape[2] * g.shape[3]
    step = max(1, _SAMPLE_PRODUCTS // max(pixels, 1))
    total = torch.zeros(w.shape, dtype=torch.float64)
    # Cauchy-Schwarz per weight entry and chunk: sum |g||x| <= ||g[chunk, out channel]||
    # ||x[chunk, its in channel]|| (distinct pixels for distinct products: stride >= 1)
    per_group = w.shape[0] // a["groups"]
    channel = (torch.arange(w.shape[0])[:, None] // per_group) * w.shape[1] + \
        torch.arange(w.shape[1])[None, :]
    sums = torch.zeros(w.shape[:2], dtype=torch.float64)
    chunks = 0
    with torch._C.DisableTorchFunction():
        for i in range(0, x.shape[0], step):
            gi, xi = g[i:i + step], x[i:i + step]
            total += torch.ops.aten.convolution_backward(gi, xi, w, None, *rest)[1].double()
            ng = torch.linalg.vector_norm(gi, dim=(0, 2, 3), dtype=torch.float64)
            nx = torch.linalg.vector_norm(xi, dim=(0, 2, 3), dtype=torch.float64)
            sums += ng[:, None] * nx[channel]
            chunks += 1
    k = step * pixels
    gamma = k * _U32 / (1 - k * _U32)
    norm = float(sums.norm()) * math.sqrt(w.shape[2] * w.shape[3])
    if not (math.isfinite(norm) and _all_finite(total)) or gamma >= 0.5:
        return None
    # float32 sums (gamma_k each, underflow 2k tiny per element) and their float64 total
    slack = ((gamma / (1 - gamma) + 2 * chunks * 2.0 ** -53) * norm * (1 + gamma)
             + 2 * k * chunks * _TINY32 * math.sqrt(total.numel())) * (1 + 1e-6)
    out[leaf] = (total, slack)
    return out


def _input_gradient_float32(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor,
                            a: dict[str, Any]) -> Optional[tuple[torch.Tensor, float]]:
    """(a conv2d's input gradient in float32, L2 bound of its distance to the float64 result):
    a transposed convolution, each element a sum of at most K = C_out / groups * kh * kw
    products w * g, so as `forward_float32` |error| <= gamma_K sum |w||g|, and by
    Cauchy-Schwarz over the outputs the norm of those sums is at most ||w|| ||g|| sqrt(kh kw)
    (each g element meets each weight of its channel at most once per input pixel, and an
    input pixel sits under each of the kh kw kernel positions at most once). None where a
    number is not finite."""
    rest = (a["stride"], a["padding"], a["dilation"], False, [0, 0], a["groups"],
            [True, False, False])
    with torch._C.DisableTorchFunction():
        grad = torch.ops.aten.convolution_backward(g, x, w, None, *rest)[0]
    k = (w.shape[0] // max(a["groups"], 1)) * w.shape[2] * w.shape[3]
    gamma = k * _U32 / (1 - k * _U32)
    norm = _norm(w) * _norm(g) * math.sqrt(w.shape[2] * w.shape[3])
    if not (math.isfinite(norm) and _all_finite(grad)) or gamma >= 0.5:
        return None
    slack = (gamma / (1 - gamma) * norm + 2 * k * _TINY32 * math.sqrt(grad.numel())) * (1 + 1e-6)
    return grad, slack


def sample_autocast(fwd: Record, load: Load,
                    recorded: list[Optional[torch.dtype]], candidates: list[Optional[torch.dtype]]
                    ) -> Optional[tuple[Optional[torch.dtype]]]:
    """(the first of `candidates`, a CPU autocast dtype or None for none, under which a conv2d
    forward gives the recorded output dtypes,) found on the batch's first sample (dtypes do not
    depend on the batch size), or None: another op, or no candidate reproduces them."""
    if fwd["op"] not in _CONV2D or len(recorded) != 1:
        return None
    a = _conv2d_arguments(rebuild_call(fwd, load, None))
    if a is None:
        return None
    x = a["input"][:1]
    for dtype in candidates:
        try:
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                out = torch.conv2d(x, a["weight"], a["bias"], a["stride"], a["padding"],
                                   a["dilation"], a["groups"])
        except RuntimeError:
            continue
        if [out.dtype] == recorded:
            return (dtype,)
    return None
