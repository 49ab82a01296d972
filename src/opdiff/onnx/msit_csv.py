"""The per-tensor CSV in msit's layout (`result_{timestamp}.csv`), so Ascend users read it at sight.

msit's columns come first, in its order (the two `DataType` columns included: the first is the
target's, the second the golden's); opdiff adds tensor names, the matching rule, the PyTorch
module and source line at the end. The metric columns carry msit's names and the shared
metrics' values (`MSIT_METRICS` maps one to the other): one definition of every number, whether
it is read here, in report.html or in a dump compare.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

# msit's metric column -> the shared metric (`opdiff.comparison.metric_table`) it shows.
MSIT_METRICS = (("CosineSimilarity", "Cosine"), ("RelativeEuclideanDistance", "RelEuclideanDistance"),
                ("KullbackLeiblerDivergence", "KLD"), ("RootMeanSquareError", "RMSE"),
                ("MeanRelativeError", "MeanRelativeErr"), ("MaxAbsoluteError", "MaxAbsErr"),
                ("MeanAbsoluteError", "MeanAbsErr"))
MSIT_COLUMNS = tuple(msit for msit, _ in MSIT_METRICS)

HEADER = ("Index", "OpType", "NPUDump", "DataType", "GroundTruth", "DataType", "TensorIndex", "Shape",
          *MSIT_COLUMNS, "CompareFailReason", "IsOutputNode", "IsPrecisionError",
          "TargetTensor", "GoldenTensor", "MatchRule", "Module", "Location")


def msit_values(metrics: dict) -> dict:
    """The shared metrics of one tensor pair (a Measurement's `metrics` and `extra` together:
    MeanAbsErr is not a column of the dump compare) under msit's column names, None where absent."""
    return {msit: metrics.get(shared) for msit, shared in MSIT_METRICS}


@dataclass
class MsitRow:
    """One compared tensor pair as msit lists it."""
    op_type: str
    target_node: str
    target_dtype: str
    golden_node: str
    golden_dtype: str
    tensor_index: str
    shape: str
    metrics: dict = field(default_factory=dict)    # shared names: Measurement.metrics and .extra
    fail_reason: str = ""
    is_output: bool = False
    is_error: Optional[bool] = None       # None: not compared (unmatched)
    target_tensor: str = ""
    golden_tensor: str = ""
    rule: str = ""
    module: str = ""
    location: str = ""


def _cell(v) -> str:
    if v is None:
        return "NaN"
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else f"{v:.6g}"
    return str(v)


def write_msit_csv(path: Path, rows: list) -> Path:
    """Write rows (MsitRow) to path; returns path."""
    from ..report.csv_report import safe_writer
    from ..report.outputs import atomic_open

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "the msit CSV", newline="") as f:
        w = safe_writer(f)           # node names from the models: no formulas
        w.writerow(HEADER)
        for i, r in enumerate(rows):
            flag = "" if r.is_error is None else ("YES" if r.is_error else "NO")
            values = msit_values(r.metrics)
            w.writerow([i, r.op_type, r.target_node, r.target_dtype, r.golden_node, r.golden_dtype,
                        r.tensor_index, r.shape, *(_cell(values[k]) for k in MSIT_COLUMNS),
                        r.fail_reason, "YES" if r.is_output else "NO", flag, r.target_tensor,
                        r.golden_tensor, r.rule, r.module, r.location])
    return path
