"""The OS boundary every byte of a dump crosses, and the mark a step leaves until it is closed.

`RawFile` writes through `os.write`/`os.pwrite` only (no hidden buffer that fails later, at
close), knows how many bytes are on disk, and can cut a failed append back to its last whole
line. `Unfinished` is `unfinished.json` in a step/rank directory: created, at its full size,
before anything else of the step, overwritten in place as the step goes on, and removed when the
step is closed cleanly. Overwriting bytes already allocated needs no free space, so even a full
disk leaves the reason behind:

    {"state": "writing"}                               the step is open (or was killed)
    {"state": "stopped", "records": N}                 whole at stop(): N records (step() not called yet)
    {"state": "disk full", "records": N, "last_record": name, "error": "..."}   cut at record N
    {"state": "write failed", ...}                     the same, for another write error
    {"state": "raised", "error": "ValueError: ..."}    the program ended on this exception
    {"state": "exited"}                                the program ended without closing the step

The last two are written as the process exits (`atexit`) over a step still "writing": a run
that raised is said as such, not as killed.

`unfinished(path)` reads it back (for the reader): None for a step closed cleanly.
"""
from __future__ import annotations

import atexit
import errno
import json
import os
import sys
from pathlib import Path
from typing import Any

from . import layout

_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
MARK_BYTES = 4096


def disk_full(exc: BaseException | None) -> bool:
    """Is `exc` a full disk (or quota, or a file grown past the file system's limit)?"""
    return isinstance(exc, OSError) and exc.errno in _FULL


class RawFile:
    """A file written with os.write: appends (`write`) and writes in place (`pwrite`).

    `buffer`: small writes are gathered up to this many bytes before they go to the OS (0: each
    write goes at once); `size` counts what reached the OS."""

    def __init__(self, path: Path, append: bool, buffer: int = 0):
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        self.path = path
        self.fd: int | None = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
        self.size = os.fstat(self.fd).st_size if append else 0
        self.buffer = buffer
        self._pending = bytearray()

    def write(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        if len(view) < self.buffer:
            self._pending += view
            if len(self._pending) >= self.buffer:
                self.flush()
            return
        self.flush()
        self._write_all(view)

    def flush(self) -> None:
        if self._pending:
            data, self._pending = self._pending, bytearray()
            self._write_all(memoryview(data))

    def _write_all(self, view: memoryview) -> None:
        assert self.fd is not None
        while len(view):
            n = os.write(self.fd, view)
            self.size += n
            view = view[n:]

    def pwrite(self, data: bytes, offset: int) -> None:
        assert self.fd is not None
        view = memoryview(data)
        while len(view):
            n = os.pwrite(self.fd, view, offset)
            view, offset = view[n:], offset + n

    def seek_end(self, offset: int) -> None:
        """Go on appending at `offset` (the gap reads as zeros)."""
        assert self.fd is not None
        self.flush()
        os.lseek(self.fd, offset, os.SEEK_SET)
        self.size = offset

    def truncate(self, size: int) -> None:
        """Cut the file back to `size` bytes (what a failed append left after it goes; freeing
        space needs none)."""
        self._pending = bytearray()
        if self.fd is not None:
            os.ftruncate(self.fd, size)
            os.lseek(self.fd, size, os.SEEK_SET)
            self.size = size

    def close(self) -> None:
        """Flush and close (the descriptor is closed even when the flush fails)."""
        try:
            self.flush()
        finally:
            if self.fd is not None:
                fd, self.fd = self.fd, None
                os.close(fd)


def write_replacing(path: Path, data: bytes) -> None:
    """Write a whole file under a temporary name, then rename it into place (nothing is left
    behind when the write fails)."""
    tmp = path.with_name(path.name + ".tmp")
    f = RawFile(tmp, append=False)
    try:
        f.write(data)
        f.close()
    except BaseException:
        f.close()
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


class Unfinished:
    """The step's `unfinished.json` (see the module docstring)."""

    def __init__(self, directory: Path):
        self.path = directory / layout.UNFINISHED
        self.file = RawFile(self.path, append=False)
        try:
            self.file.write(_padded({"state": "writing"}))
        except BaseException:
            self.file.close()
            self.path.unlink()
            raise
        self.state, self.pid = "writing", os.getpid()
        _open[id(self)] = self

    def set(self, state: dict[str, Any]) -> bool:
        """Overwrite the mark in place; False when even that failed."""
        try:
            self.file.pwrite(_padded(state), 0)
            self.state = str(state.get("state"))
            return True
        except OSError:
            return False

    def remove(self) -> None:
        """The step was closed cleanly: no mark."""
        _open.pop(id(self), None)
        try:
            self.file.close()
        finally:
            self.path.unlink(missing_ok=True)

    def keep(self) -> None:
        """The step was cut: the mark stays."""
        _open.pop(id(self), None)
        try:
            self.file.close()
        except OSError:
            pass


_open: dict[int, Unfinished] = {}       # this process's steps not closed yet


@atexit.register
def _program_ended() -> None:
    """The process exits with steps still "writing": it raised (the exception Python printed,
    `sys.last_value`), or it ended without closing them. A step whole at stop() is left so; a
    forked child (it inherits the marks) touches none of its parent's."""
    exc = getattr(sys, "last_value", None)
    for mark in list(_open.values()):
        if mark.pid != os.getpid() or mark.state != "writing":
            continue
        mark.set({"state": "raised", "error": f"{type(exc).__name__}: {exc}"} if exc is not None
                 else {"state": "exited"})


def _padded(state: dict[str, Any]) -> bytes:
    for limit in (300, 100, 20):        # a long record name or message is shortened to fit
        short = {k: v[:limit] if isinstance(v, str) else v for k, v in state.items()}
        text = json.dumps(short, allow_nan=False).encode()
        if len(text) < MARK_BYTES:
            return text + b" " * (MARK_BYTES - 1 - len(text)) + b"\n"
    raise ValueError("unfinished mark too long")


def unfinished(directory: Path) -> dict[str, Any] | None:
    """The mark a step left (see the module docstring); None when it was closed cleanly. An
    unreadable mark reads as {"state": "writing"}: the step was not closed."""
    path = directory / layout.UNFINISHED
    if not path.is_file() or path.is_symlink():
        return None
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(MARK_BYTES))
    except (OSError, ValueError):
        return {"state": "writing"}
    return data if isinstance(data, dict) else {"state": "writing"}
