"""The CSV a ptdbg_ascend / msprobe user already reads: one row per compared tensor.

Its columns, and how each cell is written, are the table in `opdiff.report.columns`.
Importing this module does not import torch (a report can be written far from a GPU).

    from opdiff.report.csv_report import write_csv
    write_csv(result, "out/compare_result_20250101120000.csv")
"""
from __future__ import annotations

import csv
from pathlib import Path

from .columns import csv_columns
from .outputs import atomic_open


def write_csv(result, path) -> Path:
    """Write the CSV for `result` at `path` (whole, through a temporary file); return the path."""
    path = Path(path)
    columns = csv_columns(result.rows)
    cells = [(c.value, c.write) for c in columns]      # Column.cell, one call less per cell
    with atomic_open(path, "the CSV", newline="") as f:
        w = csv.writer(f)
        w.writerow([c.header for c in columns])
        w.writerows([write(value(r)) for value, write in cells] for r in result.rows)
    return path


__all__ = ["write_csv"]
