"""The CSV a ptdbg_ascend / msprobe user already reads: one row per compared tensor.

Columns: [Step, Rank when several pairs were compared,] NPU Name, Bench Name, NPU Dtype, Bench
Dtype, NPU Tensor Shape, Bench Tensor Shape, the metrics (tensor dumps: `result.METRICS`;
statistics-only dumps: msprobe's Max/Min/Mean/L2norm diff and their relative errors; both sets when
a compare mixes them), NPU max/min/mean/l2norm, Bench max/min/mean/l2norm, Accuracy Reached or Not,
Result, Err_message, NPU_Stack_Info. "NPU" is the target, "Bench" the golden. Metrics that do not
apply read "N/A".
"""
from __future__ import annotations

import csv
import math
import os
from pathlib import Path

from ..comparison.metrics import STAT_METRICS
from ..comparison.result import METRICS

STAT_COLUMNS = [("max", "max"), ("min", "min"), ("mean", "mean"), ("norm", "l2norm")]


def metric_columns(rows) -> list[str]:
    modes = {getattr(r, "mode", "tensor") for r in rows if r.metrics}
    if modes == {"statistics"}:
        return list(STAT_METRICS)
    if "statistics" in modes:
        return list(METRICS) + [m for m in STAT_METRICS if m not in METRICS]
    return list(METRICS)


def fmt_value(v) -> str:
    if v is None:
        return "N/A"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    return str(v)


def stack_text(stack) -> str:
    return "; ".join(f"File {loc.file}, line {loc.line}, in {loc.function}, {loc.code.strip()}"
                     for loc in stack)


def write_csv(result, path) -> Path:
    """Write the CSV for result at path (written whole to a temp file, then renamed)."""
    path = Path(path)
    rows = result.rows
    multi = any(r.step is not None or r.rank is not None for r in rows)
    metrics = metric_columns(rows)
    header = (["Step", "Rank"] if multi else []) + [
        "NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape",
        "Bench Tensor Shape"] + metrics + [f"NPU {label}" for _, label in STAT_COLUMNS] + [
        f"Bench {label}" for _, label in STAT_COLUMNS] + [
        "Accuracy Reached or Not", "Result", "Err_message", "NPU_Stack_Info"]
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        for r in rows:
            line = ([fmt_value(r.step), fmt_value(r.rank)] if multi else []) + [
                r.target_name or "N/A", r.golden_name or "N/A",
                r.target_dtype or "N/A", r.golden_dtype or "N/A",
                fmt_value(list(r.target_shape)) if r.target_shape is not None else "N/A",
                fmt_value(list(r.golden_shape)) if r.golden_shape is not None else "N/A"]
            line += [fmt_value(r.metrics.get(m)) for m in metrics]
            line += [fmt_value(r.target_stats.get(k)) for k, _ in STAT_COLUMNS]
            line += [fmt_value(r.golden_stats.get(k)) for k, _ in STAT_COLUMNS]
            line += [r.accuracy_reached or "N/A", r.result, r.reason, stack_text(r.stack)]
            w.writerow(line)
    os.replace(tmp, path)
    return path
