"""Dtype names and facts, one table for every stage (no torch import: reports and readers use it).

Dumps spell a dtype many ways ("torch.bfloat16", "bf16", "BF16", "half", "Float32"); every stage
asks here instead of keeping its own list.

    from opdiff.dtypes import canonical_dtype, coarser, largest_finite
    canonical_dtype("torch.bfloat16")   # "bfloat16"
    coarser("float32", "bf16")          # "bfloat16"
    largest_finite("float16")           # 65504.0
"""
from __future__ import annotations

from typing import Any, Optional

# Aliases users and foreign dumps write -> the canonical float name.
_ALIASES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "half": "float16", "float16": "float16",
    "fp32": "float32", "float": "float32", "float32": "float32", "tf32": "float32",
    "fp64": "float64", "double": "float64", "float64": "float64",
}
# Precision rank: lower = coarser. Unknown float-ish names rank like float32.
PRECISION_RANK = {"float8": 0, "bfloat16": 1, "float16": 2, "float32": 3, "float64": 4}

# Largest finite value of each floating dtype (exact names, as torch spells them).
LARGEST_FINITE = {
    "float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
    "float64": 1.7976931348623157e308, "float8_e4m3fn": 448.0, "float8_e4m3fnuz": 240.0,
    "float8_e5m2": 57344.0, "float8_e5m2fnuz": 57344.0,
}
FP16_MAX = LARGEST_FINITE["float16"]

# Exact names of the floating dtypes, as torch spells them (complex included: it holds floats).
FLOAT_NAMES = frozenset({"float64", "float32", "float16", "bfloat16", "double", "float", "half",
                         "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                         "complex64", "complex128", "complex32"})

# Unit roundoff u = 2^-p of each precision class (p: significand bits): the largest relative
# error of one rounding to nearest (float8: e4m3's).
UNIT_ROUNDOFF = {"float8": 2.0 ** -4, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11,
                 "float32": 2.0 ** -24, "float64": 2.0 ** -53}

# safetensors' dtype codes for the dtypes opdiff streams itself.
SAFETENSORS_CODES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "uint16": "U16", "uint32": "U32",
    "uint64": "U64", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}


def short_dtype(dtype: Any) -> Optional[str]:
    """"torch.float32" -> "float32" (the exact name, unaliased); None stays None."""
    if dtype is None:
        return None
    text = dtype if type(dtype) is str else str(dtype)
    return text[6:] if text.startswith("torch.") else text


def canonical_dtype(dtype: Any) -> Optional[str]:
    """The precision class: 'torch.bfloat16', 'bf16', 'BF16' -> 'bfloat16'; every float8 ->
    'float8'; integers and bool -> 'int'; unknown names -> 'float32'; None stays None."""
    if dtype is None:
        return None
    name = str(dtype).lower().replace("torch.", "").replace("numpy.", "")
    if name in _ALIASES:
        return _ALIASES[name]
    if name.startswith("float8"):
        return "float8"
    if name.startswith(("int", "uint", "bool", "long", "short")):
        return "int"
    if name.startswith("complex"):
        return "float64" if "128" in name else "float32"
    return "float32"


def is_float(dtype: Any) -> bool:
    """A dtype whose values can be rounded (and hold inf/NaN): every float and complex dtype."""
    return canonical_dtype(dtype) not in (None, "int")


def is_exact(dtype: Any) -> bool:
    """Integer and bool dtypes: compared bit for bit, never hold inf/NaN."""
    return canonical_dtype(dtype) == "int"


def coarser(a: Any, b: Any) -> str:
    """The coarser of two dtypes ('int' only when both are integer)."""
    floats = [c for c in (canonical_dtype(a), canonical_dtype(b)) if c not in (None, "int")]
    if not floats:
        return "int"
    return min(floats, key=lambda c: PRECISION_RANK.get(c, 3))


def largest_finite(dtype: Any) -> Optional[float]:
    """The largest finite value of a floating dtype, None when unknown or not floating."""
    return LARGEST_FINITE.get(short_dtype(dtype) or "")


def unit_roundoff(dtype: Any) -> float:
    """The unit roundoff of a dtype's precision class (0 for integers: they do not round)."""
    return UNIT_ROUNDOFF.get(canonical_dtype(dtype) or "float32", 0.0)


__all__ = ["canonical_dtype", "short_dtype", "is_float", "is_exact", "coarser", "largest_finite",
           "unit_roundoff", "UNIT_ROUNDOFF",
           "PRECISION_RANK", "LARGEST_FINITE", "FP16_MAX", "FLOAT_NAMES", "SAFETENSORS_CODES"]
