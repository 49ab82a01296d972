"""The CSV a ptdbg_ascend / msprobe user already reads: one row per compared tensor.

Its columns, and how each cell is written, are the table in `opdiff.report.columns`.
Importing this module does not import torch (a report can be written far from a GPU).

    from opdiff.report.csv_report import write_csv
    write_csv(result, "out/compare_result_20250101120000.csv")

Every CSV opdiff writes goes through `safe_writer`: a text cell a spreadsheet would run as a
formula (one that starts with =, +, -, @, a tab or a carriage return: an op or module name from
a hostile dump, say) is written with a leading apostrophe, so it is shown as text; its control
characters (ESC, BEL, every C0 but newline and tab, DEL, C1, the bidirectional overrides) are
written as visible escapes such as `\\x1b` (`opdiff.terminal.safe`), so `cat` or `less` on the
CSV cannot drive the terminal. A number stays a number ("-0.5", "-inf", "1e-05"), for the
scripts that parse these columns.
"""
from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import IO, Any, Iterable

from ..terminal import safe
from .columns import csv_columns
from .outputs import atomic_open

_FORMULA = frozenset("=+-@\t\r")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|inf|nan|NaN|"
                     r"Infinity)")


def safe_cell(value: Any) -> Any:
    """`value` as a CSV cell that a spreadsheet shows and does not run, and a terminal shows
    and does not obey: control characters as escapes (`\\x1b`), then a text starting with
    = + - @ tab or CR (and that is not a number) gets a leading apostrophe."""
    if not isinstance(value, str) or not value:
        return value
    value = safe(value)
    if value[0] in _FORMULA and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


class _SafeWriter:
    def __init__(self, f: IO[str]):
        self._w = csv.writer(f)

    def writerow(self, row: Iterable[Any]) -> Any:
        return self._w.writerow([safe_cell(c) for c in row])

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


def safe_writer(f: IO[str]) -> _SafeWriter:
    """A csv.writer on `f` whose every cell goes through `safe_cell`."""
    return _SafeWriter(f)


def write_csv(result, path) -> Path:
    """Write the CSV for `result` at `path` (whole, through a temporary file); return the path."""
    path = Path(path)
    columns = csv_columns(result.rows)
    cells = [(c.value, c.write) for c in columns]      # Column.cell, one call less per cell
    with atomic_open(path, "the CSV", newline="") as f:
        w = safe_writer(f)
        w.writerow([c.header for c in columns])
        w.writerows([write(value(r)) for value, write in cells] for r in result.rows)
    return path


__all__ = ["write_csv", "safe_writer", "safe_cell"]
