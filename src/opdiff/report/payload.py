"""The data report.html draws: a CompareResult packed compact, every record's fields named.

The page's script reads every value by its field name (`D.fields.rows` gives the order of a
row's values), never by a position of its own, so a field is added in one place here and read
by name in the script. Rows stay arrays, not objects, with repeated strings interned: a report
of 100k rows has to open in a browser, and field names repeated per row would double its size.

    from opdiff.report.payload import build_payload
    data = build_payload(result)
    row = dict(zip(data["fields"]["rows"], data["rows"][0]))
    data["strings"][row["result"]]     # "pass"

Nothing is recomputed: metrics and statistics are only rounded for display, to the digits the
comparison's metric table gives each metric (`opdiff.comparison.metric_table.DIGITS`).
"""
from __future__ import annotations

import math
import operator
import os
from typing import Any, Optional

import numpy as np

from ..comparison import origins
from ..comparison.metric_table import DIGITS, METRICS
from ..comparison.result import ERROR, PASS, UNMATCHED, WARNING, CompareResult
from ..store.schema import Kind, RecordName, module_class, module_path
from .console import verdict_kind

VERSION = 2
# A row: `op` indexes `ops`, shapes index `shapes`, `stack` indexes `stacks`, other strings
# index `strings`. A name given as `[tail]` means `<op name>.<tail>`; golden name `1` means
# "same as target". `metrics` and the statistics are arrays in the order of `metrics` and
# `stat_keys`. The fields from `error` on are left out at the end of a row when unset.
ROW_FIELDS = ("op", "target_name", "golden_name", "role", "target_dtype", "golden_dtype",
              "target_shape", "golden_shape", "result", "accuracy_reached", "reason", "stack",
              "metrics", "target_stats", "golden_stats", "error", "scale_error", "mode", "step",
              "rank", "region")
OP_FIELDS = ("name", "index", "phase", "kind", "node")
# A module tree node: the subtree of node i is nodes i..end-1; severity is 0 pass, 1 unmatched,
# 2 warning, 3 error (forward/backward: -1 when no tensor of that phase); culprit is 2 on the
# culprit's module, 1 on its ancestors; pass..unmatched count the rows in the subtree.
TREE_FIELDS = ("parent", "label", "class", "severity", "pass", "warning", "error", "unmatched",
               "end", "culprit", "forward", "backward")
LOCATION_FIELDS = ("file", "line", "code", "function")
_R = {name: i for i, name in enumerate(ROW_FIELDS)}
_REQUIRED_FIELDS = _R["error"]      # row fields always present

_STAT_KEYS = ("max", "min", "mean", "norm", "nan", "inf")
_STAT_DIGITS = 5
_SEVERITY = {PASS: 0, UNMATCHED: 1, WARNING: 2, ERROR: 3}
_OWN_NODE_KINDS = (Kind.MODULE, Kind.PARAM_GRAD)   # rows that sit in the tree under their own name


def _in_region(row: Any, divergence: Any) -> bool:
    """Is the row one of the ops of the region that is the first divergence?"""
    region = getattr(row, "region", None)
    if not region or getattr(divergence, "region", None) is None:
        return False
    number = divergence.name.split(".")[1] if divergence.name.count(".") == 2 else ""
    return region == f"region {number}" or region.startswith(f"region {number} ")


def digits(metric: str) -> int:
    """Significant digits the page shows of a metric (the metric table's; 5 when unknown)."""
    return DIGITS.get(metric, 5)


class _Strings:
    """Interns repeated strings (dtypes, reasons, module names) into one table."""

    def __init__(self) -> None:
        self.table: list[str] = []
        self._ids: dict[str, int] = {}

    def __call__(self, s: Optional[str]) -> Optional[int]:
        if s is None:
            return None
        s = str(s)
        i = self._ids.get(s)
        if i is None:
            i = self._ids[s] = len(self.table)
            self.table.append(s)
        return i


def build_payload(result: CompareResult, files: Optional[dict] = None) -> dict:
    """The data the page's script reads: compact rows of named fields, interned strings, the
    module tree. `files` (default `result.files`) are the files written beside the page."""
    strings = _Strings()
    rows = result.rows
    present = {m for r in rows for m, v in (r.metrics or {}).items() if v is not None}
    metric_names = [m for m in METRICS if m in present] + sorted(present - set(METRICS))
    stat_keys = [k for k in _STAT_KEYS if any(k in r.target_stats or k in r.golden_stats
                                              for r in rows)]
    tree, node_of_module = _module_tree(result, strings)
    divergence = result.first_divergence

    ops: list[list] = []
    op_ids: dict[tuple, int] = {}
    stacks: list[list] = []
    stack_ids: dict[tuple, int] = {}
    shapes: list[list] = []
    shape_ids: dict[tuple, int] = {}

    def shape_id(shape) -> Optional[int]:
        if shape is None:
            return None
        key = tuple(shape)
        i = shape_ids.get(key)
        if i is None:
            i = shape_ids[key] = len(shapes)
            shapes.append([_plain(d) for d in key])
        return i

    culprit_rows: list[int] = []
    packed = []
    for i, r in enumerate(rows):
        node = node_of_module.get(_tree_name(r), -1)
        index = r.index if isinstance(r.index, int) else i     # the chart's x axis needs a number
        op_key = (r.op_name, index, r.phase, r.kind, node)
        op = op_ids.get(op_key)
        if op is None:
            op = op_ids[op_key] = len(ops)
            ops.append([strings(r.op_name), index, strings(r.phase), strings(r.kind), node])
        stack = None
        if r.stack:
            key = tuple(r.stack)
            stack = stack_ids.get(key)
            if stack is None:
                stack = stack_ids[key] = len(stacks)
                stacks.append([_location(loc) for loc in r.stack])
        target_name = _name(r.target_name, r.op_name)
        golden_name = 1 if (r.golden_name is not None and r.golden_name == r.target_name) \
            else _name(r.golden_name, r.op_name)
        if divergence is not None and (r.op_name == divergence.name or _in_region(r, divergence)):
            culprit_rows.append(i)
        # In the order of ROW_FIELDS; the numbers are filled below, column by column.
        packed.append([
            op, target_name, golden_name, strings(r.role),
            strings(r.target_dtype), strings(r.golden_dtype),
            shape_id(r.target_shape), shape_id(r.golden_shape),
            strings(r.result), strings(r.accuracy_reached or None), strings(r.reason or None),
            stack, None, None, None, None, None,
            strings(_mode(r.mode)), r.step, r.rank, strings(getattr(r, "region", None)),
        ])

    columns = [
        (("metrics",), [r.metrics for r in rows], metric_names, [digits(m) for m in metric_names]),
        (("target_stats",), [r.target_stats for r in rows], stat_keys, [_STAT_DIGITS] * len(stat_keys)),
        (("golden_stats",), [r.golden_stats for r in rows], stat_keys, [_STAT_DIGITS] * len(stat_keys)),
        # the verdict's two errors, one field each
        (("error", "scale_error"), [{"e": r.error, "s": r.scale_error} for r in rows],
         ["e", "s"], [_STAT_DIGITS] * 2),
    ]
    for fields, dicts, keys, places in columns:
        at = [_R[f] for f in fields]
        for row, numbers in zip(packed, _number_rows(dicts, keys, places)):
            if len(at) == 1:
                row[at[0]] = numbers
            elif numbers is not None:
                for a, v in zip(at, numbers):
                    row[a] = v
    for row in packed:     # trailing nulls of the optional fields are dropped: shorter rows
        while len(row) > _REQUIRED_FIELDS and row[-1] is None:
            row.pop()

    files = result.files if files is None else files
    return {
        "version": VERSION,
        "fields": {"rows": list(ROW_FIELDS), "ops": list(OP_FIELDS), "tree": list(TREE_FIELDS),
                   "location": list(LOCATION_FIELDS)},
        "title": result.title,
        "target": result.target,
        "golden": result.golden,
        "step": result.step,
        "rank": result.rank,
        "counts": {k: _plain(v) for k, v in (result.counts or {}).items()},
        "environment_diff": [{k: _text(e.get(k)) for k in ("key", "target", "golden")}
                             for e in (result.environment_diff or []) if isinstance(e, dict)],
        "pairs": [_pair(p) for p in (result.pairs or []) if isinstance(p, dict)],
        "verdict": _text(result.verdict) or None,
        # the verdict box's colour and title follow what the verdict says (report/console.py)
        "verdict_kind": verdict_kind(result),
        "notes": [_text(n) for n in result.notes or []],
        "files": {str(k): os.path.basename(str(v)) for k, v in (files or {}).items() if v},
        "divergence": _divergence(divergence, culprit_rows),
        "metrics": metric_names,
        "stat_keys": stat_keys,
        "strings": strings.table,
        "shapes": shapes,
        "ops": ops,
        "stacks": stacks,
        "rows": packed,
        "tree": tree,
    }


def _module_call(name: Optional[str]) -> Optional[tuple[str, str]]:
    """(path, class) of a module call or parameter-gradient record name, else None."""
    parsed = RecordName.parse(name) if name else None
    if parsed is None or parsed.kind not in _OWN_NODE_KINDS or not parsed.op.startswith("Module."):
        return None
    return module_path(parsed.op), module_class(parsed.op)


def _module_tree(result: CompareResult, strings: _Strings) -> tuple[list, dict]:
    """Nodes in pre-order, each a list in the order of TREE_FIELDS; also maps module call names
    to nodes.

    The tree follows module paths (`layer1.0.conv1`), so the forward and backward calls of one
    module, and every call of a reused module, share one node. Each row counts in the node of its
    enclosing module and in all of that node's ancestors.
    """
    calls: dict[str, tuple[str, str]] = {}      # module call name -> (path, class)
    for r in result.rows:
        name = _tree_name(r)
        if name and name not in calls:
            calls[name] = _module_call(name) or (name, "")
    if not calls:
        return [], {}
    classes: dict[str, str] = {}
    for path, cls in calls.values():
        classes.setdefault(path, cls)
        parts = path.split(".") if path else []
        for n in range(len(parts)):                 # intermediate modules with no call of their own
            classes.setdefault(".".join(parts[:n]), "")

    children: dict[str, list[str]] = {}
    for path in classes:
        if path:
            children.setdefault(path.rpartition(".")[0], []).append(path)
    order: list[str] = []
    end: dict[str, int] = {}
    todo: list[tuple[str, bool]] = [("", False)]
    while todo:                                 # pre-order walk; no recursion, however deep
        path, done = todo.pop()
        if done:
            end[path] = len(order)
            continue
        order.append(path)
        todo.append((path, True))
        # children in first-seen (execution) order
        todo.extend((child, False) for child in reversed(children.get(path, [])))
    index = {path: i for i, path in enumerate(order)}
    counts = [[0, 0, 0, 0] for _ in order]
    by_phase = {"forward": [-1] * len(order), "backward": [-1] * len(order)}
    parent = [index[p.rpartition(".")[0]] if p else -1 for p in order]
    column = {PASS: 0, WARNING: 1, ERROR: 2, UNMATCHED: 3}
    divergence = result.first_divergence
    culprit_node = -1
    for r in result.rows:
        name = _tree_name(r)
        if not name:
            continue
        node = index[calls[name][0]]
        if divergence is not None and r.op_name == divergence.name:
            culprit_node = node
        c = column.get(r.result)
        if c is None:
            continue
        severity = _SEVERITY[r.result]
        phase = by_phase.get(r.phase)
        while node >= 0:
            counts[node][c] += 1
            if phase is not None and phase[node] < severity:
                phase[node] = severity
            node = parent[node]
    if culprit_node < 0 and divergence is not None and divergence.module in calls:
        culprit_node = index[calls[divergence.module][0]]
    on_culprit_path = set()
    node = culprit_node
    while node >= 0:
        on_culprit_path.add(node)
        node = parent[node]

    nodes = []
    for i, path in enumerate(order):
        p, w, e, u = counts[i]
        severity = 3 if e else 2 if w else 1 if u else 0
        label = path.rpartition(".")[2] if path else "(model)"
        nodes.append([parent[i], strings(label), strings(classes[path]), severity, p, w, e, u,
                      end[path], 2 if i == culprit_node else 1 if i in on_culprit_path else 0,
                      by_phase["forward"][i], by_phase["backward"][i]])
    return nodes, {name: index[path] for name, (path, _) in calls.items()}


def _tree_name(row) -> Optional[str]:
    """The module call a row belongs to: its own for module calls and parameter gradients."""
    if row.kind in _OWN_NODE_KINDS and _module_call(row.op_name) is not None:
        return row.op_name
    return row.module


def _divergence(d, culprit_rows: list[int]) -> Optional[dict]:
    if d is None:
        return None
    return {
        "name": _text(d.name), "op": _text(d.op), "phase": _text(d.phase),
        "reason": _text(d.reason), "location": _location(d.location) if d.location else None,
        "metrics": {str(k): _number(v, digits(k)) for k, v in (d.metrics or {}).items()},
        "input_metrics": {str(k): _number(v, digits(k))
                          for k, v in (d.input_metrics or {}).items()},
        "tensor": _text(d.tensor), "module": _text(d.module), "step": d.step, "rank": d.rank,
        "origin": _text(getattr(d, "origin", None)), "kind": _text(getattr(d, "kind", None)),
        # the verdict box's words for where it comes from (comparison/origins.py's RULES)
        # (and whether the worst input may be absent: not an op's own error)
        "heading": origins.heading(d),
        "input_optional": getattr(d, "origin", None) not in (None, "", origins.Origin.OP),
        "context": [[int(n), _text(t)] for n, t in (d.context or ())],
        "rows": culprit_rows,
    }


def _location(loc) -> list:
    return [_text(loc.file), int(loc.line) if loc.line is not None else None,
            _text(loc.code), _text(loc.function)]


def _mode(mode: Optional[str]) -> Optional[str]:
    return None if mode in (None, "", "tensor") else str(mode)


def _name(name: Optional[str], op_name: str) -> Any:
    if name is None:
        return None
    if op_name and name.startswith(op_name + "."):
        return [name[len(op_name) + 1:]]
    return str(name)


def _number_rows(dicts: list, keys: list[str], places: list[int]) -> list:
    """Each dict's values at `keys` as display-rounded JSON numbers; None for an empty dict.

    Vectorised with numpy: a report of 50k rows holds about a million numbers, and rounding
    them one by one in Python took seconds.
    """
    out: list = [None] * len(dicts)
    full = [i for i, d in enumerate(dicts) if d]
    if not full:
        return out
    pick = operator.itemgetter(*keys) if len(keys) > 1 else (lambda d: (d[keys[0]],))

    def values(d: dict) -> tuple:
        try:
            return pick(d)
        except KeyError:            # a row without some of the columns
            return tuple(d.get(k) for k in keys)

    try:
        matrix = np.array([values(dicts[i]) for i in full], dtype=np.float64)
    except (TypeError, ValueError):     # something that is not a number: one by one
        matrix = None
    if matrix is None or matrix.ndim != 2:
        for i in full:
            out[i] = [_number(dicts[i].get(k), d) for k, d in zip(keys, places)]
        return out
    bad = ~np.isfinite(matrix)
    rounded = _round_significant(matrix, np.asarray(places, dtype=np.float64)).tolist()
    # None, NaN and infinities need their own JSON spelling: fix just those cells.
    for j, c in zip(*np.nonzero(bad)):
        rounded[j][c] = _number(dicts[full[j]].get(keys[c]))
    for j, i in enumerate(full):
        row = rounded[j]
        out[i] = None if row.count(None) == len(row) else row
    return out


def _round_significant(x: np.ndarray, digits: np.ndarray) -> np.ndarray:
    """x rounded to `digits` significant digits (per column), landing on the double nearest to
    the short decimal so that JSON prints it short."""
    a = np.abs(x)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        places = digits - 1 - np.floor(np.log10(np.where(a > 0, a, 1.0)))
        # Multiply or divide by an exact power of ten: the result is then correctly rounded.
        scale = 10.0 ** np.abs(places)
        out = np.where(places >= 0, np.round(x * scale) / scale, np.round(x / scale) * scale)
    return np.where(np.isfinite(out) & (np.abs(places) <= 22), out, x)


def _number(v: Any, digits: int = 6) -> Any:
    """A metric or statistic as strict JSON: rounded for display, non-finite as a string."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v
    try:
        x = float(v)
    except (TypeError, ValueError):
        return _text(v)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return float(f"{x:.{digits}g}")


def _pair(p: dict) -> dict:
    """A step/rank pair's entry: its first divergence by name, op and place (the page's grid and
    table need no more)."""
    out = {str(k): _plain(v) for k, v in p.items() if k != "first_divergence"}
    fd = p.get("first_divergence")
    if isinstance(fd, dict):          # a result loaded back from summary.json
        fd = {k: fd.get(k) for k in ("name", "op", "step", "rank", "kind", "origin")}
    elif fd is not None and hasattr(fd, "name"):
        fd = {k: getattr(fd, k, None) for k in ("name", "op", "step", "rank", "kind", "origin")}
    out["first_divergence"] = _plain(fd)
    return out


def _plain(v: Any) -> Any:
    """A value the JSON encoder accepts, for small free-form fields (counts, pair summaries)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return _number(v)
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return str(v)


def _text(v: Any) -> Optional[str]:
    return None if v is None else str(v)



__all__ = ["build_payload", "digits", "ROW_FIELDS", "OP_FIELDS", "TREE_FIELDS", "LOCATION_FIELDS",
           "VERSION"]
