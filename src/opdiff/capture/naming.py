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

import torch
import torch.nn.functional as F

# Calls that read metadata or manage autograd: never numerics, and most of the traffic.
_SKIP = {
    "__get__", "__set__", "__delete__", "size", "dim", "ndimension", "numel", "nelement", "stride",
    "storage_offset", "is_contiguous", "is_floating_point", "is_complex", "is_signed", "data_ptr",
    "element_size", "untyped_storage", "storage", "_typed_storage", "get_device", "__len__",
    "__iter__", "__format__", "__repr__", "__str__", "__bool__", "__hash__", "__index__", "__int__",
    "__float__", "__complex__", "__reduce_ex__", "__deepcopy__", "__setstate__", "__getstate__",
    "__contains__", "__array__", "__dlpack__", "__dlpack_device__", "register_hook",
    "register_post_accumulate_grad_hook", "retain_grad", "requires_grad_", "backward", "item",
    "tolist", "numpy", "type", "is_set_to", "has_names", "is_shared", "is_pinned", "__dir__",
    "_is_view", "_version", "is_tensor", "is_storage", "is_grad_enabled", "is_inference",
    "is_inference_mode_enabled", "is_autocast_enabled", "get_default_dtype", "__instancecheck__",
    "__subclasscheck__", "__torch_function__", "__torch_dispatch__", "_has_compatible_shallow_copy_type",
    "is_nonzero", "equal", "__reversed__", "result_type", "can_cast", "promote_types", "_C",
    "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state", "grad", "_make_subclass",
    "as_subclass", "share_memory_", "pin_memory", "record_stream", "__getattribute__", "dim_order",
    "device", "Size", "dtype", "finfo", "iinfo", "Generator", "get_autocast_dtype", "get_device_module",
    "is_autocast_available", "get_autocast_gpu_dtype", "get_autocast_cpu_dtype", "set_grad_enabled",
}
# Process-group bookkeeping, not collectives.
_DIST_SKIP = {"get_rank", "get_world_size", "is_initialized", "is_available", "new_group",
              "get_backend", "barrier", "monitored_barrier", "get_process_group_ranks", "get_group_rank",
              "get_global_rank", "destroy_process_group", "init_process_group"}
_RNN = {"lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"}

# BINARY_OP argument -> operator dunder (3.11+: dis._nb_ops lists them in argument order).
_NB_DUNDER = {
    "+": "add", "&": "and", "//": "floordiv", "<<": "lshift", "@": "matmul", "*": "mul", "%": "mod",
    "|": "or", "**": "pow", ">>": "rshift", "-": "sub", "/": "truediv", "^": "xor",
}
_BINARY_OP = dis.opmap.get("BINARY_OP")
if _BINARY_OP is not None:
    _BINARY_OP_NAMES = []
    for _, sym in dis._nb_ops:  # e.g. ("NB_INPLACE_ADD", "+=")
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

# Frames that only forward a torch-function call (Tensor's Python-level operator wrappers).
_PLUMBING = (os.path.join(os.path.dirname(torch.__file__), "_tensor.py"),
             os.path.join(os.path.dirname(torch.__file__), "overrides.py"),
             os.path.join(os.path.dirname(torch.__file__), "_tensor_docs.py"))

_OPDIFF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_DEMO_DIR = os.path.join(_OPDIFF_DIR, "demo") + os.sep   # the demo's models are "user" code

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
    if not name or name in _SKIP:
        return None
    if name.startswith("_") and not (name.startswith("__") and name.endswith("__")) \
            and not name.startswith(("_foreach", "_amp_foreach", "_amp_update")):
        return None
    qual = getattr(func, "__qualname__", "") or ""
    if qual.startswith(("TensorBase.", "Tensor.", "_TensorBase.")):
        return f"Tensor.{name}"
    if name in _RNN:
        return f"VF.{name}"
    module = getattr(func, "__module__", "") or ""
    if module.startswith("torch.distributed"):
        return f"Distributed.{name}" if name not in _DIST_SKIP else None
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
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_filename in _PLUMBING
                             or (f.f_code.co_filename.startswith(_OPDIFF_DIR)
                                 and not f.f_code.co_filename.startswith(_DEMO_DIR))):
        f = f.f_back
    if f is None or f.f_lasti < 0:
        return name
    code = f.f_code.co_code
    op = code[f.f_lasti]
    dunder = None
    if op == _BINARY_OP:
        arg = code[f.f_lasti + 1]
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


def is_mutating(op: str, kwargs: dict) -> bool:
    """Whether an API call may write into a tensor it was given (in-place, out=, collectives)."""
    method = op.rsplit(".", 1)[-1]
    return (method.endswith("_") and not method.endswith("__")) or method.startswith("__i") \
        or method == "__setitem__" or op.startswith("Distributed.") \
        or kwargs.get("out") is not None or kwargs.get("inplace") is True


# In-place ops whose result does not depend on what their first argument held: random and
# constant fills, and copy_. That argument is often fresh, uninitialised memory (dropout's mask
# is `empty_like(x).bernoulli_(p)`; `.to()` copies into an empty tensor at L2): its values
# before the op are noise that would differ between any two runs.
_OVERWRITES = frozenset({"bernoulli_", "uniform_", "normal_", "random_", "exponential_",
                         "geometric_", "cauchy_", "log_normal_", "fill_", "zero_", "copy_"})


def overwrites_first(op: str) -> bool:
    """Whether `op` (an API name or an aten packet name) overwrites its first argument entirely."""
    return op.rsplit(".", 1)[-1] in _OVERWRITES


_UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})


def makes_uninitialized(op: str) -> bool:
    """Whether `op` returns uninitialised memory (`torch.empty` and its kin)."""
    return op.rsplit(".", 1)[-1] in _UNINITIALIZED
