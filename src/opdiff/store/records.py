"""Tensor descriptors, their encoding, and walking the tensors of a record.

A record is one op call (one line of records.jsonl); its fields, kinds, phases and the grammar of
its names are `opdiff.store.schema` (`Record`, `Kind`, `Phase`, `RecordName`)::

    {"seq": 12, "name": "Functional.conv2d.0.forward", "op": "Functional.conv2d", "kind": "api",
     "phase": "forward", "module": "Module.layer1.0.Bottleneck.forward.0", "inputs": [desc, ...],
     "kwargs": {"dim": desc}, "outputs": [desc, ...], "parameters": {"weight": desc}, "stack": 3}

A descriptor describes one argument::

    {"type": "tensor", "dtype": "float32", "shape": [2, 3], "device": "cpu",
     "requires_grad": true, "stats": {"max":, "min":, "mean":, "norm":, "nan":, "inf":},
                                   # (the statistics: opdiff.store.statistics.STATISTICS)
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
file stays strict JSON; `decode_float` turns them back (and the spelling older monitor files used,
"nan", "inf", "-inf"). This module is the one strict-JSON encoder of the package: every JSON file
opdiff writes goes through `dumps` (records, one line) or `json_text` (documents), and every
document carries `SCHEMA_VERSION` under "schema_version" (its schema: `opdiff/schemas/`).
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Iterable, Iterator, Optional, Tuple, Union, cast

from .schema import Descriptor, Kind, NonFinite, Record, Role

try:
    import orjson as _orjson
except ImportError:   # installed without dependencies: the standard library's encoder
    _orjson = None  # type: ignore[assignment]

# The one spelling written, then the one older monitor files wrote (read, never written).
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf,
              "nan": math.nan, "inf": math.inf, "-inf": -math.inf}

# The version of every JSON document opdiff writes (summary.json, overflow.json, meta.json ...);
# a change to a document is a change to its schema in opdiff/schemas/ and a CHANGELOG line.
SCHEMA_VERSION = 1


def encode_float(x: float) -> Union[float, NonFinite]:
    """A float as strict JSON allows it."""
    if math.isfinite(x):
        return x
    if math.isnan(x):
        return "NaN"
    return "Infinity" if x > 0 else "-Infinity"


def strict_json(obj: Any, default: Callable[[Any], Any] = str) -> Any:
    """`obj` as strict JSON allows it: non-finite floats spelled by `encode_float`, tuples as
    lists, dict keys as strings, numpy scalars as numbers, anything else through `default`."""
    if isinstance(obj, float):
        return encode_float(obj)
    if obj is None or isinstance(obj, (str, bool, int)):
        return obj
    if isinstance(obj, dict):
        return {str(k): strict_json(v, default) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v, default) for v in obj]
    item = getattr(obj, "item", None)       # numpy / torch scalars
    if callable(item) and getattr(obj, "shape", None) == ():
        return strict_json(item(), default)
    return default(obj)


def json_text(obj: Any, indent: Optional[int] = None, default: Callable[[Any], Any] = str) -> str:
    """One strict-JSON document (summary.json, meta.json ...): `strict_json(obj)` written with
    `indent`, non-ASCII text kept as it is."""
    return json.dumps(strict_json(obj, default), indent=indent, allow_nan=False, ensure_ascii=False)


def decode_float(x: Any) -> Any:
    """Inverse of encode_float (also for the old spelling "nan", "inf", "-inf"); other values
    pass through."""
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


def decoded_stats(desc: Union[Descriptor, dict[str, Any]]) -> dict[str, Any]:
    """A tensor descriptor's statistics with non-finite floats restored."""
    return {k: decode_float(v) for k, v in (desc.get("stats") or {}).items()}


def iter_descriptors(desc: Descriptor, path: str) -> Iterator[tuple[str, Descriptor]]:
    """Flatten nested lists/tuples/dicts the way msprobe names them: list -> `.i`, dict -> `.key`."""
    t = desc.get("type")
    if t in ("list", "tuple"):
        items = desc.get("items", [])   # a list: `record_problem` checked it where the dump was read
        for i, item in enumerate(items if isinstance(items, list) else items.values()):
            yield from iter_descriptors(item, f"{path}.{i}")
    elif t == "dict":
        named = desc.get("items", {})
        for k, item in (named.items() if isinstance(named, dict) else enumerate(named)):
            yield from iter_descriptors(item, f"{path}.{k}")
    else:
        yield path, desc


def iter_leaves(record: Record) -> Iterator[tuple[str, str, Descriptor]]:
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


def _with_role(leaves: Iterable[tuple[str, Descriptor]], role: str) -> Iterator[tuple[str, str, Descriptor]]:
    for path, leaf in leaves:
        yield path, role, leaf


def iter_tensors(record: Record) -> Iterator[tuple[str, str, Descriptor]]:
    """Yield (tensor_name, role, descriptor) for every tensor of a record (see iter_leaves)."""
    for path, role, leaf in iter_leaves(record):
        if leaf.get("type") == "tensor":
            yield path, role, leaf


def producer_ref(seq: int, slot: Union[int, str]) -> Tuple[int, int]:
    """A rewritten input's `producer` field: a [seq, slot] list, as every dump's reads back from
    JSON (`Descriptor.producer` types its JSON shape; the slot is kept as the stage found it)."""
    return cast(Tuple[int, int], [seq, slot])   # a list at run time, like a dump's


def producer_of(desc: Descriptor) -> Optional[tuple[int, str]]:
    """(seq, slot) of the op that made an input (`"producer": [seq, slot]`), or None. A dump is
    untrusted: anything else there (a list for a seq, a dict) is no producer."""
    found = desc.get("producer")
    if not isinstance(found, (list, tuple)) or len(found) != 2:
        return None
    seq, slot = found
    if not isinstance(seq, int) or isinstance(seq, bool) or not isinstance(slot, (int, str)):
        return None
    return seq, str(slot)


_NUMBERS = ("int", "float", "bool")


def input_numbers(record: Record) -> dict[str, Any]:
    """{"input.2": value} of the record's Python number arguments (`x[0] = 2.0`, `x * 0.5`),
    named within the record, so that the calls of two runs can be matched whatever their
    counters."""
    cut = len(record["name"]) + 1
    return {path[cut:]: decode_float(leaf.get("value")) for path, role, leaf in iter_leaves(record)
            if role == Role.INPUT and leaf.get("type") in _NUMBERS}


def has_nonfinite_number(record: Record) -> bool:
    """True when the op was given inf or NaN as a plain number (masked_fill(mask, -inf),
    full(..., inf)): it makes inf/NaN on purpose, it is not where an overflow is born."""
    return any(isinstance(x, float) and not math.isfinite(x) for x in input_numbers(record).values())


# -- checking what a dump says (reading side) ------------------------------------------------------
# A record read from a dump is untrusted: `record_problem` says what in it is not what a record
# is, before any stage walks it (a string where a list of descriptors belongs, a list where an
# id belongs...). Only the fields opdiff reads are checked; other fields are left alone.
_TEXT_FIELDS = ("name", "op", "kind", "phase")                  # required, text
_OPTIONAL_TEXT = frozenset(("module", "forward", "error", "leaf", "tensor", "reader", "rng",
                            "overflow", "autograd_node"))


def record_problem(record: Any) -> Optional[str]:
    """What makes a parsed records.jsonl line not a record (None when it is one). Runs for every
    record a compare reads: type tests and set operations rather than per-item Python."""
    if type(record) is not dict:
        return f"a JSON {type(record).__name__}, not a record object"
    get = record.get
    for key in _TEXT_FIELDS:
        if type(get(key)) is not str:
            return f"no text {key!r}"
    for key in _OPTIONAL_TEXT.intersection(record):
        if type(record[key]) not in _TEXT:
            return f"{key!r} is not text"
    for key in ("seq", "stack"):
        if type(get(key)) not in _OPT_INT:
            return f"{key!r} is not a whole number"
    group = get("group")
    if group is not None and not (type(group) is dict and type(group.get("ranks", [])) is list):
        return "'group' is not a {\"ranks\": [...]} object"
    inputs, outputs = get("inputs") or [], get("outputs") or []
    kwargs, parameters = get("kwargs") or {}, get("parameters") or {}
    if type(inputs) is not list or type(outputs) is not list:
        return "'inputs' or 'outputs' is not a list"
    if type(kwargs) is not dict or type(parameters) is not dict:
        return "'kwargs' or 'parameters' is not an object"
    return _descriptors_problem([*inputs, *outputs, *kwargs.values(), *parameters.values()])


def descriptor_problem(desc: Any) -> Optional[str]:
    """What makes a value not a descriptor (nested ones included)."""
    return _descriptors_problem([desc])


def _descriptors_problem(todo: list[Any]) -> Optional[str]:
    """The first problem of the descriptors in `todo` and inside them, without recursion."""
    while todo:
        d = todo.pop()
        if type(d) is not dict or type(d.get("type")) is not str:
            return "a descriptor is not an object with a text 'type'"
        t = d["type"]
        if t == "tensor":
            shape, stats = d.get("shape"), d.get("stats")
            if shape is not None and (type(shape) is not list or not {type(n) for n in shape} <= _INT
                                      or min(shape, default=0) < 0):
                return "a tensor's shape is not a list of sizes"
            if stats is not None and (type(stats) is not dict
                                      or not {type(v) for v in stats.values()} <= _SCALARS):
                return "a tensor's stats are not an object of numbers"
            if type(d.get("dtype")) not in _TEXT or type(d.get("key")) not in _TEXT:
                return "a tensor's dtype or key is not text"
            producer = d.get("producer")
            if producer is not None and (type(producer) is not list or len(producer) != 2
                                         or type(producer[0]) is not int
                                         or type(producer[1]) not in (int, str)):
                return "a tensor's producer is not [seq, slot]"
        elif t in ("list", "tuple"):
            items = d.get("items", [])
            if type(items) is not list:
                return f"a {t} descriptor's items are not a list"
            todo.extend(items)
        elif t == "dict":
            items = d.get("items", {})
            if type(items) is not dict:
                return "a dict descriptor's items are not an object"
            todo.extend(items.values())
        elif t == "size":
            value = d.get("value")
            if value is not None and (type(value) is not list or not {type(n) for n in value} <= _INT):
                return "a size's value is not a list of whole numbers"
        elif type(d.get("value")) not in _SCALARS:
            return f"a {t} descriptor's value is not a number or text"
    return None


_INT = {int}
_OPT_INT = {int, type(None)}
_TEXT = {str, type(None)}
_SCALARS = {str, int, float, bool, type(None)}


def stack_frame(f: tuple[Any, ...]) -> dict[str, Any]:
    """A stacks.jsonl frame from (file, line, function, code[, context]); context is
    ((line number, text), ...) around the line, stored by capture so readers never open the file."""
    frame = {"file": f[0], "line": f[1], "function": f[2], "code": f[3]}
    if len(f) > 4 and f[4]:
        frame["context"] = [list(c) for c in f[4]]
    return frame


_MAX_STACK_LINES = 1 << 12     # (a line holds its frames' source context: about 1 kB)
_stack_lines: dict[tuple[int, Any], str] = {}      # (stack id, frames) -> its line


def stack_line(sid: int, frames: tuple[tuple[Any, ...], ...]) -> str:
    """The stacks.jsonl line of stack `sid` (frames as `stack_frame` takes them). Each step's
    dump writes its call sites again, in the same order: their lines are made once a process."""
    line = _stack_lines.get((sid, frames))
    if line is None:
        if len(_stack_lines) >= _MAX_STACK_LINES:     # generated code must not grow this forever
            _stack_lines.clear()
        line = _stack_lines[(sid, frames)] = dumps({"id": sid, "frames": [stack_frame(f) for f in frames]})
    return line
