"""Build opdiff descriptors (store/records.py) from what foreign tools wrote about a tensor.

msprobe, ptdbg_ascend and torch_npu.hooks each describe a tensor differently; they all end up
here as `tensor_descriptor(dtype, shape, max=, min=, mean=, norm=, ...)` so that every adapter
emits the same statistics, with the same encoding of non-finite floats, as opdiff's capture.
"""
from __future__ import annotations

import math
from typing import Any

from ...dtypes import FLOAT_NAMES, is_exact, short_dtype
from ..records import encode_float, scalar_descriptor

# ptdbg_ascend writes the string "Nan" for "not computed" (e.g. the norm of an int tensor); it is
# not a measured NaN, so it becomes "unknown".
_NOT_COMPUTED = {"Nan", "N/A", "None", ""}
_NONFINITE_TEXT = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "infinity": math.inf,
                   "-infinity": -math.inf}


def stat_value(value: Any) -> float | int | str | None:
    """One statistic as the store keeps it: a number, "NaN"/"Infinity"/"-Infinity", or None."""
    kind = type(value)
    if kind is float:                     # the common case first: this runs per statistic
        return value if math.isfinite(value) else encode_float(value)
    if value is None:
        return None
    if kind is int:
        return int(value)
    if kind is bool:
        return float(value)
    if isinstance(value, (int, float)):   # numpy scalars and other number types
        return encode_float(float(value))
    if isinstance(value, str):
        if value in _NOT_COMPUTED:
            return None
        if value.lower() in _NONFINITE_TEXT:
            return encode_float(_NONFINITE_TEXT[value.lower()])
        try:
            return encode_float(float(value))
        except ValueError:
            return None
    return None


def _finite(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def tensor_descriptor(dtype: Any, shape: Any, *, max: Any = None, min: Any = None, mean: Any = None,
                      norm: Any = None,
                      nan: int | None = None, inf: int | None = None, requires_grad: Any = None,
                      key: str | None = None) -> dict[str, Any]:
    """An opdiff tensor descriptor.

    nan/inf counts are rarely written by foreign tools. When they are not given they are
    inferred only where that is certain: integer and bool tensors hold no NaN/inf, and a float
    tensor whose max and min are finite holds none either (torch's max/min propagate NaN and
    inf). Otherwise they stay None (unknown). A non-finite mean or norm beside a finite max and
    min is the tool's own overflow and becomes None too.
    """
    dt = short_dtype(dtype)
    mx, mn = stat_value(max), stat_value(min)
    stats: dict[str, Any] = {"max": mx, "min": mn, "mean": stat_value(mean),
                             "norm": stat_value(norm), "nan": nan, "inf": inf}
    if nan is None and inf is None:
        if dt is not None and dt not in FLOAT_NAMES and is_exact(dt):   # float names: no lookup
            stats["nan"] = stats["inf"] = 0
        elif _finite(mx) and _finite(mn):
            stats["nan"] = stats["inf"] = 0
    if _finite(mx) and _finite(mn):
        # Finite values cannot have a non-finite mean: the tool's own sum overflowed (msprobe
        # reduces in the tensor's dtype: a float32 mask of finfo.min has mean -inf). Such a
        # statistic is unknown, not an inf to compare.
        for stat in ("mean", "norm"):
            if isinstance(stats[stat], str):
                stats[stat] = None
    known = not (mx is None and mn is None and stats["mean"] is None and stats["norm"] is None
                 and stats["nan"] is None)
    desc: dict[str, Any] = {"type": "tensor", "dtype": dt, "shape": list(shape) if shape is not None else None,
                            "stats": stats if known else None}
    if requires_grad is not None:
        desc["requires_grad"] = bool(requires_grad)
    if key is not None:
        desc["key"] = key
    return desc


def value_descriptor(value: Any) -> dict[str, Any]:
    """A plain Python value (from a foreign dump) as a descriptor."""
    scalar = scalar_descriptor(value, max_len=1 << 16)
    return scalar if scalar is not None else {"type": "object", "value": repr(value)[:120]}


def place(container: list[dict[str, Any]], path: list[str], leaf: dict[str, Any]) -> None:
    """Put `leaf` at a nested position given by `path` (list indices), filling gaps with none.

    Legacy dumps name tensors by position only (`input.3.0`), and skip arguments they did not
    dump (None, non-tensors); the gaps become {"type": "none"} so positions stay right.
    """
    if not path[0].isdigit():  # a named part (a dict's key): keep it as a dict entry
        container.append({"type": "dict", "items": {path[0]: leaf}})
        return
    index = int(path[0])
    while len(container) <= index:
        container.append({"type": "none"})
    if len(path) == 1:
        container[index] = leaf
        return
    node = container[index]
    if node.get("type") not in ("list", "tuple"):
        node = {"type": "tuple", "items": []}
        container[index] = node
    place(node["items"], path[1:], leaf)
