"""Quantize ops found in one run's records (torch-free): where a high-precision tensor is scaled
and cast to a low-precision format, with the tensor it came from and its scale.

    units = quantize_units(records)         # [QuantizeUnit], in record order
    units[0].record, units[0].source, units[0].scale   # the cast, its hp input, scale operand

A quantize op is the record that casts a non-low-precision tensor to a float8/float4 dtype
(`Tensor.to`, `aten._to_copy`, ...). Walking its data input back through casts, clamps and
reshapes, the first multiply or divide is where the scale was applied: its other operand (a
tensor of any broadcastable shape: per tensor, per row, per block; or a number) is the scale,
its data operand the high-precision value. No multiply or divide: the scale is 1. Emulated
FP8 (a cast and back), torchao's float8 casts and a cast before `torch._scaled_mm` all take
this shape; the GEMMs that read a quantized tensor are found the same way (`gemm_inputs`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from .formats import format_of, is_low_precision, unit_roundoff

Record = Mapping[str, Any]
# what an op does, from its name: 'Tensor.__mul__' -> 'mul', 'aten._to_copy.default' -> 'to_copy'
_PASS = {"to", "to_copy", "float", "type", "type_as", "clamp", "clip", "contiguous", "reshape",
         "view", "bfloat16", "half", "clone", "clamp_min", "clamp_max"}
_SCALE = {"mul", "div", "truediv"}
_GEMMS = {"linear", "mm", "matmul", "addmm", "bmm", "scaled_mm"}
_STEPS = 8          # how far back a scale is looked for


def verb(op: Any) -> str:
    """The op's last name part without underscores ('Tensor.__mul__' -> 'mul'; for aten ops the
    overload is dropped: 'aten.mul.Tensor' -> 'mul')."""
    parts = str(op or "").split(".")
    if parts[0] == "aten" and len(parts) > 1:
        return parts[1].strip("_")
    return parts[-1].strip("_")


def _tensors(descs: Any) -> list[Mapping[str, Any]]:
    return [d for d in descs or [] if isinstance(d, Mapping) and d.get("type") == "tensor"]


def _numel(desc: Mapping[str, Any]) -> int:
    n = 1
    for size in desc.get("shape") or []:
        n *= int(size) if isinstance(size, int) else 1
    return n


@dataclass(frozen=True)
class QuantizeUnit:
    """One quantize op: the cast record, its format, the hp value it quantized (`source`, a
    tensor descriptor), the scale it was multiplied by (`scale`: a tensor descriptor, a number,
    or None for 1; `inverse`: the value was divided by it), the low-precision output
    (`output`), the module it ran in, and the coarsest dtype the scaled value passed through
    before the cast (`scaled_dtype`: a product x * s in bf16 cast to float32 before the cast
    was rounded in bf16; that rounding is allowed for)."""
    record: str
    format: str
    source: Mapping[str, Any]
    output: Mapping[str, Any]
    scale: Any = None
    inverse: bool = False
    module: Optional[str] = None
    seq: int = -1
    scaled_dtype: Optional[str] = None      # the dtype x * s was rounded to before the cast


class Dataflow:
    """Records by their `seq`, and who produced a descriptor."""

    def __init__(self, records: Sequence[Record]):
        self.records = list(records)
        # (not `comparison.graph.RunGraph`'s: a record without a seq is keyed by its position)
        self.by_seq = {r.get("seq", i): r for i, r in enumerate(self.records)}

    def producer(self, desc: Mapping[str, Any]) -> Optional[Record]:
        made = desc.get("producer")
        if isinstance(made, list) and made:
            return self.by_seq.get(made[0])
        return None


def _data_input(record: Record) -> Optional[Mapping[str, Any]]:
    """The input a value flows through: the largest tensor input (first among equals)."""
    tensors = _tensors(record.get("inputs"))
    return max(tensors, key=_numel) if tensors else None


def _op_record(record: Record) -> bool:
    return record.get("kind") in ("api", "aten")


def _unit(record: Record, flow: Dataflow) -> Optional[QuantizeUnit]:
    outs = _tensors(record.get("outputs"))
    data = _data_input(record)
    if not outs or data is None or verb(record.get("op")) not in _PASS:
        return None
    fmt = format_of(outs[0].get("dtype"))
    if fmt is None or not is_low_precision(fmt.name) or is_low_precision(data.get("dtype")):
        return None
    current: Optional[Record] = record
    rounded: list[Any] = []         # the dtypes x * s passed through on its way to the cast
    for _ in range(_STEPS):
        if current is None:
            break
        if current is not record and verb(current.get("op")) in _SCALE:
            value = _data_input(current)
            others = [d for d in current.get("inputs") or [] if d is not value]
            scale = others[0] if others else None
            if value is not None:
                return QuantizeUnit(record["name"], fmt.name, value, outs[0], scale,
                                    verb(current.get("op")) != "mul", record.get("module"),
                                    record.get("seq", -1), max(rounded, key=unit_roundoff))
        if current is not record and verb(current.get("op")) not in _PASS:
            break
        data_in = _data_input(current)
        rounded.append(data_in.get("dtype") if data_in is not None else None)
        current = flow.producer(data_in) if data_in is not None else None
    return QuantizeUnit(record["name"], fmt.name, data, outs[0], None, False,
                        record.get("module"), record.get("seq", -1), data.get("dtype"))


def quantize_units(records: Iterable[Record]) -> list[QuantizeUnit]:
    """Every quantize op of one run's forward-order records (see the module doc)."""
    flow = Dataflow(list(records))
    found = []
    for record in flow.records:
        if _op_record(record):
            unit = _unit(record, flow)
            if unit is not None:
                found.append(unit)
    return found


def gemms(records: Iterable[Record]) -> list[Record]:
    """The GEMM op records (linear, mm, matmul, addmm, bmm, _scaled_mm) of a run."""
    return [r for r in records if _op_record(r) and verb(r.get("op")) in _GEMMS]


def gemm_inputs(gemm: Record, units: Sequence[QuantizeUnit], flow: Dataflow
                ) -> list[Optional[QuantizeUnit]]:
    """For each tensor input of a GEMM, the quantize op whose output it is, dequantized
    (through casts, clamps and a multiply or divide by a scale), or None."""
    by_record = {u.record: u for u in units}
    found: list[Optional[QuantizeUnit]] = []
    for desc in _tensors(gemm.get("inputs")):
        unit = None
        current = flow.producer(desc)
        for _ in range(_STEPS):
            if current is None:
                break
            if current.get("name") in by_record:
                unit = by_record[current["name"]]
                break
            if verb(current.get("op")) not in _PASS | _SCALE:
                break
            data_in = _data_input(current)
            current = flow.producer(data_in) if data_in is not None else None
        found.append(unit)
    return found


__all__ = ["QuantizeUnit", "Dataflow", "quantize_units", "gemms", "gemm_inputs", "verb"]
