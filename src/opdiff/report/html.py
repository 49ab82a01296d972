"""`report.html`: one self-contained page that shows a CompareResult.

The page opens with the verdict (the culprit, why, the user's source line, what differs in the
environment), then a chart of error along execution order, the module tree coloured by worst
verdict, and the full table (sortable, filterable, each row linked to its stack)::

    from opdiff.report.html import write_html
    write_html(result, "out/report.html")

Nothing is recomputed here: the page only presents what the CompareResult holds. Everything a
dump controls (names, paths, source code) travels as JSON inside a `<script type=
"application/json">` block and is put on the page with `textContent` by the embedded script, and a
Content-Security-Policy allows only that script (by hash) and no network at all, so a hostile dump
cannot run code in the page. Rows are compact arrays with interned strings; the table renders only
the rows in view, so tens of thousands of rows open quickly.
"""
from __future__ import annotations

import base64
import hashlib
import html
import json
import logging
import math
import operator
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..comparison.result import ERROR, METRICS, PASS, UNMATCHED, WARNING, CompareResult
from ..errors import OpdiffError

log = logging.getLogger("opdiff")

_ASSETS = Path(__file__).resolve().parent
_STAT_KEYS = ("max", "min", "mean", "norm", "nan", "inf")
# Cosine near 1 carries its information in the far digits (the chart draws 1 - cosine).
_DIGITS = {"Cosine": 10}
_SEVERITY = {PASS: 0, UNMATCHED: 1, WARNING: 2, ERROR: 3}
_REQUIRED_FIELDS = 15      # row fields always present; see build_payload
# `Module.layer1.0.conv1.Conv2d.forward.0` -> path "layer1.0.conv1", class "Conv2d"; parameter
# gradients are `Module.layer1.0.conv1.Conv2d.parameters_grad.0`.
_MODULE_CALL = re.compile(r"^Module\.(?:(?P<path>.+)\.)?(?P<cls>[^.]+)\."
                          r"(?:forward|backward|parameters_grad)\.\d+$")
_OWN_NODE_KINDS = ("module", "param_grad")   # rows that sit in the tree under their own name
# Characters that could end the <script> block or an HTML comment, and the two line separators
# that older JavaScript parsers treat as newlines.
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                 "\u2028": "\\u2028", "\u2029": "\\u2029"}
_JSON_UNSAFE = re.compile("[<>&\u2028\u2029]")


def write_html(result: CompareResult, path) -> Path:
    """Write `result` as one self-contained HTML file at `path` and return its path.

    `path` may be an existing directory, in which case the file is `report.html` inside it. The
    file is written to a temporary name first and renamed, so a failed write never leaves a
    half-written report in place of an older one.
    """
    if not isinstance(result, CompareResult):
        raise TypeError(f"write_html needs a CompareResult, got {type(result).__name__}")
    path = Path(path)
    if path.is_dir():
        path = path / "report.html"
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise OpdiffError(f"cannot write the HTML report: {parent} is a file, not a directory; "
                          "choose another output path")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OpdiffError(f"cannot create {parent} for the HTML report ({exc.strerror}); "
                          "choose a writable output path") from exc
    page = render_html(result)
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html.tmp", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page)
        os.replace(tmp, path)
    except OSError as exc:
        _remove_quietly(tmp)
        raise OpdiffError(f"cannot write the HTML report {path} ({exc.strerror}); "
                          "check free space and permissions") from exc
    except BaseException:
        _remove_quietly(tmp)
        raise
    log.info("opdiff: wrote %s (%d rows, %.1f MB)", path, len(result.rows), len(page) / 1e6)
    return path


def render_html(result: CompareResult) -> str:
    """The report page as a string (what `write_html` writes)."""
    script = (_ASSETS / "report.js").read_text(encoding="utf-8")
    style = (_ASSETS / "report.css").read_text(encoding="utf-8")
    template = (_ASSETS / "report_template.html").read_text(encoding="utf-8")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    values = {
        "TITLE": html.escape(f"{result.title}: {_culprit_title(result)}"),
        "SCRIPT_HASH": f"sha256-{digest}",
        "STYLE": style,
        "DATA": json_for_script(build_payload(result)),
        "SCRIPT": script,
    }
    # One pass, so text substituted for one placeholder is never scanned for another.
    return re.sub(r"%%([A-Z_]+)%%", lambda m: values[m.group(1)], template)


def json_for_script(obj: Any) -> str:
    """JSON that is safe inside a <script> element: `<`, `>`, `&`, U+2028/2029 are escaped."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return _JSON_UNSAFE.sub(lambda m: _JSON_ESCAPES[m.group(0)], text)


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


def build_payload(result: CompareResult) -> dict:
    """The data the page's script reads: compact row arrays, interned strings, the module tree.

    A row is `[op, target_name, golden_name, role, target_dtype, golden_dtype, target_shape,
    golden_shape, result, accuracy_reached, reason, stack, metrics, target_stats, golden_stats,
    error, scale_error, mode, step, rank]` (the last five only when set). `op` indexes `ops`
    (`[name, index, phase, kind, tree node]`), shapes index `shapes`, stacks index `stacks`, other
    strings index `strings`. A name given as `[tail]` means `<op name>.<tail>`; golden name `1`
    means "same as target". Metrics and statistics are arrays in the order of `metrics` and
    `stat_keys`, rounded for display, with "NaN"/"Infinity"/"-Infinity" for non-finite values.
    """
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
        if divergence is not None and r.op_name == divergence.name:
            culprit_rows.append(i)
        packed.append([
            op, target_name, golden_name, strings(r.role),
            strings(r.target_dtype), strings(r.golden_dtype),
            shape_id(r.target_shape), shape_id(r.golden_shape),
            strings(r.result), strings(r.accuracy_reached or None), strings(r.reason or None),
            stack, None, None, None,    # numbers: filled below, column by column
            # Fields newer CompareResults carry (None on older ones).
            None, None,
            strings(_mode(getattr(r, "mode", None))),
            getattr(r, "step", None),
            getattr(r, "rank", None),
        ])

    digits = [_DIGITS.get(m, 5) for m in metric_names]
    columns = [
        (12, [r.metrics for r in rows], metric_names, digits),
        (13, [r.target_stats for r in rows], stat_keys, [5] * len(stat_keys)),
        (14, [r.golden_stats for r in rows], stat_keys, [5] * len(stat_keys)),
        (15, [{"e": getattr(r, "error", None), "s": getattr(r, "scale_error", None)} for r in rows],
         ["e", "s"], [5, 5]),
    ]
    for col, dicts, keys, places in columns:
        for row, numbers in zip(packed, _number_rows(dicts, keys, places)):
            if col == 15:
                row[15:17] = numbers if numbers is not None else [None, None]
            else:
                row[col] = numbers
    for row in packed:     # trailing nulls of the optional fields are dropped: shorter rows
        while len(row) > _REQUIRED_FIELDS and row[-1] is None:
            row.pop()

    return {
        "version": 1,
        "title": result.title,
        "target": result.target,
        "golden": result.golden,
        "step": result.step,
        "rank": result.rank,
        "counts": {k: _plain(v) for k, v in (result.counts or {}).items()},
        "environment_diff": [{k: _text(e.get(k)) for k in ("key", "target", "golden")}
                             for e in (result.environment_diff or []) if isinstance(e, dict)],
        "pairs": [{str(k): _plain(v) for k, v in p.items()} for p in (result.pairs or [])
                  if isinstance(p, dict)],
        "verdict": _text(getattr(result, "verdict", None)) or None,
        "notes": [_text(n) for n in (getattr(result, "notes", None) or [])],
        "files": {str(k): os.path.basename(str(v)) for k, v in (result.files or {}).items() if v},
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


def _module_tree(result: CompareResult, strings: _Strings) -> tuple[list, dict]:
    """Nodes in pre-order, `[parent, label, class, severity, pass, warning, error, unmatched, end,
    culprit, forward severity, backward severity]`: the subtree of node i is nodes i..end-1;
    severity is 0 pass, 1 unmatched, 2 warning, 3 error (-1: no tensor of that phase); culprit is
    2 on the culprit's module, 1 on its ancestors. Also maps module call names to nodes.

    The tree follows module paths (`layer1.0.conv1`), so the forward and backward calls of one
    module, and every call of a reused module, share one node. Each row counts in the node of its
    enclosing module and in all of that node's ancestors.
    """
    calls: dict[str, tuple[str, str]] = {}      # module call name -> (path, class)
    for r in result.rows:
        name = _tree_name(r)
        if name and name not in calls:
            m = _MODULE_CALL.match(name)
            calls[name] = (m.group("path") or "", m.group("cls")) if m else (name, "")
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
    if row.kind in _OWN_NODE_KINDS and _MODULE_CALL.match(row.op_name or ""):
        return row.op_name
    return row.module


def _divergence(d, culprit_rows: list[int]) -> Optional[dict]:
    if d is None:
        return None
    return {
        "name": _text(d.name), "op": _text(d.op), "phase": _text(d.phase),
        "reason": _text(d.reason), "location": _location(d.location) if d.location else None,
        "metrics": {str(k): _number(v, _DIGITS.get(k, 5)) for k, v in (d.metrics or {}).items()},
        "input_metrics": {str(k): _number(v, _DIGITS.get(k, 5))
                          for k, v in (d.input_metrics or {}).items()},
        "tensor": _text(d.tensor), "module": _text(d.module), "step": d.step, "rank": d.rank,
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


def _number_rows(dicts: list, keys: list[str], digits: list[int]) -> list:
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
            out[i] = [_number(dicts[i].get(k), d) for k, d in zip(keys, digits)]
        return out
    bad = ~np.isfinite(matrix)
    rounded = _round_significant(matrix, np.asarray(digits, dtype=np.float64)).tolist()
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


def _culprit_title(result: CompareResult) -> str:
    d = result.first_divergence
    return f"first divergence at {d.name}" if d is not None else "no divergence"


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
