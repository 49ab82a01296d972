"""Tensor descriptors, their encoding, and walking the tensors of a record.

A record is one op call (one line of records.jsonl); its fields, kinds, phases and the grammar of
its names are `opdiff.store.schema` (`Record`, `Kind`, `Phase`, `RecordName`)::

    {"seq": 12, "name": "Functional.conv2d.0.forward", "op": "Functional.conv2d", "kind": "api",
     "phase": "forward", "module": "Module.layer1.0.Bottleneck.forward.0", "inputs": [desc, ...],
     "kwargs": {"dim": desc}, "outputs": [desc, ...], "parameters": {"weight": desc}, "stack": 3}

A descriptor describes one argument::

    {"type": "tensor", "dtype": "float32", "shape": [2, 3], "device": "cpu",
     "requires_grad": true, "stats": {"max":, "min":, "mean":, "norm":, "nan":, "inf":},
     "key": "Functional.conv2d.0.forward.input.0"}       # key only when the tensor was saved
    An input made by a recorded forward op of the same step names it: `"producer": [seq, slot]`
    (its record's seq and output slot; dumps whose meta.json says `"dataflow": 1`); leaves
    carry `"leaf"` instead; neither: made outside the recorded ops.
    {"type": "tensor", ..., "stats": null, "overwritten": true}   # written by the op, never read
        (the target of a fill or copy_, an `out=` argument); "uninitialized": true for
        torch.empty's output. Compare leaves both out: their values are noise.
    {"type": "int" | "float" | "bool" | "str", "value": ...}
    {"type": "none"}
    {"type": "dtype" | "device", "value": "torch.float32"}
    {"type": "size", "value": [2, 3]}
    {"type": "list" | "tuple", "items": [desc, ...]}
    {"type": "dict", "items": {"k": desc}}
    {"type": "object", "value": "<repr, truncated>"}

Floats that are not finite are written as the strings "NaN", "Infinity", "-Infinity" so the
file stays strict JSON; `decode_float` turns them back.
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Iterable, Iterator, Optional

from .schema import Kind, Role

try:
    import orjson as _orjson
except ImportError:   # installed without dependencies: the standard library's encoder
    _orjson = None  # type: ignore[assignment]

STAT_KEYS = ("max", "min", "mean", "norm", "nan", "inf")

_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def encode_float(x: float) -> float | str:
    """A float as strict JSON allows it."""
    if math.isfinite(x):
        return x
    if math.isnan(x):
        return "NaN"
    return "Infinity" if x > 0 else "-Infinity"


def decode_float(x: Any) -> Any:
    """Inverse of encode_float; other values pass through."""
    if isinstance(x, str) and x in _NONFINITE:
        return _NONFINITE[x]
    return x


def scalar_descriptor(value: Any, max_len: int = 120) -> dict[str, Any] | None:
    """The descriptor of a plain Python scalar (None, bool, int, float, str); None otherwise."""
    if value is None:
        return {"type": "none"}
    if isinstance(value, bool):
        return {"type": "bool", "value": value}
    if isinstance(value, int):
        return {"type": "int", "value": value}
    if isinstance(value, float):
        return {"type": "float", "value": encode_float(value)}
    if isinstance(value, str):
        return {"type": "str", "value": value[:max_len]}
    return None


def dumps(obj: Any) -> str:
    """Serialize to one line of strict JSON.

    Through orjson where it is installed: the standard library's encoder spends about 30 us on a
    typical record, mostly formatting floats, orjson about 2 (a tenth of the transformer's step
    time went here). Record floats are already strict (`encode_float`); a bare NaN that slipped
    past it becomes null with orjson, an error without. What orjson refuses (integers beyond
    64 bits, say) goes through the standard library.
    """
    if _orjson is not None:
        try:
            return _orjson.dumps(obj).decode()
        except TypeError:   # orjson.JSONEncodeError included
            pass
    if _ENCODE is None:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return "".join(_ENCODE(obj, 0))


def _c_encoder() -> Optional[Callable[[Any, int], Iterable[str]]]:
    """json.dumps's C encoder, built once: dumps() builds it (and a JSONEncoder) on every call,
    a quarter of the cost of writing a record. No circular-reference check: records are trees."""
    from json import encoder
    make = getattr(encoder, "c_make_encoder", None)
    if make is None:
        return None

    def default(o: object) -> None:
        raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")
    encode: Callable[[Any, int], Iterable[str]] = make(
        None, default, encoder.encode_basestring, None, ":", ",", False, False, False)
    return encode


_ENCODE = _c_encoder()


def decoded_stats(desc: dict[str, Any]) -> dict[str, Any]:
    """A tensor descriptor's statistics with non-finite floats restored."""
    return {k: decode_float(v) for k, v in (desc.get("stats") or {}).items()}


def iter_descriptors(desc: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Flatten nested lists/tuples/dicts the way msprobe names them: list -> `.i`, dict -> `.key`."""
    t = desc.get("type")
    if t in ("list", "tuple"):
        for i, item in enumerate(desc.get("items", [])):
            yield from iter_descriptors(item, f"{path}.{i}")
    elif t == "dict":
        for k, item in desc.get("items", {}).items():
            yield from iter_descriptors(item, f"{path}.{k}")
    else:
        yield path, desc


def iter_leaves(record: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Yield (name, role, descriptor) for every leaf value of a record (tensors, scalars, None,
    ...), in a stable order. role is "input", "output" or "parameters". Names follow msprobe:
    `Functional.conv2d.0.forward.input.0`, `...forward.input.bias` (a kwarg),
    `Module.fc.Linear.forward.0.parameters.weight`, `Module.fc.Linear.parameters_grad.0.weight`.

    The names are `schema.tensor_name`'s, built inline: this runs for every tensor of every
    record a compare reads (tests/store/test_schema.py holds the two together).
    """
    name = record["name"]
    for i, d in enumerate(record.get("inputs") or []):
        yield from _with_role(iter_descriptors(d, f"{name}.input.{i}"), Role.INPUT)
    for k, d in (record.get("kwargs") or {}).items():
        yield from _with_role(iter_descriptors(d, f"{name}.input.{k}"), Role.INPUT)
    for i, d in enumerate(record.get("outputs") or []):
        yield from _with_role(iter_descriptors(d, f"{name}.output.{i}"), Role.OUTPUT)
    prefix = name if record.get("kind") == Kind.PARAM_GRAD else f"{name}.parameters"
    for k, d in (record.get("parameters") or {}).items():
        yield from _with_role(iter_descriptors(d, f"{prefix}.{k}"), Role.PARAMETERS)


def _with_role(leaves: Iterable[tuple[str, dict[str, Any]]], role: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, leaf in leaves:
        yield path, role, leaf


def iter_tensors(record: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Yield (tensor_name, role, descriptor) for every tensor of a record (see iter_leaves)."""
    for path, role, leaf in iter_leaves(record):
        if leaf.get("type") == "tensor":
            yield path, role, leaf


_NUMBERS = ("int", "float", "bool")


def input_numbers(record: dict[str, Any]) -> dict[str, Any]:
    """{"input.2": value} of the record's Python number arguments (`x[0] = 2.0`, `x * 0.5`),
    named within the record, so that the calls of two runs can be matched whatever their
    counters."""
    cut = len(record["name"]) + 1
    return {path[cut:]: decode_float(leaf.get("value")) for path, role, leaf in iter_leaves(record)
            if role == Role.INPUT and leaf.get("type") in _NUMBERS}


def has_nonfinite_number(record: dict[str, Any]) -> bool:
    """True when the op was given inf or NaN as a plain number (masked_fill(mask, -inf),
    full(..., inf)): it makes inf/NaN on purpose, it is not where an overflow is born."""
    return any(isinstance(x, float) and not math.isfinite(x) for x in input_numbers(record).values())
