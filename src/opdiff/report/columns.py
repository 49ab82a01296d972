"""The CSV's columns, one table: each column's header, how its value comes from a TensorRow, and
how that value is written. The CSV writer only walks this table; adding a column is one entry.

The columns are the ones a ptdbg_ascend / msprobe user reads, in their order (users' scripts
index them: keep the order): [Step, Rank when several step/rank pairs were compared,] NPU Name,
Bench Name, NPU Dtype, Bench Dtype, NPU Tensor Shape, Bench Tensor Shape, the metrics, NPU
max/min/mean/l2norm, Bench max/min/mean/l2norm, Accuracy Reached or Not, Result, Err_message,
NPU_Stack_Info. "NPU" is the target, "Bench" the golden.

The metric columns depend on what was compared, and their names come from the comparison's
metric table (`opdiff.comparison.metric_table`): tensor dumps get `METRICS`, statistics-only
dumps msprobe's Max/Min/Mean/L2norm diff and their relative errors (`STAT_METRICS`), a compare
that mixes them both sets. Cells keep full precision (`repr` of a float reads back to the same
number); what does not apply reads "N/A".

    from opdiff.report.columns import csv_columns
    cols = csv_columns(result.rows)
    [c.header for c in cols]       # ["NPU Name", "Bench Name", ...]
    [c.cell(row) for c in cols]    # one CSV line
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Callable

from ..comparison.metric_table import METRICS, STAT_METRICS
from ..store import statistics


def number(v: Any) -> str:
    """A CSV cell in full precision: None -> "N/A", NaN -> "NaN", inf -> "inf"/"-inf"."""
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


def text(v: Any) -> str:
    """A text cell: empty or missing -> "N/A"."""
    return str(v) if v else "N/A"


def shape(v: Any) -> str:
    """A shape cell: "[8, 64, 16, 16]"; missing -> "N/A"."""
    return "N/A" if v is None else str(list(v))


def plain(v: Any) -> str:
    """A cell written as it is (an empty reason stays empty)."""
    return str(v)


def stack_text(stack) -> str:
    """The stack in one cell: "File f, line n, in func, code; ..." (innermost user frame first)."""
    return "; ".join(f"File {loc.file}, line {loc.line}, in {loc.function}, {loc.code.strip()}"
                     for loc in stack or ())


@dataclass(frozen=True)
class Column:
    """One CSV column: its header, the value it shows (from a TensorRow), how that is written."""
    header: str
    value: Callable[[Any], Any]
    write: Callable[[Any], str] = number

    def cell(self, row) -> str:
        """This column's cell for `row`."""
        return self.write(self.value(row))


def _stat(side: str, key: str) -> Callable[[Any], Any]:
    stats = attrgetter(f"{side}_stats")
    return lambda row: stats(row).get(key)


def _metric(name: str) -> Callable[[Any], Any]:
    return lambda row: row.metrics.get(name)


STEP_RANK = (Column("Step", attrgetter("step")), Column("Rank", attrgetter("rank")))
TENSOR = (
    Column("NPU Name", attrgetter("target_name"), text),
    Column("Bench Name", attrgetter("golden_name"), text),
    Column("NPU Dtype", attrgetter("target_dtype"), text),
    Column("Bench Dtype", attrgetter("golden_dtype"), text),
    Column("NPU Tensor Shape", attrgetter("target_shape"), shape),
    Column("Bench Tensor Shape", attrgetter("golden_shape"), shape),
)
# (statistic key in TensorRow.*_stats, its label in the header): the statistics table's columns
STATS = statistics.COLUMNS
STATISTICS = tuple(Column(f"NPU {label}", _stat("target", key)) for key, label in STATS) + tuple(
    Column(f"Bench {label}", _stat("golden", key)) for key, label in STATS)
VERDICT = (
    Column("Accuracy Reached or Not", attrgetter("accuracy_reached"), text),
    Column("Result", attrgetter("result"), plain),
    Column("Err_message", attrgetter("reason"), plain),
    Column("NPU_Stack_Info", lambda row: stack_text(row.stack), plain),
)

# Only when the two runs executed different ops somewhere (comparison/regions.py).
REGION = (Column("Region", attrgetter("region"), text),)


def metric_names(rows) -> list[str]:
    """The metric columns for these rows, in CSV order (see the module docstring)."""
    modes = {r.mode for r in rows if r.metrics}
    if "statistics" not in modes:
        return list(METRICS)
    if modes == {"statistics"}:
        return list(STAT_METRICS)
    return list(METRICS) + [m for m in STAT_METRICS if m not in METRICS]


def csv_columns(rows) -> list[Column]:
    """Every column of the CSV for these rows, in order."""
    multi = any(r.step is not None or r.rank is not None for r in rows)
    metrics = tuple(Column(m, _metric(m)) for m in metric_names(rows))
    regions = REGION if any(getattr(r, "region", None) for r in rows) else ()
    return list((STEP_RANK if multi else ()) + TENSOR + metrics + STATISTICS + VERDICT + regions)


__all__ = ["Column", "csv_columns", "metric_names", "number", "text", "shape", "plain",
           "stack_text", "STEP_RANK", "TENSOR", "STATS", "STATISTICS", "VERDICT"]
