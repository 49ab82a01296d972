"""Reading a dump's files as untrusted input: every reader of every format opens them here.

A dump is data someone else may have made (a colleague's, a CI artifact, a bug report), so
nothing in it is trusted (SECURITY.md):

- `open_file` opens only a regular file, and only one that lies inside the dump's directory once
  symlinks are resolved: a `records.jsonl` that is a symlink to `/dev/zero` or to a file outside
  the dump, a FIFO (whose open and read would wait forever), a device or a directory is refused
  with a one-line `DumpError` before a byte is read.
- `lines` reads JSON lines with a length limit (`MAX_LINE_BYTES`): a file without newlines is
  never read whole into memory.
- `parse` decodes one JSON value, refusing nesting deeper than `MAX_DEPTH` (Python's parser
  would die of recursion at about 1000 levels, and every walker of records after it earlier).

    with open_file(path, root=dump_dir) as f:
        for number, raw, last in lines(f, path):
            record = parse(raw)       # ValueError: not JSON / not UTF-8; TooDeep: nested too deep
"""
from __future__ import annotations

import io
import json
import os
import stat
from pathlib import Path
from typing import IO, Any, Iterator, Optional

from ..errors import DumpError

MAX_LINE_BYTES = 16 << 20    # one JSON line of a dump (a record is a few KB)
MAX_DEPTH = 100              # arrays/objects inside one another (a record nests about 6 deep)

_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
          | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


class TooDeep(DumpError, ValueError):
    """A JSON value nested deeper than MAX_DEPTH."""


class UnreadableTensor(ValueError):
    """One saved tensor of a dump cannot be loaded (broken, or not a tensor: a pickle that
    would run code, say). Not a DumpError: the compare goes on with that tensor's statistics."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _inside(real: str, root: str) -> bool:
    try:
        return os.path.commonpath([real, root]) == root
    except ValueError:       # different drives
        return False


def resolve(path: str | os.PathLike[str], root: Optional[str | os.PathLike[str]] = None) -> str:
    """The real path of a dump file that may be read: a regular file, inside `root` (itself
    resolved) when given. Raises DumpError (FileNotFoundError's words when it is missing)."""
    real = os.path.realpath(path)
    if root is not None and not _inside(real, os.path.realpath(root)):
        raise DumpError(f"{path}: is a link to {real}, outside the dump; opdiff reads only files "
                        "inside a dump")
    try:
        mode = os.stat(real).st_mode
    except OSError as exc:
        raise DumpError(f"{path}: cannot read ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        raise DumpError(f"{path}: is {_kind(mode)}, not a regular file; a dump holds only "
                        "regular files")
    return real


def is_file(path: str | os.PathLike[str], root: Optional[str | os.PathLike[str]] = None) -> bool:
    """`path` exists and `open_file` would open it (no error raised)."""
    try:
        resolve(path, root)
    except DumpError:
        return False
    return True


def open_file(path: str | os.PathLike[str],
              root: Optional[str | os.PathLike[str]] = None) -> io.BufferedReader:
    """Open a dump file for binary reading, refusing what is not a regular file inside `root`
    (see the module's notes). Never blocks: a FIFO swapped in after the check opens without
    waiting (O_NONBLOCK) and is refused by the check of what was opened."""
    real = resolve(path, root)
    try:
        fd = os.open(real, _FLAGS)
    except OSError as exc:
        raise DumpError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise DumpError(f"{path}: is {_kind(mode)}, not a regular file; a dump holds only "
                            "regular files")
        return io.open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class UnreadableText(ValueError):
    """A user's small text file (`--map`, `--layout`) cannot be read: `problem` says why, in
    words; `too_large` when it is over its limit."""

    def __init__(self, problem: str, too_large: bool = False):
        super().__init__(problem)
        self.problem, self.too_large = problem, too_large


def read_text(path: str | os.PathLike[str], max_bytes: int) -> str:
    """A user's small text file as UTF-8 text: a regular file only, opened without waiting (a
    FIFO or /dev/zero is refused), at most `max_bytes`; `UnreadableText` otherwise."""
    try:
        with open_file(path) as f:
            raw = f.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise UnreadableText(f"larger than {max_bytes >> 20} MiB", too_large=True)
        return raw.decode("utf-8")
    except DumpError as e:
        raise UnreadableText(str(e).split(": ", 1)[-1].replace(
            "; a dump holds only regular files", "")) from None
    except (OSError, UnicodeDecodeError) as e:
        raise UnreadableText(str(e)) from None


def lines(f: IO[bytes], path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, raw bytes, is the file's last line) of a JSON-lines file; DumpError for a
    line longer than MAX_LINE_BYTES."""
    number, raw = 0, f.readline(MAX_LINE_BYTES + 1)
    while raw:
        number += 1
        if len(raw) > MAX_LINE_BYTES:
            raise DumpError(f"{path}: line {number} is longer than {MAX_LINE_BYTES >> 20} MiB; "
                            "not a dump file opdiff wrote, or corrupt")
        following = f.readline(MAX_LINE_BYTES + 1)
        yield number, raw, not following
        raw = following


def parse(raw: bytes | str) -> Any:
    """One JSON value (bare NaN/Infinity accepted, as msprobe writes them).

    Raises ValueError (json.JSONDecodeError, UnicodeDecodeError) for what is not JSON, and
    TooDeep (a DumpError and a ValueError) for nesting deeper than MAX_DEPTH."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise TooDeep(f"a JSON value nested more than {MAX_DEPTH} deep") from None
    if _openings(raw) > MAX_DEPTH and depth(value) > MAX_DEPTH:
        raise TooDeep(f"a JSON value nested more than {MAX_DEPTH} deep")
    return value


def _openings(raw: bytes | str) -> int:
    """An upper bound on the nesting: how many arrays and objects open (cheap, in C)."""
    if isinstance(raw, str):
        return raw.count("[") + raw.count("{")
    return raw.count(b"[") + raw.count(b"{")


def depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deep arrays and objects nest in a parsed JSON value (stops counting past `limit`),
    without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if level > deepest:
            deepest = level
            if deepest > limit:
                return deepest
        todo.extend((c, level + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def load(path: str | os.PathLike[str], root: Optional[str | os.PathLike[str]] = None,
         max_bytes: Optional[int] = None) -> Any:
    """A whole JSON file, read through `open_file` and `parse` (at most `max_bytes` of it: a
    longer file is a DumpError). Raises DumpError."""
    with open_file(path, root) as f:
        data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:
        raise DumpError(f"{path}: larger than {max_bytes >> 20} MiB; not a dump file opdiff "
                        "wrote, or corrupt")
    try:
        return parse(data)
    except TooDeep as exc:
        raise DumpError(f"{path}: {exc}; not a dump file, or corrupt") from None
    except json.JSONDecodeError as exc:
        raise DumpError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); the file "
                        "is truncated or corrupt") from None
    except UnicodeDecodeError:
        raise DumpError(f"{path}: not UTF-8 text; the file is corrupt") from None


def within(path: Path, root: Path) -> bool:
    """`path` lies inside `root` once both are resolved (symlinks followed)."""
    return _inside(os.path.realpath(path), os.path.realpath(root))


__all__ = ["MAX_LINE_BYTES", "MAX_DEPTH", "TooDeep", "UnreadableTensor", "resolve", "is_file", "open_file", "lines",
           "parse", "depth", "load", "within"]
