"""A quantize op judged by its own format and scale, from its saved tensors.

    verdict = judge_unit(unit, dump.tensor)     # UnitVerdict
    verdict.outside         # elements further from their hp value than one rounding explains
    verdict.within          # True: everything this op did is what its format and scale explain

For a value x scaled by s and rounded to q, |q / s - x| <= half_step(q) / s (`formats.Format`):
every element is checked against that bound (with the product x * s rounded once more in
the dtype it was computed in, twice its unit roundoff allowed), in float64. What breaks it: a
clipped element (|x * s| beyond the format's largest: a scale too large, an amax taken on a
local piece of the tensor), an element that became inf or NaN, a scale applied to another
tensor than the one cast. What the format explains is never
blamed: underflow to zero, rounding, a scale smaller than it could be.

The statistics a low-precision tensor is judged by come with it: share of non-zero elements
that became zero (underflow), share at the format's largest magnitude (saturation), the
scale's min/max, MSE and SQNR of q / s against x.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Optional

import torch

from .formats import Format, format_of, is_low_precision, unit_roundoff
from .units import QuantizeUnit

Loader = Callable[[str], Any]


@dataclass(frozen=True)
class UnitVerdict:
    """What one quantize op did, measured against its format and scale."""
    record: str
    module: Optional[str]
    format: str
    numel: int
    outside: int                # elements beyond one rounding at their scale
    clipped: int                # of them, those whose |x * s| passed the format's largest
    nonfinite: int              # elements that became inf or NaN from finite values
    underflow: float            # share of non-zero elements that became zero
    saturated: float            # share of elements at the format's largest magnitude
    scale_min: Optional[float]
    scale_max: Optional[float]
    mse: float                  # mean of (q / s - x)^2
    sqnr_db: float              # 10 log10(sum x^2 / sum (q / s - x)^2); inf when exact
    error: float                # relative L2 error |q / s - x| / |x|
    bound: float                # relative L2 size of the per-element bound: what the format allows
    judged: bool = True         # False: tensors missing (a statistics dump) or a packed format
    why: str = ""
    dequantized: str = ""       # a GEMM that reads it dequantized by another scale (words)

    @property
    def within(self) -> bool:
        return self.judged and self.outside == 0 and not self.dequantized

    def words(self) -> str:
        """One line for people."""
        where = f"{self.record}" + (f" in {self.module}" if self.module else "")
        if not self.judged:
            return f"{where}: not judged ({self.why})"
        head = (f"{where}: {self.format}, scale {_num(self.scale_min)}"
                + (f"..{_num(self.scale_max)}" if self.scale_max != self.scale_min else "")
                + f", underflow {self.underflow:.1%}, saturated {self.saturated:.2%}, "
                  f"SQNR {self.sqnr_db:.1f} dB")
        if self.within:
            return head + " (within its format and scale)"
        if not self.outside:
            return head + f": {self.dequantized}"
        what = [self.dequantized] if self.dequantized else []
        if self.clipped:
            what.append(f"{self.clipped} clipped at +-{format_of(self.format).largest:g} "  # type: ignore[union-attr]
                        f"(scale too large for these values)")
        if self.nonfinite:
            what.append(f"{self.nonfinite} became inf/NaN")
        rest = self.outside - self.clipped - self.nonfinite
        if rest > 0:
            what.append(f"{rest} off by more than one rounding (scale applied to another value)")
        return (head + f": {self.outside} of {self.numel} elements outside what its format and "
                f"scale explain: " + "; ".join(what))

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["within"] = self.within
        return out


def _num(v: Optional[float]) -> str:
    return "?" if v is None else f"{v:.4g}"


def _scale(unit: QuantizeUnit, load: Loader) -> Optional[torch.Tensor]:
    """The multiplier the value was scaled by, float64 (1 / divisor for a divide)."""
    s = unit.scale
    if s is None:
        value = torch.tensor(1.0, dtype=torch.float64)
    elif isinstance(s, Mapping) and s.get("type") == "tensor":
        t = load(str(s.get("key")))
        if not isinstance(t, torch.Tensor):
            return None
        value = t.detach().to(torch.float64)
    elif isinstance(s, Mapping) and isinstance(s.get("value"), (int, float)):
        value = torch.tensor(float(s["value"]), dtype=torch.float64)
    else:
        return None
    return 1.0 / value if unit.inverse else value


def half_steps(q: torch.Tensor, fmt: Format) -> torch.Tensor:
    """`Format.half_step` of every element of q (float64)."""
    a = q.abs()
    exponent = torch.floor(torch.log2(a.clamp(min=fmt.smallest_normal)))
    steps = torch.pow(2.0, exponent - fmt.mantissa_bits) / 2
    return torch.where(a < fmt.smallest_normal, torch.full_like(a, fmt.smallest_subnormal / 2),
                       steps)


def measure(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, fmt: Format,
            product: float = 2.0 ** -24) -> dict[str, Any]:
    """The element-wise check and statistics of q = round(x * s) in `fmt` (all float64);
    `product`: the unit roundoff of the dtype x * s was computed in."""
    x, q = x.to(torch.float64), q.to(torch.float64)
    scaled = x * s
    finite = torch.isfinite(x)
    bad_value = finite & ~torch.isfinite(q)
    allowed = half_steps(torch.where(torch.isfinite(q), q, torch.zeros_like(q)), fmt) \
        + scaled.abs() * (2 * product)
    off = (q - scaled).abs() > allowed
    off = (off & finite) | bad_value
    clipped = off & (scaled.abs() > fmt.largest) & ~bad_value
    deq = torch.where(torch.isfinite(q), q, torch.zeros_like(q)) / s
    err = torch.where(finite, deq - x, torch.zeros_like(x))
    xf = torch.where(finite, x, torch.zeros_like(x))
    signal, noise = float((xf * xf).sum()), float((err * err).sum())
    bound = float(((allowed / s.abs()) ** 2).sum())
    nonzero = int(((xf != 0)).sum())
    underflow = int(((xf != 0) & (q == 0)).sum())
    n = x.numel()
    return {
        "numel": n, "outside": int(off.sum()), "clipped": int(clipped.sum()),
        "nonfinite": int(bad_value.sum()),
        "underflow": underflow / nonzero if nonzero else 0.0,
        "saturated": float((q.abs() == fmt.largest).sum()) / n if n else 0.0,
        "mse": noise / n if n else 0.0,
        "sqnr_db": 10 * math.log10(signal / noise) if noise > 0 and signal > 0 else math.inf,
        "error": math.sqrt(noise / signal) if signal > 0 else 0.0,
        "bound": math.sqrt(bound / signal) if signal > 0 else 0.0,
    }


def _unjudged(unit: QuantizeUnit, why: str) -> UnitVerdict:
    return UnitVerdict(unit.record, unit.module, unit.format, 0, 0, 0, 0, 0.0, 0.0, None, None,
                       0.0, math.inf, 0.0, 0.0, judged=False, why=why)


def judge_unit(unit: QuantizeUnit, load: Loader) -> UnitVerdict:
    """The verdict of one quantize op from its saved tensors (`load`: a dump's `tensor`)."""
    fmt = format_of(unit.format)
    if fmt is None or fmt.packed:
        return _unjudged(unit, f"{unit.format} packs two values a byte")
    x, q = load(str(unit.source.get("key"))), load(str(unit.output.get("key")))
    s = _scale(unit, load)
    if not isinstance(x, torch.Tensor) or not isinstance(q, torch.Tensor) or s is None:
        return _unjudged(unit, "its tensors or scale were not saved (record with task=\"tensor\")")
    q = q.detach().to(torch.float64)
    x = x.detach()
    try:
        s = torch.broadcast_to(s, x.shape) if s.numel() > 1 else s.reshape(())
        if x.shape != q.shape and x.numel() == q.numel():    # (a view between scale and cast)
            x, s = x.reshape(q.shape), (s.reshape(q.shape) if s.dim() else s)
        found = measure(x, q, s, fmt, unit_roundoff(unit.scaled_dtype))
    except RuntimeError as exc:     # shapes that do not line up: not this op's layout
        return _unjudged(unit, f"its value, scale and output do not line up ({exc})"[:200])
    scale = s if unit.scale is not None else None
    return UnitVerdict(unit.record, unit.module, unit.format,
                       scale_min=None if scale is None else float(scale.min()),
                       scale_max=None if scale is None else float(scale.max()), **found)


def dequantized_ratio(unit: QuantizeUnit, read: Mapping[str, Any], load: Loader
                      ) -> Optional[float]:
    """None when a tensor a GEMM reads (`read`, a descriptor) is the quantize op's output
    dequantized by its own scale (q / s, rounded once in float32 and once in the read tensor's
    dtype); else the median ratio read / (q / s) over non-zero elements (0.5: divided by a scale
    twice the quantize op's). None too where the tensors are not saved or do not line up."""
    if is_low_precision(read.get("dtype")):     # the GEMM takes q and its scales (_scaled_mm)
        return None
    q, value, s = load(str(unit.output.get("key"))), load(str(read.get("key"))), _scale(unit, load)
    if not isinstance(q, torch.Tensor) or not isinstance(value, torch.Tensor) or s is None \
            or q.numel() != value.numel():
        return None
    q = q.detach().to(torch.float64)
    try:
        expected = q / (torch.broadcast_to(s, q.shape) if s.numel() > 1 else s.reshape(()))
    except RuntimeError:
        return None
    got = value.detach().to(torch.float64).reshape(q.shape)
    room = 2 * unit_roundoff(str(read.get("dtype"))) + 2.0 ** -22
    finite = torch.isfinite(expected) & torch.isfinite(got)
    off = ((got - expected).abs() > expected.abs() * room) & finite
    if not bool(off.any()):
        return None
    nonzero = finite & (expected != 0)
    return float((got[nonzero] / expected[nonzero]).median()) if bool(nonzero.any()) else math.nan


__all__ = ["UnitVerdict", "judge_unit", "measure", "half_steps", "dequantized_ratio"]
