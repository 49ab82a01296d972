"""Read monitor streams written by opdiff.Monitor: a run is one stream per rank.

    run = read_run("./mon/npu")              # MON_PATH, or one MON_PATH/rank{R} directory
    stream = run.ranks[0]
    stream.steps, stream.series("loss"), stream.series("blocks.7.mlp:fwd_norm")
    stream.modules                           # module names in forward order

A line cut short by a crash (the last one, without its newline) is dropped; anything else that
does not parse raises StreamError with the file and line. Values are float64 arrays with NaN
where nothing was measured; `stream.missing` tells "not measured" from a measured NaN.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import orjson

from ..errors import StreamError
from ..monitor.stream import BINARY, FORMAT, META, METRICS, MISSING_BITS, split_column

log = logging.getLogger("opdiff")

_RANK_DIR = re.compile(r"^rank(\d+)$")
_CHUNK = 512            # lines parsed per orjson call


@dataclass
class Stream:
    """One rank's stream: `values[i, j]` is column `columns[j]` at step `steps[i]`."""

    directory: Path
    rank: int
    meta: dict
    columns: list
    steps: np.ndarray
    values: np.ndarray
    missing: Optional[np.ndarray] = None
    partial_line: bool = False          # the file ended in a line cut short (a killed run)
    _index: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self._index = {c: i for i, c in enumerate(self.columns)}

    def has(self, col: str) -> bool:
        return col in self._index

    def index(self, col: str) -> int:
        return self._index[col]

    def series(self, col: str) -> np.ndarray:
        """The column over all steps (NaN where not measured); all-NaN for an unknown column."""
        i = self._index.get(col)
        if i is None:
            return np.full(len(self.steps), np.nan)
        return self.values[:, i]

    def measured(self, col: str) -> np.ndarray:
        """True where the column holds a measurement (possibly NaN or inf)."""
        i = self._index.get(col)
        if i is None:
            return np.zeros(len(self.steps), dtype=bool)
        return np.ones(len(self.steps), dtype=bool) if self.missing is None else ~self.missing[:, i]

    @property
    def modules(self) -> list:
        """Module names in forward order (from meta.json, else from the column order)."""
        names = [m["name"] for m in self.meta.get("modules") or [] if "name" in m]
        return names or _names_in_columns(self.columns, ("fwd_norm",))

    @property
    def module_types(self) -> dict:
        return {m["name"]: m.get("type") for m in self.meta.get("modules") or [] if "name" in m}

    @property
    def backward_order(self) -> list:
        names = list(self.meta.get("backward_order") or [])
        return names or _names_in_columns(self.columns, ("bwd_norm",))[::-1]

    @property
    def parameters(self) -> list:
        names = [p["name"] for p in self.meta.get("parameters") or [] if "name" in p]
        present = set(_names_in_columns(self.columns, ("norm", "grad_norm")))
        return [n for n in names if n in present] or sorted(present)

    @property
    def compute_dtype(self) -> Optional[str]:
        return self.meta.get("compute_dtype")


@dataclass
class Run:
    """Every rank's stream of one run, by rank."""

    path: Path
    ranks: dict

    @property
    def first(self) -> Stream:
        return self.ranks[min(self.ranks)]


def _names_in_columns(columns, quantities) -> list:
    out, seen = [], set()
    for c in columns:
        name, q = split_column(c)
        if name is not None and q in quantities and name not in seen:
            seen.add(name)
            out.append(name)
    return out


def read_run(path) -> Run:
    """Every rank of the run at `path` (MON_PATH with rank*/ inside, or one rank directory)."""
    root = Path(path)
    if not root.exists():
        raise StreamError(f"{root} does not exist; give the directory passed to opdiff.Monitor")
    if not root.is_dir():
        raise StreamError(f"{root} is a file; give the directory passed to opdiff.Monitor")
    if (root / META).is_file() or (root / METRICS).is_file():
        stream = read_stream(root)
        return Run(root, {stream.rank: stream})
    ranks = {}
    for child in sorted(root.iterdir()):
        m = _RANK_DIR.match(child.name)
        if m and child.is_dir():
            ranks[int(m.group(1))] = read_stream(child, int(m.group(1)))
    if not ranks:
        raise StreamError(f"{root} holds no monitor stream (expected rank*/metrics.csv "
                          f"written by opdiff.Monitor)")
    return Run(root, ranks)


def read_stream(directory, rank: Optional[int] = None) -> Stream:
    """One rank's stream from `directory` (holding meta.json and metrics.csv)."""
    directory = Path(directory)
    meta_path, metrics_path = directory / META, directory / METRICS
    meta = _read_meta(meta_path)
    if not metrics_path.is_file():
        raise StreamError(f"{directory} has no {METRICS}: the monitored run recorded no step")
    with open(metrics_path, "rb") as f:
        head = f.readline()
    if not head.strip():
        raise StreamError(f"{metrics_path} is empty: the monitored run recorded no step")
    columns = head.decode("utf-8", "replace").strip().split(",")
    if columns[0] != "step" or len(columns) < 2:
        raise StreamError(f"{metrics_path}: line 1 is not a monitor header (it must start "
                          f"with 'step,'); is this a file written by opdiff.Monitor?")
    rank = meta.get("rank", rank if rank is not None else 0)
    binary = _read_binary(directory / BINARY, len(columns), metrics_path)
    if binary is not None:
        steps, values, missing, partial = binary
        return Stream(directory, int(rank), meta, columns[1:], steps, values, missing, partial)
    body = metrics_path.read_bytes()[len(head):]
    lines = body.split(b"\n")
    partial = bool(lines) and lines[-1] != b""
    if partial:
        lines.pop()     # cut short by a crash: written up to the kill, not to its end
    elif lines:
        lines.pop()     # the empty string after the last newline
    if not lines:
        raise StreamError(f"{metrics_path} has a header but no complete step yet")
    steps, values, missing = _parse(lines, len(columns), metrics_path)
    return Stream(directory, int(rank), meta, columns[1:], steps, values, missing, partial)


def _last_csv_step(path: Path) -> Optional[int]:
    """The step of the CSV's last complete line, reading only the file's end."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - (1 << 20)))
        tail = f.read()
    lines = tail.split(b"\n")[:-1]      # the last element is after the last newline
    for line in reversed(lines[1:] if len(lines) > 1 else lines):
        field = line.split(b",", 1)[0]
        if field.isdigit():
            return int(field)
    return None


def _read_binary(path: Path, width: int, csv: Path):
    """(steps, values, missing, partial) from metrics.f32, or None to read the CSV instead (no
    binary file, or one that does not end where the CSV does: written by something else)."""
    if not path.is_file():
        return None
    raw = path.read_bytes()
    rows, extra = divmod(len(raw), 4 * width)
    if rows == 0:
        return None
    table = np.frombuffer(raw, dtype="<f4", count=rows * width).reshape(rows, width)
    steps = table[:, 0]
    if not np.all(np.isfinite(steps)) or np.any(np.diff(steps) <= 0):
        return None
    # A row goes to the binary just before its CSV line: at most one row ahead, never behind.
    last = _last_csv_step(csv)
    ahead = last is not None and steps[-1] != last
    if last is None or (ahead and (rows < 2 or steps[-2] != last)):
        return None
    bits = table[:, 1:].view("<u4")
    missing = bits == MISSING_BITS
    values = table[:, 1:]           # a read-only view: nothing downstream writes into a stream
    if values.dtype.byteorder not in ("=", "|") and not np.little_endian:
        values = values.astype(np.float32)
    return (steps.astype(np.int64), values, missing if missing.any() else None,
            bool(extra) or bool(ahead))


def _read_meta(path: Path) -> dict:
    if not path.is_file():
        raise StreamError(f"{path.parent} has no {META}; is it a stream written by opdiff.Monitor?")
    try:
        meta = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise StreamError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise StreamError(f"{path}: not a monitor stream (format is not '{FORMAT}')")
    return meta


def _parse(lines: list, width: int, path: Path):
    """(steps, values, missing or None) from CSV lines; one orjson call per chunk of clean lines."""
    rows: list = []
    missing_rows: dict = {}
    for start in range(0, len(lines), _CHUNK):
        chunk = lines[start:start + _CHUNK]
        joined = b",".join(chunk)
        # nan/inf and empty fields (",," once joined, or at either end) take the slow path.
        clean = b"n" not in joined and b",," not in joined and not joined.endswith(b",") \
            and not joined.startswith(b",") \
            and all(line.count(b",") == width - 1 for line in chunk)
        if clean:
            try:
                flat = np.asarray(orjson.loads(b"[" + joined + b"]"), dtype=np.float64)
            except (orjson.JSONDecodeError, ValueError, TypeError):
                flat = None
            if flat is not None and flat.size == len(chunk) * width:
                rows.append(flat.reshape(len(chunk), width))
                continue
        block = np.empty((len(chunk), width))
        for k, line in enumerate(chunk):
            block[k], miss = _parse_line(line, width, path, start + k + 2)
            if miss is not None:
                missing_rows[start + k] = miss
        rows.append(block)
    table = np.concatenate(rows) if len(rows) > 1 else rows[0]
    missing = None
    if missing_rows:
        missing = np.zeros((len(table), width - 1), dtype=bool)
        for i, miss in missing_rows.items():
            missing[i] = miss[1:]
    steps = table[:, 0]
    if not np.all(np.isfinite(steps)) or np.any(steps != np.round(steps)):
        raise StreamError(f"{path}: the step column holds something that is not a step number")
    # float32 holds every value exactly (the monitor writes float32) in half the memory.
    return steps.astype(np.int64), table[:, 1:].astype(np.float32), missing


def _parse_line(line: bytes, width: int, path: Path, lineno: int):
    fields = line.split(b",")
    if len(fields) != width:
        raise StreamError(f"{path}:{lineno}: {len(fields)} fields where the header has {width}; "
                          f"the stream is corrupt")
    out = np.empty(width)
    miss = None
    for i, f in enumerate(fields):
        if f:
            try:
                out[i] = float(f)
            except ValueError:
                raise StreamError(f"{path}:{lineno}: field {i + 1} is {f[:20]!r}, not a "
                                  f"number; the stream is corrupt") from None
        else:
            if i == 0:
                raise StreamError(f"{path}:{lineno}: a line without its step number; the "
                                  f"stream is corrupt")
            if miss is None:
                miss = np.zeros(width, dtype=bool)
            miss[i] = True
            out[i] = np.nan
    return out, miss
