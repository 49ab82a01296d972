"""JSON Schemas of every JSON document opdiff writes: the contract scripts and agents rely on.

    from opdiff import schemas
    schemas.load("compare-summary")                  # the schema, a dict
    schemas.validate("compare-summary", document)    # raises jsonschema.ValidationError

A change to an output is a change to its schema here and a line in CHANGELOG.md. Each document
carries its `schema_version` (`opdiff.store.records.SCHEMA_VERSION`), except next_dump.json,
which stays an msprobe config. Validating needs the `jsonschema` package (`pip install jsonschema`).
"""
from __future__ import annotations

import json
from importlib import resources
from typing import Any

# name -> the file it describes and the command that writes it
DOCUMENTS = {
    "compare-summary": ("summary.json", "opdiff compare, opdiff onnx, opdiff.compare(output_path=...)"),
    "rows": ("rows.jsonl (first line)", "opdiff compare, opdiff onnx"),
    "check-summary": ("summary.json", "opdiff check"),
    "trend-summary": ("summary.json", "opdiff trend"),
    "next-dump": ("next_dump.json", "opdiff trend"),
    "overflow": ("overflow.json", "opdiff overflow"),
    "onnx-details": ("onnx_details.json", "opdiff onnx"),
    "dump-meta": ("step{S}/rank{R}/meta.json", "PrecisionDebugger, opdiff.dump"),
    "dump-record": ("step{S}/rank{R}/records.jsonl (each line)", "PrecisionDebugger, opdiff.dump"),
    "monitor-meta": ("rank{R}/meta.json", "opdiff.Monitor"),
    "noise-floor": ("noise_floor.json", "opdiff calibrate"),
}


def load(name: str) -> dict[str, Any]:
    """The schema called `name` (a key of DOCUMENTS)."""
    if name not in DOCUMENTS:
        raise KeyError(f"no schema {name!r}; known: {', '.join(DOCUMENTS)}")
    text = resources.files(__name__).joinpath(f"{name}.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def validate(name: str, document: Any) -> None:
    """Raise jsonschema.ValidationError when `document` does not follow the schema `name`."""
    import jsonschema

    jsonschema.validate(document, load(name), cls=jsonschema.Draft202012Validator)
