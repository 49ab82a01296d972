"""msprobe-style names for what TorchFunctionMode reports.

`api_name(func)` maps a function to `Functional.conv2d`, `Torch.relu`, `Tensor.add`, `VF.lstm`
(or None: not worth recording). `operator_name(...)` recovers the operator the user wrote:
TorchFunctionMode reports `x += y` as `Tensor.add_`, but the instruction executing in the
calling frame (BINARY_OP with its in-place add argument) says it was `Tensor.__iadd__`.
"""
from __future__ import annotations

import dis
import os
import sys
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .. import ops
from ..store.frames import is_internal
from .callsite import is_call_frame

if TYPE_CHECKING:
    from types import FrameType

_RNN = {"lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"}

# BINARY_OP argument -> operator dunder (3.11+: dis._nb_ops lists them in argument order).
_NB_DUNDER = {
    "+": "add", "&": "and", "//": "floordiv", "<<": "lshift", "@": "matmul", "*": "mul", "%": "mod",
    "|": "or", "**": "pow", ">>": "rshift", "-": "sub", "/": "truediv", "^": "xor",
}
_BINARY_OP = dis.opmap.get("BINARY_OP")
if _BINARY_OP is not None:
    _BINARY_OP_NAMES = []
    for _, sym in dis._nb_ops:  # type: ignore[attr-defined]  # private, not in typeshed; e.g. ("NB_INPLACE_ADD", "+=")
        inplace = sym.endswith("=") and sym not in ("==",)
        base = _NB_DUNDER.get(sym.rstrip("=") if inplace else sym)
        _BINARY_OP_NAMES.append(f"__{'i' if inplace else ''}{base}__" if base else None)
else:
    _BINARY_OP_NAMES = []
# Python <= 3.10 and unary operators have one opcode each.
_OPCODE_DUNDER = {
    "UNARY_NEGATIVE": "__neg__", "UNARY_POSITIVE": "__pos__", "UNARY_INVERT": "__invert__",
    "COMPARE_OP": None,  # resolved from the func name below
}
for _sym, _base in _NB_DUNDER.items():
    _opname = {"add": "ADD", "and": "AND", "floordiv": "FLOOR_DIVIDE", "lshift": "LSHIFT",
               "matmul": "MATRIX_MULTIPLY", "mul": "MULTIPLY", "mod": "MODULO", "or": "OR",
               "pow": "POWER", "rshift": "RSHIFT", "sub": "SUBTRACT", "truediv": "TRUE_DIVIDE",
               "xor": "XOR"}[_base]
    _OPCODE_DUNDER[f"BINARY_{_opname}"] = f"__{_base}__"
    _OPCODE_DUNDER[f"INPLACE_{_opname}"] = f"__i{_base}__"
_COMPARE = {"eq": "__eq__", "ne": "__ne__", "lt": "__lt__", "le": "__le__", "gt": "__gt__",
            "ge": "__ge__"}

# Frames that only forward a torch-function call: Tensor's Python-level operator wrappers,
# and opdiff's own interception (code registered as user code, the demo's models, excepted).
# Torch's other code is not skipped: an operator written in nn.TransformerEncoderLayer is the
# operator that frame executed, as msprobe names it.
_PLUMBING = frozenset(os.path.join(os.path.dirname(torch.__file__), name)
                      for name in ("_tensor.py", "overrides.py", "_tensor_docs.py"))
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_forwards: dict = {}      # file name -> whether its frames only forward the call


def _forwards_only(filename: str) -> bool:
    known = _forwards.get(filename)
    if known is None:
        known = _forwards[filename] = filename in _PLUMBING or (
            filename.startswith(_OWN_DIR) and is_internal(filename))
    return known


_cache: dict = {}


def api_name(func) -> str | None:
    """`Prefix.name` for a function seen by TorchFunctionMode, or None if it should not be recorded."""
    try:
        return _cache[func]
    except (KeyError, TypeError):
        pass
    name = _resolve(func)
    try:
        _cache[func] = name
    except TypeError:
        pass
    return name


def _resolve(func) -> str | None:
    name = getattr(func, "__name__", None)
    if not name or name in ops.SKIPPED_FUNCTIONS:
        return None
    # (an aten overload a compiled graph calls, `_unsafe_view`, is an op like any: without it
    # the graph's dataflow has holes, comparison/compiled_modules.py)
    if name.startswith("_") and not (name.startswith("__") and name.endswith("__")) \
            and not name.startswith(("_foreach", "_amp_foreach", "_amp_update")) \
            and not (isinstance(func, torch._ops.OpOverload) and func.namespace == "aten"):
        return None
    qual = getattr(func, "__qualname__", "") or ""
    if qual.startswith(("TensorBase.", "Tensor.", "_TensorBase.")):
        return f"Tensor.{name}"
    if name in _RNN:
        return f"VF.{name}"
    module = getattr(func, "__module__", "") or ""
    if module.startswith("torch.distributed") or module == "torch._ops._c10d_functional":
        return f"Distributed.{name}" if name not in ops.SKIPPED_DISTRIBUTED else None
    if getattr(F, name, None) is func:
        return f"Functional.{name}"
    if getattr(torch, name, None) is func or getattr(torch._VF, name, None) is func:
        return f"Torch.{name}"
    if module.startswith("torch.linalg") or module == "torch._C._linalg":
        return f"Torch.linalg.{name}"
    if module.startswith("torch.fft") or module == "torch._C._fft":
        return f"Torch.fft.{name}"
    if module.startswith("torch.special") or module == "torch._C._special":
        return f"Torch.special.{name}"
    if module.startswith("torch.nn.functional") or module == "torch._C._nn":
        return f"Functional.{name}"
    if module.startswith("torch"):
        return f"Torch.{name}"
    return f"Torch.{name}" if module == "" else None


def operator_name(name: str) -> str:
    """Replace `Tensor.add_` by `Tensor.__iadd__` etc. when the caller executed an operator."""
    if not name.startswith("Tensor.") or name.startswith("Tensor.__"):
        return name
    f: FrameType | None = sys._getframe(1)
    forwards = _forwards
    while f is not None:
        code = f.f_code
        known = forwards.get(code.co_filename)
        if known is None:
            known = _forwards_only(code.co_filename)
        if not known and not is_call_frame(code):
            break
        f = f.f_back
    if f is None or f.f_lasti < 0:
        return name
    # what the instruction at (code, offset) makes of `name` never changes: worked out once
    code, lasti = f.f_code, f.f_lasti
    key = (name, id(code), lasti)
    known = _renamed.get(key)
    if known is None or known[0] is not code:
        if len(_renamed) >= _MAX_RENAMED:      # generated code must not grow this forever
            _renamed.clear()
        known = _renamed[key] = (code, _operator_at(name, code.co_code, lasti))
    return known[1]


_MAX_RENAMED = 1 << 14
_renamed: dict = {}    # (name, id(code), instruction offset) -> (that code, the operator's name)


def _operator_at(name: str, bytecode: bytes, lasti: int) -> str:
    """`name` (a `Tensor.` method) as the operator the instruction at `lasti` executed."""
    op = bytecode[lasti]
    dunder = None
    if op == _BINARY_OP:
        arg = bytecode[lasti + 1]
        if arg < len(_BINARY_OP_NAMES):
            dunder = _BINARY_OP_NAMES[arg]
    else:
        opname = dis.opname[op]
        if opname == "COMPARE_OP":
            dunder = _COMPARE.get(name[len("Tensor."):])
        else:
            dunder = _OPCODE_DUNDER.get(opname)
    if dunder is None:
        return name
    method = name[len("Tensor."):]
    # Only rename when the reported method implements that operator (x.add_(y) stays add_).
    plain = dunder.strip("_")
    base = plain[1:] if plain.startswith("i") and plain[1:] in _NB_DUNDER.values() else plain
    aliases = {"truediv": ("div", "true_divide"), "floordiv": ("floor_divide",), "mod": ("remainder", "fmod"),
               "and": ("bitwise_and", "logical_and"), "or": ("bitwise_or", "logical_or"),
               "xor": ("bitwise_xor", "logical_xor"), "lshift": ("bitwise_left_shift",),
               "rshift": ("bitwise_right_shift",), "neg": ("neg", "negative"), "invert": ("bitwise_not",),
               "pos": ("positive",)}
    candidates = {base, base + "_", *aliases.get(base, ()), *(a + "_" for a in aliases.get(base, ()))}
    stripped = method.strip("_")
    if method in candidates or stripped in candidates or stripped == plain:
        return f"Tensor.{dunder}"
    return name
