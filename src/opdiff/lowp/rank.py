"""Which GEMMs lose the most to a low-precision format: each GEMM's output error from
quantizing its inputs, ranked (where to keep high precision).

    ranked = rank_gemms(dump)               # [GemmLoss], largest error first
    ranked[0].record, ranked[0].module, ranked[0].error

Two sources, the same measure (relative L2 error of the GEMM's output, float64):
- measured: a run whose GEMMs read quantized tensors (FP8 emulation, torchao, `_scaled_mm`):
  the GEMM run on its inputs as quantized against the same GEMM on the high-precision values
  they were quantized from (`units.gemm_inputs`);
- what-if: a high-precision run (bf16, fp32): each GEMM's inputs quantized to `fmt` with one
  amax scale per tensor (`granularity="tensor"`) or per row (`"row"`), the GEMM run on them
  against the same GEMM on the recorded inputs.
Both need the dump's tensors (`task="tensor"`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional, Sequence

import torch

from .formats import Format, format_of
from .judge import Loader
from .units import Dataflow, QuantizeUnit, gemm_inputs, gemms, quantize_units, verb

GRANULARITIES = ("tensor", "row")


@dataclass(frozen=True)
class GemmLoss:
    """One GEMM: its record, module, how its error was found (measured, what-if), the
    formats of its quantized inputs and the relative error they add to its output."""
    record: str
    module: Optional[str]
    how: str
    formats: tuple[str, ...]
    error: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def quantize(x: torch.Tensor, fmt: Format, granularity: str = "tensor") -> torch.Tensor:
    """x rounded through `fmt` with an amax scale (per tensor or per row), dequantized,
    float64: the what-if of casting this input."""
    x = x.to(torch.float64)
    if granularity == "row" and x.dim() >= 1:
        amax = x.abs().amax(dim=-1, keepdim=True)
    else:
        amax = x.abs().amax()
    scale = fmt.largest / amax.clamp(min=1e-30)
    target = getattr(torch, fmt.name)
    q = (x * scale).clamp(-fmt.largest, fmt.largest).to(torch.float32).to(target)
    return q.to(torch.float64) / scale


def _run(gemm: Mapping[str, Any], args: list[torch.Tensor]) -> Optional[torch.Tensor]:
    """The GEMM on float64 tensors (None: a form not run here)."""
    name = verb(gemm.get("op"))
    if name == "linear":
        return torch.nn.functional.linear(*args[:3])
    if name in ("mm", "matmul", "bmm"):
        return torch.matmul(args[0], args[1])
    if name == "addmm":
        return torch.addmm(*args[:3])
    return None


def _error(a: torch.Tensor, b: torch.Tensor) -> float:
    ref = float(b.norm())
    return float((a - b).norm()) / ref if ref > 0 else (0.0 if float(a.norm()) == 0 else math.inf)


def _tensor_inputs(gemm: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [d for d in gemm.get("inputs") or [] if isinstance(d, Mapping) and d.get("type") == "tensor"]


def _loaded(descs: Sequence[Mapping[str, Any]], load: Loader) -> Optional[list[torch.Tensor]]:
    out = []
    for d in descs:
        t = load(str(d.get("key")))
        if not isinstance(t, torch.Tensor):
            return None
        out.append(t.detach().to(torch.float64))
    return out


def rank_gemms(records: Sequence[Mapping[str, Any]], load: Loader, fmt: str = "float8_e4m3fn",
               granularity: str = "tensor") -> list[GemmLoss]:
    """Every forward GEMM of a run with the error low precision adds to its output, largest
    first (see the module doc). The run's own quantize ops are measured where it has them;
    a run without any is what-if replayed in `fmt`."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity is one of {', '.join(GRANULARITIES)}")
    what_if = format_of(fmt)
    if what_if is None or what_if.packed or what_if.scale_only:
        raise ValueError(f"{fmt}: not a float8 format opdiff can replay")
    records = [r for r in records if r.get("phase", "forward") == "forward"]
    units = quantize_units(records)
    flow = Dataflow(records)
    found: list[GemmLoss] = []
    for gemm in gemms(records):
        descs = _tensor_inputs(gemm)
        values = _loaded(descs, load)
        if values is None:
            continue
        fed: list[Optional[QuantizeUnit]] = gemm_inputs(gemm, units, flow)
        if any(u is not None for u in fed):
            sources = _loaded([u.source if u is not None else d for u, d in zip(fed, descs)], load)
            if sources is None:
                continue
            try:
                sources = [s.reshape(v.shape) for s, v in zip(sources, values)]
                out, ref = _run(gemm, values), _run(gemm, sources)
            except RuntimeError:
                continue
            how, formats = "measured", tuple(u.format for u in fed if u is not None)
        elif not units:
            quantized = [quantize(v, what_if, granularity) if i < 2 else v
                         for i, v in enumerate(values)]
            out, ref = _run(gemm, quantized), _run(gemm, values)
            how, formats = f"what-if {what_if.name} per {granularity}", (what_if.name,) * 2
        else:
            continue        # a GEMM the FP8 run left in high precision
        if out is None or ref is None:
            continue
        found.append(GemmLoss(gemm["name"], gemm.get("module"), how, formats, _error(out, ref)))
    return sorted(found, key=lambda g: -g.error)


__all__ = ["GemmLoss", "rank_gemms", "quantize", "GRANULARITIES"]
