"""Headroom: would this run overflow in fp16? Answered from output statistics.

Before switching a model from fp32 or bf16 to fp16, users ask which ops produce values beyond
fp16's maximum (65504). An op is flagged when `max|output| * factor >= limit`, where the limit is
fp16's maximum for wider types and the tensor's own maximum for fp16 and fp8 tensors; `factor=1`
flags only values that would actually overflow, `factor=2` also those within 2x of the limit.

A tensor whose largest magnitude is exactly its own dtype's largest finite value holds a mask
written on purpose (`masked_fill(mask, torch.finfo(dtype).min)`, HF attention masks): skipped.
So are the loss scaler's own values (its scale, `scale * loss`; `opdiff.overflow.scaler.ScaledLoss`),
and a gradient's warning under loss scaling gives its unscaled size. Each warning carries its step.

In a run that is in fp16 already (an fp16 tensor came before), a float32 or wider output is
wide on purpose: a norm that upcasts (`x.float().pow(2).mean()`), autocast's fp32 ops. It was
never going to be fp16, so "would overflow in fp16" is no warning for it; fp16 outputs near
their limit still are.
"""
from __future__ import annotations

from ..dtypes import FP16_MAX, largest_finite, short_dtype
from ..store.records import iter_tensors
from ..store.schema import Kind, Record, Role
from .classify import max_abs
from .result import HeadroomWarning


def limit_for(dtype: str) -> tuple[float, str] | None:
    """(maximum, its dtype) an output of this dtype is measured against: fp16's maximum for
    wider floats (bf16, fp32, fp64), its own for fp16 and fp8; None for other dtypes."""
    name = short_dtype(dtype) or ""
    limit = largest_finite(name)
    if limit is None:
        return None
    if limit > FP16_MAX:
        return FP16_MAX, "float16"
    return limit, name


def holds_fp16(record: Record) -> bool:
    """Does the record hold an fp16 tensor (the run computes in fp16)?"""
    return any(short_dtype(str(desc.get("dtype") or "")) == "float16"
               for _, _, desc in iter_tensors(record))


def warnings_for(record: Record, factor: float, location=None, step=None, rank=None,
                 fp16_run: bool = False) -> list:
    """HeadroomWarnings for the output tensors of one record (at most one per record: the largest);
    fp16_run: wider outputs are wide on purpose, not measured against fp16 (module docstring)."""
    worst = None
    for tname, role, desc in iter_tensors(record):
        if role != Role.OUTPUT and record["kind"] != Kind.PARAM_GRAD:
            continue
        limit = limit_for(str(desc.get("dtype") or ""))
        if fp16_run and limit is not None and limit[1] == "float16" and \
                short_dtype(str(desc.get("dtype") or "")) != "float16":
            continue
        m = max_abs(desc)
        if limit is None or m is None or m * factor < limit[0]:
            continue
        if m == largest_finite(short_dtype(str(desc.get("dtype") or "")) or ""):
            continue        # finfo(dtype).min/max: a mask, not a value that grew
        if worst is None or m / limit[0] > worst[0]:
            worst = (m / limit[0], m, desc, limit, tname)
    if worst is None:
        return []
    _, m, desc, (lim, lim_dtype), tname = worst
    dtype = short_dtype(str(desc.get("dtype"))) or ""
    if lim_dtype == "float16" and dtype != "float16":
        what = (f"would overflow in fp16: max |output| {m:.4g} > {lim:g}" if m > lim else
                f"within {factor:g}x of the fp16 maximum: max |output| {m:.4g} (limit {lim:g})")
    else:
        what = f"within {factor:g}x of the {lim_dtype} maximum: max |output| {m:.4g} (limit {lim:g})"
    return [HeadroomWarning(name=record["name"], phase=record["phase"], dtype=dtype,
                            max_abs=m, limit=lim, limit_dtype=lim_dtype,
                            tensor=tname, message=what,
                            location=location, step=step, rank=rank)]
