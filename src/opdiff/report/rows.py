"""rows.jsonl: every TensorRow of a compare, written whole, so a result loads back from disk.

summary.json holds the outcome, not the rows (it stays small enough to read); the CSV holds the
rows in msprobe's columns, which cannot be read back into rows (it lacks the error the verdicts
were judged on, the op, role, phase, kind and module). This file holds each row's every field, so
a compare can be re-judged with new thresholds without recomputing a metric
(`opdiff.report.summary.load_summary`).

Format (JSON Lines, strict JSON)::

    {"format": "opdiff-rows", "version": 1, "fields": ["target_name", ...], "location": ["file", ...]}
    ["Functional.conv2d.0.forward.output.0", ..., {"Cosine": 0.99, ...}, ...]     one line per row

A row is an array of its values in the order of "fields" (the TensorRow field names); a stack is
a list of locations, each `[file, line, code, function]` in the order of "location"; non-finite
floats are the strings "NaN", "Infinity", "-Infinity". Fields a reader does not know are
ignored, fields the file lacks take their defaults.
"""
from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ..comparison.result import TensorRow
from ..errors import DumpError
from ..store.records import SCHEMA_VERSION, decode_float, strict_json
from ..store.schema import Location
from .outputs import atomic_open

FORMAT = "opdiff-rows"
VERSION = 1
LOCATION_FIELDS = tuple(f.name for f in dataclasses.fields(Location))


def write_rows(rows: Iterable, path) -> Path:
    """Write `rows` (TensorRows) to `path` as rows.jsonl; return the path."""
    path = Path(path)
    fields = [f.name for f in dataclasses.fields(TensorRow)]
    stack_at = fields.index("stack")
    head = {"format": FORMAT, "version": VERSION, "schema_version": SCHEMA_VERSION, "fields": fields,
            "location": LOCATION_FIELDS}
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
    with atomic_open(path, "the rows file") as f:
        f.write(dumps(head) + "\n")
        for row in rows:
            values = [getattr(row, name) for name in fields]
            values[stack_at] = [[getattr(loc, k) for k in LOCATION_FIELDS] for loc in row.stack or ()]
            try:
                line = dumps(values)
            except ValueError:      # a NaN or an infinity: spelled out (rare, so not up front)
                line = dumps(strict_json(values))
            f.write(line + "\n")
    return path


def read_rows(path) -> list:
    """The TensorRows in a rows.jsonl file. A DumpError when it is not one."""
    return list(iter_rows(path))


def iter_rows(path) -> Iterator[TensorRow]:
    """The TensorRows of a rows.jsonl file one at a time (a file of millions of rows is read
    in constant memory). A DumpError when it is not one, raised where the reading stops."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            head = json.loads(f.readline() or "null")
            if not isinstance(head, dict) or head.get("format") != FORMAT:
                raise DumpError(f"{path}: not an opdiff rows file")
            if head.get("version", 0) > VERSION:
                raise DumpError(f"{path}: written by a newer opdiff (rows version "
                                f"{head.get('version')}); upgrade opdiff to read it")
            decoders = _decoders(head.get("fields") or [], head.get("location") or LOCATION_FIELDS)
            for line in f:
                if line.strip():
                    values = json.loads(line)
                    yield TensorRow(**{name: decode(v) for (name, decode), v
                                       in zip(decoders, values) if decode is not None})
    except OSError as exc:
        raise DumpError(f"{path}: cannot read the rows of this compare ({exc.strerror})") from exc
    except (ValueError, TypeError) as exc:
        raise DumpError(f"{path}: corrupt rows file ({exc})") from exc


def _decoders(fields: list, location_fields) -> list[tuple[str, Callable[[Any], Any] | None]]:
    """(name, how to turn the stored value back into the field's value) per stored field; None
    for a field TensorRow does not have."""
    hints = typing.get_type_hints(TensorRow)
    known = {f.name for f in dataclasses.fields(TensorRow)}
    keys = list(location_fields)

    def location(v: list) -> Location:
        return Location(**{k: x for k, x in zip(keys, v) if k in LOCATION_FIELDS})

    def decoder(name: str) -> Callable[[Any], Any] | None:
        if name not in known:
            return None
        if name == "stack":
            return lambda v: tuple(location(x) for x in v or ())
        hint = hints.get(name)
        kinds = set(typing.get_args(hint)) | {hint}
        kinds |= {typing.get_origin(k) for k in kinds} - {None}   # dict[str, Any] -> dict
        if dict in kinds:           # metrics and statistics: numbers by name
            return lambda v: v if v is None else {k: decode_float(x) for k, x in v.items()}
        if tuple in kinds:          # shapes
            return lambda v: v if v is None else tuple(v)
        if float in kinds:
            return decode_float
        return lambda v: v

    return [(name, decoder(name)) for name in fields]


__all__ = ["write_rows", "read_rows", "iter_rows", "FORMAT", "VERSION", "LOCATION_FIELDS"]
