"""Low-precision formats as facts (torch-free): what a float8/float4 value can hold and how far
one rounding into it may move a value.

    from opdiff.lowp.formats import format_of
    e4m3 = format_of("torch.float8_e4m3fn")
    e4m3.largest, e4m3.mantissa_bits        # 448.0, 3
    e4m3.half_step(3.25)                    # 0.125: |x - q| <= this when x rounds to q = 3.25
    e4m3.half_step(0.0)                     # 2**-10: values below half the smallest subnormal

A value x scaled by s and rounded to q in a format (q = round(x * s), saturating at `largest`)
is within `half_step(q) / s` of x unless it was clipped: that is the whole expected error of a
quantize op, element by element, from its format and its scale (`opdiff.lowp.judge`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Format:
    """One low-precision format: torch's name, mantissa bits, largest finite value, smallest
    normal and smallest subnormal magnitude; `packed`: two values per byte (not judged element
    by element); `scale_only`: a power-of-two scale format (MX block scales), never data."""
    name: str
    mantissa_bits: int
    largest: float
    smallest_normal: float
    smallest_subnormal: float
    packed: bool = False
    scale_only: bool = False

    @property
    def unit_roundoff(self) -> float:
        """Largest relative error of one rounding of a normal value: 2^-(m+1)."""
        return 2.0 ** -(self.mantissa_bits + 1)

    def half_step(self, q: float) -> float:
        """Half the spacing of the format's values at a representable value `q`: how far a
        value rounded to q can have been from it (subnormals and zero: half the smallest
        subnormal). Where q is a power of two the spacing below is half as wide: this is the
        wider of the two, an upper bound."""
        a = abs(q)
        if not math.isfinite(a):
            return math.inf
        if a < self.smallest_normal:
            return self.smallest_subnormal / 2
        return 2.0 ** (math.floor(math.log2(a)) - self.mantissa_bits) / 2

    @property
    def dynamic_range(self) -> float:
        """log2 of largest / smallest subnormal: the binades one scale can cover."""
        return math.log2(self.largest / self.smallest_subnormal)


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("float8_e4m3fn", 3, 448.0, 2.0 ** -6, 2.0 ** -9),
    Format("float8_e4m3fnuz", 3, 240.0, 2.0 ** -7, 2.0 ** -10),
    Format("float8_e5m2", 2, 57344.0, 2.0 ** -14, 2.0 ** -16),
    Format("float8_e5m2fnuz", 2, 57344.0, 2.0 ** -15, 2.0 ** -17),
    Format("float8_e8m0fnu", 0, 2.0 ** 127, 2.0 ** -127, 2.0 ** -127, scale_only=True),
    Format("float4_e2m1fn_x2", 1, 6.0, 1.0, 0.5, packed=True),
)}
# What users write for a format (`--format e4m3`).
ALIASES = {"e4m3": "float8_e4m3fn", "e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2",
           "e4m3fnuz": "float8_e4m3fnuz", "e5m2fnuz": "float8_e5m2fnuz", "e8m0": "float8_e8m0fnu",
           "fp4": "float4_e2m1fn_x2", "e2m1": "float4_e2m1fn_x2"}


# One rounding's largest relative error in the dtypes a value is scaled in before its cast.
UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11,
                 "bfloat16": 2.0 ** -8}


def unit_roundoff(dtype: Any) -> float:
    """Unit roundoff of a high-precision dtype name (float32's for one not known)."""
    name = str(dtype or "float32").replace("torch.", "")
    return UNIT_ROUNDOFF.get(name, UNIT_ROUNDOFF["float32"])


def format_of(dtype: Any) -> Optional[Format]:
    """The format of a dtype name ('torch.float8_e4m3fn', 'float8_e5m2', 'e4m3'); None for a
    dtype that is not a low-precision format (bfloat16, float32, int8...)."""
    if dtype is None:
        return None
    name = str(dtype).lower().replace("torch.", "")
    return FORMATS.get(ALIASES.get(name, name))


def is_low_precision(dtype: Any) -> bool:
    """A dtype of a low-precision data format (float8, float4; not the e8m0 scale format)."""
    found = format_of(dtype)
    return found is not None and not found.scale_only


__all__ = ["Format", "FORMATS", "ALIASES", "UNIT_ROUNDOFF", "format_of", "unit_roundoff",
           "is_low_precision"]
