"""Rebuild one recorded op call from a dump: the function from its name, the arguments from the
descriptors and saved tensors.

    from opdiff.comparison.replay.calls import rebuild_call
    call = rebuild_call(record, dump.tensor, cast=torch.float64)
    out = call.run()

Names follow the capture's scheme: `Functional.X` is `torch.nn.functional.X`, `Torch.X` is
`torch.X` (also `Torch.linalg.X`, `Torch.fft.X`, `Torch.special.X`), `Tensor.X` is the Tensor
method or operator (`Tensor.__iadd__`), `VF.X` is `torch._VF.X` and `Aten.X` is
`torch.ops.aten.X`. A custom op replays through the CPU reference registered for it
(`opdiff.ops.register(name, cpu_reference=...)`). What the op registry says must not be re-run
(collectives, uninitialised memory: `opdiff.ops.OpTraits.replay_refusal`) and anything that cannot
be rebuilt faithfully raises `NotReplayable` with the reason; nothing is guessed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ... import ops
from . import guards, sizes
from ...store.limits import TensorTooLarge
from ...store.records import decode_float
from ...store.schema import Descriptor, Record

# reads a saved tensor by its key (`DumpSource.tensor`; a replayed chain's own values first)
Load = Callable[[str], torch.Tensor]


class NotReplayable(Exception):
    """The op cannot be rebuilt from the dump; the message says why (shown to the user)."""


_NAMESPACES: dict[str, Callable[[], Any]] = {
    "Torch.linalg.": lambda: torch.linalg,
    "Torch.fft.": lambda: torch.fft,
    "Torch.special.": lambda: torch.special,
    "Functional.": lambda: torch.nn.functional,
    "VF.": lambda: torch._VF,
    "Tensor.": lambda: torch.Tensor,
}
_SLICE = re.compile(r"^slice\((-?\d+|None), (-?\d+|None), (-?\d+|None)\)$")
_DEVICE = re.compile(r"^(cpu|cuda|xpu|mps|npu|hpu|privateuseone)(:\d{1,3})?$")
_MEMORY_FORMATS = ("preserve_format", "contiguous_format", "channels_last", "channels_last_3d")
_LAYOUTS = ("strided",)     # a compiled graph's factory calls name it (zeros(..., layout=))


def resolve(op: str) -> Callable[..., Any]:
    """The torch function an op name stands for (or its registered CPU reference). Raises
    NotReplayable when there is none, or when the op registry says it must not be re-run."""
    traits = ops.traits(op)
    refusal = ops.replay_refusal(op)    # a dump is untrusted: only pure tensor computations
    if refusal:
        raise NotReplayable(refusal)
    if traits.cpu_reference is not None:
        return traits.cpu_reference
    func: Any = None
    if op.startswith("Aten."):
        func = getattr(torch.ops.aten, op[len("Aten."):], None)
    else:
        for prefix, namespace in _NAMESPACES.items():
            if op.startswith(prefix):
                name = op[len(prefix):]
                func = getattr(namespace(), name, None) if "." not in name else None
                break
        else:
            if op.startswith("Torch."):
                name = op[len("Torch."):]
                modules: tuple[Any, ...] = (torch, torch._VF, torch._C._nn,
                                            torch._C._VariableFunctions)
                for module in modules:
                    func = getattr(module, name, None) if "." not in name else None
                    if func is not None:
                        break
    if not callable(func):
        raise NotReplayable(f"no torch function named {op} in this torch")
    if not _a_torch_op(func):
        raise NotReplayable(f"untrusted: {op[:80]} names {type(func).__name__} "
                            f"{getattr(func, '__module__', None)}.{getattr(func, '__name__', '?')}, "
                            f"not a tensor op")
    found: Callable[..., Any] = func
    return found


# Python functions replay may call: the tensor ops written in Python (an allowed method name
# found elsewhere, `torch.cond` (a control-flow op that calls what it is given) or a module's
# own `__eq__`, is not one).
_PYTHON_OPS = ("torch.nn.functional", "torch.functional", "torch._tensor", "torch._linalg_utils")


def _a_torch_op(func: Any) -> bool:
    """A C++ tensor op (a torch builtin, a Tensor method, an aten packet) or a tensor op that
    torch writes in Python (`_PYTHON_OPS`)."""
    if isinstance(func, torch._ops.OpOverloadPacket):
        return True
    kind = type(func).__name__
    if kind in ("builtin_function_or_method", "method_descriptor", "wrapper_descriptor"):
        return True
    return kind == "function" and getattr(func, "__module__", "") in _PYTHON_OPS


@dataclass
class Call:
    """A rebuilt call: `func(*args, **kwargs)`; `tensors` lists every argument tensor in the
    order the capture indexes them (args, then kwargs, nested lists flattened), with its key."""
    func: Callable[..., Any]
    args: list[Any]
    kwargs: dict[str, Any]
    tensors: list[tuple[str, torch.Tensor]] = field(default_factory=list)   # in capture order

    def run(self) -> Any:
        """Call the op."""
        return self.func(*self.args, **self.kwargs)

    def check_size(self, op: str) -> None:
        """Refuse (NotReplayable) a call that must not reach its kernel, before anything is
        allocated: arguments that a kernel which trusts them would take out of bounds (an index
        past its table, a view past its storage: `guards.argument_refusal`), or a result over
        `--max-tensor-mb` in float64 (its size on the meta device, or from its tensors' values:
        `sizes.result_refusal`; a `zeros([10**6, 10**6])`, a `pad` by 2**40)."""
        refused = guards.argument_refusal(op, self.args, self.kwargs) or \
            sizes.result_refusal(op, self.func, self.args, self.kwargs)
        if refused:
            raise NotReplayable(f"untrusted: {refused}" if not refused.startswith("tensor ")
                                else refused)


broadcast = sizes.broadcast      # (where it was first: the size check broadcasts shapes itself)


class _Builder:
    def __init__(self, load: Load, cast: Optional[torch.dtype], name: str,
                 wrap: Optional[Callable[[str, torch.Tensor], torch.Tensor]] = None,
                 device: str = "cpu", op: str = ""):
        self.load, self.cast, self.name, self.wrap, self.op = load, cast, name, wrap, op
        self.device = torch.device(device)
        self.tensors: list[tuple[str, torch.Tensor]] = []
        self._by_key: dict[str, torch.Tensor] = {}

    def value(self, desc: Any, where: str) -> Any:
        if desc is None:
            return None
        kind = desc.get("type")
        if kind == "tensor":
            return self.tensor(desc, where)
        if kind in ("int", "bool"):
            value = desc.get("value")
            if not isinstance(value, (int, bool, type(None))):
                raise NotReplayable(f"{where}: a {kind} argument recorded as {str(value)[:40]!r}")
            return value
        if kind == "str":
            return self.text(desc.get("value"), where)
        if kind == "float":
            return float(decode_float(desc.get("value")))
        if kind == "none":
            return None
        if kind == "dtype":
            dtype = getattr(torch, str(desc.get("value", "")).replace("torch.", ""), None)
            if not isinstance(dtype, torch.dtype):
                raise NotReplayable(f"{where}: unknown dtype {desc.get('value')!r}")
            return dtype
        if kind == "device":
            return self.device      # where the replay runs, whatever the target ran on
        if kind == "size":
            return torch.Size(desc.get("value") or [])
        if kind in ("list", "tuple"):
            items = [self.value(d, f"{where}.{i}") for i, d in enumerate(desc.get("items", []))]
            return items if kind == "list" else tuple(items)
        if kind == "dict":
            return {k: self.value(d, f"{where}.{k}") for k, d in desc.get("items", {}).items()}
        if kind == "object":
            return _literal(str(desc.get("value", "")), where)
        raise NotReplayable(f"{where}: argument of unknown kind {kind!r}")

    def text(self, value: Any, where: str) -> Any:
        """A string argument: only the enums replay knows (`ops.replay_string`) and device names
        (which become the replay's device); a dump is untrusted, any other string (a path, a
        file name) refuses the op."""
        if isinstance(value, str) and ops.replay_string(self.op, value):
            return value
        if isinstance(value, str) and _DEVICE.match(value):
            return self.device
        raise NotReplayable(f"untrusted: {where} is a string argument replay does not pass on "
                            f"({str(value)[:40]!r}: only known enums such as reduction='mean')")

    def tensor(self, desc: Descriptor, where: str) -> torch.Tensor:
        key: str = desc.get("key") or ""
        if key in self._by_key:     # the same tensor passed twice stays one tensor (aliasing)
            shared = self._by_key[key]
            self.tensors.append((key, shared))
            return shared
        try:
            t: Optional[torch.Tensor] = self.load(key) if key else None
        except TensorTooLarge as exc:
            raise NotReplayable(str(exc)) from None
        if not isinstance(t, torch.Tensor) and t is not None:
            raise NotReplayable(f"tensor {where} did not load as a tensor")
        if t is None:
            raise NotReplayable(f"tensor {where} was not saved (dump with task='tensor')")
        # Always a private copy: the reader may hand out shared memory, and the call may write.
        if self.cast is not None and t.is_floating_point():
            t = t.to(self.cast, copy=True)
        elif self.cast is not None and t.is_complex() and self.cast == torch.float64:
            t = t.to(torch.complex128, copy=True)
        else:
            t = t.clone()
        if self.wrap is not None:
            t = self.wrap(key, t)
        self._by_key[key] = t
        self.tensors.append((key, t))
        return t


def _literal(text: str, where: str) -> Any:
    """The few argument objects that a repr describes exactly: slices, Ellipsis, memory formats
    and the strided layout."""
    if text == "Ellipsis":
        return Ellipsis
    if text.startswith("torch.") and text[len("torch."):] in _MEMORY_FORMATS + _LAYOUTS:
        return getattr(torch, text[len("torch."):])
    m = _SLICE.match(text)
    if m:
        return slice(*(None if g == "None" else int(g) for g in m.groups()))
    raise NotReplayable(f"{where}: argument recorded only as {text[:60]!r}")


def rebuild_call(record: Record, load: Load,
                 cast: Optional[torch.dtype] = None,
                 wrap: Optional[Callable[[str, torch.Tensor], torch.Tensor]] = None,
                 device: str = "cpu") -> Call:
    """Rebuild a record's call.

    load: key -> saved tensor (e.g. `dump.tensor`). cast: a float dtype to cast floating tensors
    to (integer and bool tensors keep theirs), or None to keep the recorded dtypes.
    wrap: optional (key, tensor) -> tensor applied once per distinct tensor (e.g. to make it a
    leaf that requires grad); tensors with the same key stay the same object.
    device: what a recorded `device=` argument becomes (the device the call is re-run on;
    `load` must hand out tensors there).
    """
    if record.get("error"):
        raise NotReplayable(f"capture failed partly for this op ({str(record['error'])[:80]})")
    op = str(record["op"])
    func = resolve(op)
    given = record["kwargs"]
    if not isinstance(given, dict):
        raise NotReplayable("its keyword arguments are not a mapping")
    out = given.get("out")
    if isinstance(out, dict) and out.get("overwritten") and out.get("type") == "tensor":
        # written without being read (Inductor's `mm(a, b, out=buf)`): the call without it
        # makes the same values in a tensor of replay's own
        given = {k: d for k, d in given.items() if k != "out"}
    elif isinstance(out, dict) and out.get("type") not in (None, "none"):
        raise NotReplayable("untrusted: it writes into an out= tensor")
    b = _Builder(load, cast, record["name"], wrap, device, op)
    args = [b.value(d, f"input.{i}") for i, d in enumerate(record["inputs"])]
    kwargs = {str(k): b.value(d, f"input.{k}") for k, d in given.items()}
    call = Call(func=func, args=args, kwargs=kwargs, tensors=b.tensors)
    call.check_size(op)
    return call


def flat_tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """Every tensor in a (nested) result, in the order the capture describes them; None stays
    a placeholder only at the top level (the capture keeps positions of None outputs)."""
    out: list[torch.Tensor] = []
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)) and depth < 4:
        for v in value:
            out += flat_tensors(v, depth + 1)
    elif isinstance(value, dict) and depth < 4:
        for v in value.values():
            out += flat_tensors(v, depth + 1)
    return out


def flat_descriptors(descs: Any) -> list[dict[str, Any]]:
    """Tensor descriptors of a record's outputs (or inputs), nested lists flattened, in order."""
    out: list[dict[str, Any]] = []

    def walk(d: Any, depth: int) -> None:
        if not isinstance(d, dict):
            return
        kind = d.get("type")
        if kind == "tensor":
            out.append(d)
        elif kind in ("list", "tuple") and depth < 4:
            for item in d.get("items", []):
                walk(item, depth + 1)
        elif kind == "dict" and depth < 4:
            for item in d.get("items", {}).values():
                walk(item, depth + 1)

    for d in descs or []:
        walk(d, 1)
    return out


def read_once(load: Load) -> Load:
    """`load` that reads each key once and then hands out the same tensor (a caller that
    writes makes its own copy first, as `rebuild_call` does)."""
    seen: dict[str, torch.Tensor] = {}

    def cached(key: str) -> torch.Tensor:
        if key not in seen:
            seen[key] = load(key)
        return seen[key]
    return cached


def dtype_signature(record: Record, recorded: list[Optional[torch.dtype]]) -> str:
    """The op and the dtypes of its argument tensors and of its outputs, as one string (the
    replay keeps which CPU autocast reproduces a call under it)."""
    args = flat_descriptors(list(record["inputs"]) +
                            list(record["kwargs"].values()))
    return (f"{record['op']}({','.join(str(d.get('dtype')) for d in args)})->"
            f"{','.join(str(d) for d in recorded)}")
