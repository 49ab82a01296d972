"""The output directory (`-o OUT`): the one owner of what opdiff writes there, and removes.

OUT is the user's directory: opdiff removes only what it wrote there, proven, and never
overwrites a file it did not write. OUT/.opdiff-outputs.json (the manifest) records each entry
opdiff wrote: a file's relative name, inode, size and sha256 (while a run is still writing it,
its inode alone), a folder's inode; it is sealed with an HMAC under a key kept outside OUT
(`outdir/key.py`) and bound to OUT's own inode, so a manifest opdiff did not write for this
folder (planted, copied, or an older opdiff's) proves nothing. The next run into OUT removes a
recorded file only when it is still the same regular file (inode) with that size and hash, and a
recorded folder only when it is the one opdiff made and nothing else is left in it; names are
plain names inside OUT (no `..`, no absolute path) and no symlink is followed. A same-named
file opdiff cannot prove it wrote is an `OutputConflict` (one line, exit 2), and nothing is
overwritten. Two opdiff runs into one OUT take turns: the second waits on OUT/.opdiff-lock (an
flock, so a dead holder's lock is free at once)::

    from opdiff import outdir as outputs      # also opdiff.report.outputs
    with outputs.session("./out", keep=[dump]) as out:   # lock, remove what opdiff wrote last time
        outputs.remember(out, [out / "next.json"])       # declare before writing (a conflict raises)
        with outputs.atomic_open(out / "result.csv", "the CSV") as f:   # recorded with its hash
            f.write("...")
        outputs.make_dir(out / "onnx_dump_1")            # a folder opdiff creates; its files are
                                                         # recorded when the session ends

Files are written to a temporary name and renamed, with the mode the umask gives (0644 under the
usual umask 022), like any file the user's tools write.
"""
from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import IO, Iterable, Iterator, Optional

from ..errors import ConfigError, OpdiffError
from .lock import held, lock, unlock
from .records import (LOCK, MANIFEST, RESERVED, OutputConflict, clean, conflict, file_record,
                      identity, key, load, proven, quietly, read_manifest, same, save_manifest)

log = logging.getLogger("opdiff")


class _Session:
    def __init__(self, out: Path):
        self.out = out
        self.depth = 1
        self.entries: dict[str, dict] = {}
        self.declared: list[str] = []
        self.made: set[str] = set()
        self.new_manifest = False
        self.distrust: Optional[str] = None     # why OUT's earlier manifest proves nothing


_sessions: dict[str, _Session] = {}


@contextlib.contextmanager
def session(out, keep: Iterable = (), fresh: bool = False) -> Iterator[Path]:
    """Hold OUT for one run: create it, wait for any other opdiff writing there, remove what
    opdiff provably wrote there before (except entries that are or hold a path in `keep`, the
    dumps being compared, say) and, when the block ends, record what this run wrote.

    fresh: OUT must be new, empty, or written by opdiff before (the demo); otherwise an
    OutputConflict. A session for the same OUT already open in this process is joined (the
    demo's compare writes into the demo's OUT): nothing is removed then."""
    out = Path(os.fspath(out))
    joined = _sessions.get(key(out)) if out.is_dir() else None
    if joined is not None:
        joined.depth += 1
        try:
            yield out
        finally:
            joined.depth -= 1
        return
    _make_output_dir(out)
    held = lock(out)
    s = _Session(out)
    failed = started = False
    try:
        previous, s.distrust = load(out)
        s.entries = clean(out, previous or {}, keep)
        if fresh and (previous is None or s.distrust is not None):
            others = sorted(n for n in os.listdir(out) if n not in RESERVED)
            if others:
                why = f"; {s.distrust}" if s.distrust else ""
                raise OutputConflict(f"{out} is not empty and was not written by opdiff (it holds "
                                     f"{others[0]}{why}); pass -o a new or empty directory "
                                     f"(nothing was changed)")
        s.new_manifest = previous is None and s.distrust is None
        if s.distrust is None:
            _save(s)              # an untrusted manifest stays until this run writes something
        started = True
        _sessions[key(out)] = s
        yield out
    except BaseException:
        failed = True
        raise
    finally:
        if started:
            _sessions.pop(key(out), None)
        try:
            if started:
                _finish(s)
        except OpdiffError as exc:
            if not failed:
                raise
            log.warning("opdiff: %s", exc)
        finally:
            unlock(out, held)


def remember(out, paths: Iterable) -> None:
    """Declare `paths` (files or folders directly inside `out`, an open session's OUT) as what
    this run writes, before writing them; they are recorded when the session ends. A path that
    exists and that opdiff cannot prove it wrote raises OutputConflict."""
    s = _active(out)
    for p in paths:
        _claim(s, _name_in(s.out, p))
    _save(s)


def make_dir(path) -> Path:
    """Create the folder `path` directly inside an open session's OUT and record it at once (a
    run killed while filling it leaves a folder the next run recognises and never mistakes for
    the user's). An existing folder this run made is returned as it is."""
    path = Path(os.fspath(path))
    s = _active(path.parent)
    name = _name_in(s.out, path)
    if not _claim(s, name):
        os.mkdir(path)
        s.entries[name] = {"type": "dir", **identity(os.lstat(path))}
        _save(s)
    return path


def make_file(path) -> Path:
    """Create the empty file `path` (inside an open session's OUT) and record it at once, like
    `make_dir`; an existing file this run or a kept earlier run wrote is left as it is."""
    path = Path(os.fspath(path))
    s = _active(path.parent)
    name = _name_in(s.out, path)
    if not _claim(s, name):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666))
        s.entries[name] = {"type": "file", **identity(os.lstat(path))}
        _save(s)
    return path


def check_free(out, names: Iterable[str]) -> None:
    """Raise OutputConflict now, before a long run, when OUT holds one of `names` that opdiff
    did not write (read only: nothing is locked or changed). While another opdiff writes OUT its
    manifest lags its files, so nothing is judged then: the session, once it holds the lock,
    raises the same conflict for a file that is not opdiff's."""
    out = Path(os.fspath(out))
    if not out.is_dir():
        return
    s = _sessions.get(key(out))
    if s is None and held(out):
        return
    if s is not None:
        entries, distrust = s.entries, s.distrust
    else:
        found, distrust = load(out)
        entries = found or {}
    for name in names:
        if not os.path.lexists(out / name) or (s is not None and name in s.made):
            continue
        if not proven(out, name, entries.get(name), same_run=s is not None):
            raise conflict(out, name, distrust)


def written(out) -> list[str]:
    """The names (relative to `out`) the manifest records as opdiff's."""
    return sorted(read_manifest(Path(os.fspath(out))) or {})


@contextlib.contextmanager
def atomic_open(path, what: str, newline: str | None = None) -> Iterator[IO[str]]:
    """A text file to write `path` through: a temporary file beside it, renamed over `path` when
    the block ends without error, removed otherwise. Its mode follows the umask. An OSError
    becomes an OpdiffError naming `what` ("the CSV", "the HTML report"). Inside an open
    session's OUT the file is declared first (an OutputConflict when a file of its name is not
    opdiff's) and recorded with its hash once written."""
    path = Path(path)
    s = _sessions.get(key(path.parent))
    if s is not None:
        _claim(s, _name_in(s.out, path))
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    except OSError as exc:
        raise OpdiffError(f"cannot write {what} {path} ({exc.strerror}); choose a writable "
                          "output path") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline=newline) as f:
            if s is not None:       # recorded before a byte is written: a kill leaves it ours
                s.entries[tmp.name] = {"type": "file", **identity(os.fstat(fd))}
                _save(s)
            yield f
        os.replace(tmp, path)
        if s is not None:
            s.entries.pop(tmp.name, None)
            s.entries[path.name] = file_record(path)
            _save(s)
    except OSError as exc:
        _forget_tmp(s, tmp)
        raise OpdiffError(f"cannot write {what} {path} ({exc.strerror}); check free space and "
                          "permissions") from exc
    except BaseException:
        _forget_tmp(s, tmp)
        raise


def atomic_write_text(path, text: str, what: str) -> Path:
    """Write `text` to `path` through `atomic_open`; return the path."""
    with atomic_open(path, what) as f:
        f.write(text)
    return Path(path)


# -- what a session does -------------------------------------------------------------------------
def _make_output_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; pass a directory for the output")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{out}: cannot create the output directory ({exc.strerror})") from None


def _active(out) -> _Session:
    s = _sessions.get(key(out))
    if s is None:
        raise RuntimeError(f"no output session is open for {out} (use outputs.session)")
    return s


def _name_in(out: Path, path) -> str:
    path = Path(os.fspath(path))
    if key(path.parent) != key(out) or path.name in ("", ".", "..") or path.name in RESERVED:
        raise ValueError(f"{path} is not directly inside {out}")
    return path.name


def _claim(s: _Session, name: str) -> bool:
    """Declare `name`; True when it exists and is this run's (or a kept run's), OutputConflict
    when it exists and is not opdiff's."""
    exists = os.path.lexists(s.out / name)
    if name not in s.declared:
        if exists and not proven(s.out, name, s.entries.get(name), same_run=True):
            raise conflict(s.out, name, s.distrust)
        s.declared.append(name)
        if not exists:
            s.made.add(name)        # it appears during this run: this run writes it
        return exists
    if not exists or name in s.made:
        return exists
    if proven(s.out, name, s.entries.get(name), same_run=True):
        return True
    raise conflict(s.out, name, s.distrust)


def _finish(s: _Session) -> None:
    """Record every declared entry as it is now: files with size and hash, folders with every
    file and folder inside them."""
    for name in s.declared:
        try:
            st = os.lstat(s.out / name)
        except FileNotFoundError:
            continue
        rec = s.entries.get(name)
        if rec is not None and not same(st, rec):
            continue          # replaced by something that is not this run's: not ours to record
        if rec is not None and "sha256" in rec and rec["size"] == st.st_size:
            continue          # written through atomic_open: recorded with its hash then
        if stat.S_ISREG(st.st_mode):
            s.entries[name] = file_record(s.out / name)
        elif stat.S_ISDIR(st.st_mode):
            _record_tree(s, name)
    if not s.entries and (s.new_manifest or s.distrust):
        if s.new_manifest:
            quietly(os.unlink, s.out / MANIFEST)     # nothing written (a conflict): leave no trace
        return
    _save(s)


def _record_tree(s: _Session, top: str) -> None:
    s.entries[top] = {"type": "dir", **identity(os.lstat(s.out / top))}
    for root, dirs, files in os.walk(s.out / top):
        rel = Path(root).relative_to(s.out).as_posix()
        for d in dirs:
            st = os.lstat(Path(root) / d)
            if stat.S_ISDIR(st.st_mode):
                s.entries[f"{rel}/{d}"] = {"type": "dir", **identity(st)}
        for f in files:
            p = Path(root) / f
            if stat.S_ISREG(os.lstat(p).st_mode):
                s.entries[f"{rel}/{f}"] = file_record(p)


def _save(s: _Session) -> None:
    save_manifest(s.out, s.entries)


def _forget_tmp(s: Optional[_Session], tmp: Path) -> None:
    quietly(os.unlink, tmp)
    if s is not None and s.entries.pop(tmp.name, None) is not None:
        with contextlib.suppress(OpdiffError):
            _save(s)


__all__ = ["MANIFEST", "LOCK", "OutputConflict", "session", "remember", "make_dir", "make_file",
           "check_free", "written", "atomic_open", "atomic_write_text"]
