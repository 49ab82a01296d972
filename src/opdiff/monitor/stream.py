"""The monitor stream on disk: per rank, a CSV of numbers and a JSON file saying what they are.

    MON_PATH/rank{R}/meta.json     format and opdiff version, the monitor's settings, the
                                   environment fingerprint, modules in forward and backward
                                   order with their output dtypes, parameters
    MON_PATH/rank{R}/metrics.csv   a header `step,loss,grad_norm,...,<name>:<quantity>,...`, then
                                   one line per recorded step, appended and flushed
    MON_PATH/rank{R}/metrics.f32   the same rows as raw little-endian float32 (step first), which
                                   opdiff's reader prefers: 10 000 steps of 200 modules parse
                                   in tens of seconds as text and load at once as floats

pandas reads a stream in one call, `pandas.read_csv("mon/npu/rank0/metrics.csv")`; opdiff's own
reader is `opdiff.trend.read_run("mon/npu")`. Values are float32 written as their shortest
round-trip decimal; NaN and inf are `nan`, `inf`, `-inf`; an empty field means "not measured at
this step" (a module that was not called; in metrics.f32 the NaN with payload MISSING_BITS). A
run killed at any moment leaves every row up to the last flush and at most one partial row in
each file, which readers drop.

This module is torch-free: the writer is fed numpy arrays, and the trend reader shares its names.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import BinaryIO, Optional, cast

import numpy as np
import orjson

from ..store.records import json_text, strict_json

FORMAT = "opdiff-monitor"
VERSION = 1
META = "meta.json"
METRICS = "metrics.csv"
BINARY = "metrics.f32"
MISSING_BITS = 0x7FC0DEAD       # a quiet NaN that means "not measured", not a measured NaN

# One value per step, before the per-module and per-parameter columns.
# "lr": the first parameter group's learning rate when the step was recorded (with an optimizer).
STEP_COLUMNS = ("loss", "grad_norm", "loss_scale", "lr", "step_time")
# Per module: its forward output (all floating-point tensors it returns, taken as one vector)
# and the gradient that flows back into that output.
MODULE_QUANTITIES = ("fwd_norm", "fwd_max", "fwd_nan", "fwd_inf", "bwd_norm", "bwd_nan", "bwd_inf")
# Per parameter, after optimizer.step(); the optimizer's state adds "<key>_norm" (exp_avg_norm...).
PARAMETER_QUANTITIES = ("norm", "grad_norm", "update_norm")


def column(name: str, quantity: str) -> str:
    """The CSV column of one module's or parameter's quantity: `blocks.7.mlp:fwd_norm`."""
    return f"{name}:{quantity}"


def split_column(col: str) -> tuple[Optional[str], str]:
    """`"blocks.7.mlp:fwd_norm"` -> ("blocks.7.mlp", "fwd_norm"); `"loss"` -> (None, "loss")."""
    name, sep, quantity = col.rpartition(":")
    return (name, quantity) if sep else (None, col)


def rank_directory(root, rank: int) -> Path:
    return Path(os.fspath(root)) / f"rank{rank}"


def format_line(step: int, values: np.ndarray, missing: Optional[np.ndarray] = None) -> bytes:
    """One CSV line: the step, then `values` as float32 decimals (`missing` ones left empty)."""
    v32 = values.astype(np.float32)
    finite = np.isfinite(v32)
    odd = ~finite if missing is None else (~finite | missing)
    if not odd.any():       # the usual step: one C call formats the whole line
        return b"%d," % step + orjson.dumps(v32, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1] + b"\n"
    tokens = orjson.dumps(np.where(finite, v32, 0), option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")
    for i in np.flatnonzero(odd):
        if missing is not None and missing[i]:
            tokens[i] = b""
        elif math.isnan(v32[i]):
            tokens[i] = b"nan"
        else:
            tokens[i] = b"inf" if v32[i] > 0 else b"-inf"
    return b"%d," % step + b",".join(tokens) + b"\n"


def json_safe(obj):
    """`obj` as strict JSON: non-finite floats as "NaN"/"Infinity"/"-Infinity" (older streams
    wrote "nan"/"inf", which `opdiff.store.records.decode_float` still reads), unknown objects as
    their repr."""
    return strict_json(obj, default=repr)


def read_meta(directory: Path) -> Optional[dict]:
    """A stream's meta.json, or None when there is none (or it is not a monitor's)."""
    try:
        meta = json.loads((directory / META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def write_json_atomic(path: Path, obj) -> None:
    """Write strict JSON so that a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json_text(obj, indent=1, default=repr))
    os.replace(tmp, path)


class StreamWriter:
    """Appends one CSV line per recorded step to `directory/metrics.csv`, flushed every
    `flush_every` lines. The header is written by `open(columns)` at the first recorded step."""

    def __init__(self, directory: Path, flush_every: int = 1):
        self.directory = directory
        self.flush_every = flush_every
        self.columns: Optional[list] = None
        self._file: Optional[BinaryIO] = None
        self._binary: Optional[BinaryIO] = None
        self._unflushed = 0
        self.kept_rows = 0                  # rows of an earlier run kept by reopen()
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def metrics_path(self) -> Path:
        return self.directory / METRICS

    def write_meta(self, meta: dict) -> None:
        write_json_atomic(self.directory / META, meta)

    def open(self, columns: list) -> None:
        self.columns = list(columns)
        self._file = file = open(self.metrics_path, "wb", buffering=1 << 16)
        self._binary = open(self.directory / BINARY, "wb", buffering=1 << 16)
        file.write(("step," + ",".join(self.columns) + "\n").encode())
        file.flush()

    def reopen(self, start: int) -> Optional[list]:
        """Continue the stream already in the directory (a restarted run): drop its rows from
        step `start` on and any row a crash cut short, keep both files at the same rows, and
        append from there. Returns its columns, or None when it has no header yet (then
        `open` starts it as usual)."""
        columns = _header(self.metrics_path)
        if columns is None:
            return None
        width = len(columns) + 1
        offsets = _csv_rows_before(self.metrics_path, start)     # end of header, then each row
        binary = self.directory / BINARY
        n_binary = _binary_rows_before(binary, width, start)
        rows = min(len(offsets) - 1, n_binary)
        with open(self.metrics_path, "r+b") as f:
            f.truncate(offsets[rows])
        with open(binary, "ab") as f:
            f.truncate(rows * 4 * width)
        self.columns = columns
        self._file = open(self.metrics_path, "ab", buffering=1 << 16)
        self._binary = open(binary, "ab", buffering=1 << 16)
        self.kept_rows = rows
        return columns

    def append(self, step: int, values: np.ndarray, missing: Optional[np.ndarray] = None) -> None:
        row = np.empty(len(values) + 1, dtype="<f4")
        row[0] = step
        row[1:] = values
        if missing is not None and missing.any():
            row.view("<u4")[1:][missing] = MISSING_BITS
        cast(BinaryIO, self._binary).write(row.tobytes())     # open() ran at the first step
        cast(BinaryIO, self._file).write(format_line(step, values, missing))
        self._unflushed += 1
        if self._unflushed >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if self._file is not None and self._unflushed:
            cast(BinaryIO, self._binary).flush()   # opened together with _file
            self._file.flush()
            self._unflushed = 0

    def close(self) -> None:
        if self._file is not None:
            try:
                self.flush()
            finally:
                self._file.close()
                cast(BinaryIO, self._binary).close()
                self._file = self._binary = None


def _header(path: Path) -> Optional[list]:
    """The columns of a stream's CSV header (without "step"), None without a complete one."""
    try:
        with open(path, "rb") as f:
            head = f.readline()
    except FileNotFoundError:
        return None
    if not head.endswith(b"\n") or not head.startswith(b"step,"):
        return None
    return head.decode("utf-8").strip().split(",")[1:]


def _csv_rows_before(path: Path, start: int) -> list:
    """Byte offsets: the end of the header, then the end of each complete row before the first
    one at step >= `start` (or the first line that is not a complete row)."""
    offsets = []
    with open(path, "rb") as f:
        pos = len(f.readline())
        offsets.append(pos)
        for line in f:
            field = line.split(b",", 1)[0]
            if not line.endswith(b"\n") or not field.isdigit() or int(field) >= start:
                break
            pos += len(line)
            offsets.append(pos)
    return offsets


def _binary_rows_before(path: Path, width: int, start: int) -> int:
    """How many complete rows of metrics.f32 come before the first at step >= `start`."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return 0
    rows = len(raw) // (4 * width)
    steps = np.frombuffer(raw, dtype="<f4", count=rows * width).reshape(rows, width)[:, 0]
    bad = ~np.isfinite(steps) | (steps >= start)
    return int(np.argmax(bad)) if bad.any() else rows
