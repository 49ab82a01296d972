"""The JSON Schema of a records.jsonl line and the docs' field tables, made from the record types.

`opdiff.store.schema`'s TypedDicts (`Record`, `Descriptor`, `CompiledFacts`, ...) are the one
source of the record format: each field's type is its JSON type, the comment beside it its
description, a `Required[...]` field a required key. This module turns them into

- `json_schema()`: what `schemas/dump-record.schema.json` holds (the file is written from it,
  and a test fails when the two differ):

      PYTHONPATH=src python -m opdiff.store.record_schema --write

- `json_schema(closed=True)`: the same with no key beyond the typed ones, which the tests hold
  real captures to (a field capture writes without a type fails them);
- `fields(cls)`: (field, type as written, description) rows for the dump format page
  (docs/hooks.py).

Python's typing only; torch-free.
"""
from __future__ import annotations

import ast
import inspect
import io
import json
import re
import sys
import tokenize
from pathlib import Path
from typing import Any, Dict, List, Tuple, Union

from typing_extensions import Literal, get_args, get_origin, get_type_hints, is_typeddict

from . import schema

ROOT = schema.Record
TITLE = "one line of records.jsonl"
DESCRIPTION = ("One op call (or a leaf: a parameter, buffer or input at its first read). Its version is "
               "the dump's format_version in meta.json. Generated from opdiff.store.schema's Record.")
SCHEMA_FILE = Path(__file__).resolve().parent.parent / "schemas" / "dump-record.schema.json"


def _comments() -> dict[str, dict[str, str]]:
    """{class: {field: the comment beside it}} for every class of `opdiff.store.schema`; the
    comment-only lines right below a field continue its comment."""
    text = inspect.getsource(schema)
    by_line: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            by_line[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.add(tok.start[0])
    out: dict[str, dict[str, str]] = {}
    for node in ast.parse(text).body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs = out.setdefault(node.name, {})
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                end = item.end_lineno or item.lineno
                words = by_line.get(end)
                if words is None:
                    continue
                line = end + 1
                while line in by_line and line not in code_lines:
                    words += " " + by_line[line]
                    line += 1
                docs[item.target.id] = words
    return out


def _def_name(cls: type) -> str:
    """`ProgramStep` -> `program_step`: a type's name under `$defs`."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


class _Builder:
    def __init__(self, closed: bool):
        self.closed = closed
        self.comments = _comments()
        self.defs: dict[str, dict[str, Any]] = {}

    def of(self, hint: Any) -> dict[str, Any]:
        """The JSON Schema of one type."""
        origin = get_origin(hint)
        args = get_args(hint)
        if hint is Any:
            return {}
        if hint is type(None):
            return {"type": "null"}
        if hint in _SIMPLE:
            return {"type": _SIMPLE[hint]}
        if is_typeddict(hint):
            name = _def_name(hint)
            if name not in self.defs:
                self.defs[name] = {}     # (a type that holds itself: Descriptor's items)
                self.defs[name] = self.object(hint)
            return {"$ref": f"#/$defs/{name}"}
        if origin is Literal:
            return {"enum": list(args)}
        if origin is Union:
            members = [self.of(a) for a in args]
            if all(set(m) == {"type"} and isinstance(m["type"], str) for m in members):
                return {"type": [m["type"] for m in members]}
            return {"anyOf": members}
        if origin in (list, List):
            return {"type": "array", "items": self.of(args[0])}
        if origin in (tuple, Tuple):
            return {"type": "array", "prefixItems": [self.of(a) for a in args],
                    "minItems": len(args), "maxItems": len(args)}
        if origin in (dict, Dict):
            return {"type": "object", "additionalProperties": self.of(args[1])}
        raise TypeError(f"no JSON Schema for the record type {hint!r}")

    def object(self, cls: type) -> dict[str, Any]:
        """A TypedDict as a JSON object: its fields, their comments, its required keys."""
        docs = self.comments.get(cls.__name__, {})
        props: dict[str, Any] = {}
        for name, hint in get_type_hints(cls).items():
            prop = self.of(hint)
            if docs.get(name):
                prop = {**prop, "description": docs[name]}
            props[name] = prop
        out: dict[str, Any] = {"type": "object"}
        if cls is not ROOT and cls.__doc__:
            out["description"] = " ".join(cls.__doc__.split())
        out["properties"] = props
        required = [k for k in props if k in cls.__required_keys__]   # type: ignore[attr-defined]
        if required:
            out["required"] = required
        out["additionalProperties"] = not self.closed
        return out


_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean"}


def json_schema(closed: bool = False) -> dict[str, Any]:
    """The JSON Schema of one records.jsonl line; `closed`: no key beyond the typed ones."""
    builder = _Builder(closed)
    body = builder.object(ROOT)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://opdiff.dev/schemas/dump-record.schema.json",
            "title": TITLE, "description": DESCRIPTION, **body,
            "$defs": dict(sorted(builder.defs.items()))}


def types() -> list[type]:
    """The record's types, the record first, then each type its fields use (source order)."""
    seen: list[type] = []

    def visit(hint: Any) -> None:
        if is_typeddict(hint):
            if hint in seen:
                return
            seen.append(hint)
            for h in get_type_hints(hint).values():
                visit(h)
            return
        for a in get_args(hint):
            visit(a)

    visit(ROOT)
    return seen


def type_text(hint: Any) -> str:
    """A field's type as a reader of the docs would write it (`List[Descriptor]`)."""
    origin = get_origin(hint)
    args = get_args(hint)
    if hint is Any:
        return "any"
    if hint is type(None):
        return "null"
    if hint in _SIMPLE or is_typeddict(hint):
        return str(hint.__name__)
    if origin is Literal:
        return " or ".join(json.dumps(a) for a in args)
    if origin is Union:
        return " or ".join(type_text(a) for a in args)
    if origin in (list, List):
        return f"List[{type_text(args[0])}]"
    if origin in (tuple, Tuple):
        return f"[{', '.join(type_text(a) for a in args)}]"
    if origin in (dict, Dict):
        return f"Dict[{type_text(args[0])}, {type_text(args[1])}]"
    return str(hint)


def fields(cls: type) -> list[tuple[str, str, str]]:
    """(field, type, description) of one record type, in source order."""
    docs = _comments().get(cls.__name__, {})
    return [(name, type_text(hint), docs.get(name, "")) for name, hint in get_type_hints(cls).items()]


def schema_text() -> str:
    """The text of schemas/dump-record.schema.json."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        SCHEMA_FILE.write_text(schema_text(), encoding="utf-8")
        print(f"wrote {SCHEMA_FILE}")
        return 0
    sys.stdout.write(schema_text())
    return 0


__all__ = ["json_schema", "types", "type_text", "fields", "schema_text", "SCHEMA_FILE"]

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
