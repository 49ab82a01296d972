"""Where a compare's rows lie, and one row as a plain dict (what `opdiff query` prints)."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from ..errors import DumpError

ROWS = "rows.jsonl"


def rows_path(output: str) -> Path:
    """The rows.jsonl of a compare's output directory, summary.json or rows.jsonl itself."""
    path = Path(output)
    if path.is_dir():
        summary = path / "summary.json"
        path = path / ROWS
        if not path.is_file() and summary.is_file():
            path = _listed(summary)
    elif path.name != ROWS and path.is_file():
        path = _listed(path)
    if not path.is_file():
        raise DumpError(f"{output}: no {ROWS} there; give the -o directory of an opdiff compare "
                        "(its rows.jsonl is what query reads)")
    return path


def _listed(summary: Path) -> Path:
    try:
        data = json.loads(summary.read_text(encoding="utf-8"))
        rows = data["files"]["rows"]
    except (OSError, ValueError, KeyError, TypeError):
        raise DumpError(f"{summary}: not a summary.json of opdiff compare that lists its rows") from None
    return summary.parent / os.path.basename(str(rows))


def row_dict(row: Any, fields: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """`row` (a TensorRow) as {field: value}: every field, or `fields` in that order; `name` is
    the target's tensor name (golden's where the target has none); a stack is a list of
    {"file", "line", "code", "function"}."""
    names = fields or [f.name for f in dataclasses.fields(row)]
    out: dict[str, Any] = {}
    for name in names:
        if name == "name":
            out[name] = row.target_name or row.golden_name
        elif name == "stack":
            out[name] = [dataclasses.asdict(loc) for loc in row.stack or ()]
        else:
            v = getattr(row, name)
            out[name] = list(v) if isinstance(v, tuple) else v
    return out


__all__ = ["rows_path", "row_dict", "ROWS"]
