"""The manifest of an output directory, and the proof that an entry in it is opdiff's.

OUT/.opdiff-outputs.json records, for each entry opdiff wrote (a plain relative name, "/" between
folders): a file's device, inode, size and sha256 (while a run still writes it, its device and
inode alone); a folder's device and inode. The manifest is sealed (`outdir/key.py`): an HMAC under
a key kept outside OUT, over its entries and OUT's own device and inode, so a manifest planted or
copied into OUT, or left by an older opdiff, proves nothing (`load` says why). `proven` checks an
entry against its record without following a symlink: a file by identity AND content; `clean`
removes what an earlier run provably wrote. Used by `opdiff.outdir`.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from ..errors import ConfigError, OpdiffError
from .key import seal, sealed

log = logging.getLogger("opdiff")

MANIFEST = ".opdiff-outputs.json"
LOCK = ".opdiff-lock"
FORMAT = 3
RESERVED = (MANIFEST, LOCK)
MANIFEST_TMP = re.compile(re.escape(MANIFEST) + r"\.\d+-[0-9a-f]{8}\.tmp")
MAX_MANIFEST = 64 << 20


class OutputConflict(ConfigError):
    """OUT holds a file or folder of a name opdiff must write that opdiff did not write."""


def key(path) -> str:
    """The real path of `path`, as a string (sessions and kept paths are compared by it)."""
    return os.path.realpath(os.fspath(path))


def conflict(out: Path, name: str, distrust: Optional[str] = None) -> OutputConflict:
    why = f" ({distrust})" if distrust else " (or was changed since)"
    return OutputConflict(f"{out / name} exists and was not written by opdiff{why}; it is left "
                          f"as it is: choose another -o or remove it")


def clean(out: Path, previous: dict[str, dict], keep: Iterable) -> dict[str, dict]:
    """Remove what `previous` records and is still provably opdiff's; return the records kept
    (entries that are, hold or lie inside a path in `keep`)."""
    root = key(out)
    kept_rel = []
    for k in keep:
        rel = os.path.relpath(key(k), root)
        if rel != ".." and not rel.startswith("../") and not os.path.isabs(rel):
            kept_rel.append(Path(rel).as_posix())
    carried: dict[str, dict] = {}
    drop = []
    for name, rec in previous.items():
        if any(k == "." or name == k or k.startswith(name + "/") or name.startswith(k + "/")
               for k in kept_rel):
            carried[name] = rec
        else:
            drop.append(name)
    for name in sorted((n for n in drop if previous[n]["type"] == "file"), key=depth,
                       reverse=True):
        with parent(out, name) as at:
            if at is not None and proven_at(at, previous[name]):
                quietly(os.unlink, at[1], dir_fd=at[0])
            elif at is not None and exists_at(at):
                log.warning("opdiff: kept %s: it changed since an earlier opdiff run wrote it",
                            out / name)
    for name in sorted((n for n in drop if previous[n]["type"] == "dir"), key=depth,
                       reverse=True):
        with parent(out, name) as at:
            if at is None or not proven_at(at, previous[name]):
                continue
            try:
                os.rmdir(at[1], dir_fd=at[0])
            except OSError:
                log.warning("opdiff: kept the folder %s from an earlier run: it holds files "
                            "opdiff cannot prove it wrote", out / name)
    for n in os.listdir(out):
        if MANIFEST_TMP.fullmatch(n):
            quietly(os.unlink, out / n)
    return carried


def depth(name: str) -> int:
    return name.count("/")


# -- proof ----------------------------------------------------------------------------------------
def identity(st: os.stat_result) -> dict:
    return {"dev": st.st_dev, "ino": st.st_ino}


def same(st: os.stat_result, rec: dict) -> bool:
    return st.st_dev == rec.get("dev") and st.st_ino == rec.get("ino")


def file_record(path: Path) -> dict:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        return {"type": "file", **identity(st), "size": st.st_size, "sha256": sha256(fd)}
    finally:
        os.close(fd)


def sha256(fd: int) -> str:
    h = hashlib.sha256()
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return h.hexdigest()
        h.update(chunk)


@contextlib.contextmanager
def parent(out: Path, name: str) -> Iterator[Optional[tuple[int, str]]]:
    """(a descriptor of the folder holding `name`, its last part), reached from OUT without
    following a symlink; None when there is no such folder."""
    parts = name.split("/")
    fd = -1
    try:
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError:
        if fd >= 0:
            os.close(fd)
        yield None
        return
    try:
        yield fd, parts[-1]
    finally:
        os.close(fd)


def exists_at(at: tuple[int, str]) -> bool:
    try:
        os.stat(at[1], dir_fd=at[0], follow_symlinks=False)
        return True
    except OSError:
        return False


def proven_at(at: tuple[int, str], rec: dict, same_run: bool = False) -> bool:
    dfd, leaf = at
    try:
        st = os.stat(leaf, dir_fd=dfd, follow_symlinks=False)
        if rec["type"] == "dir":
            return stat.S_ISDIR(st.st_mode) and same(st, rec)
        if not stat.S_ISREG(st.st_mode):
            return False
        if not same(st, rec):
            return False            # identity AND content: a copy of opdiff's bytes is not its file
        if "sha256" not in rec or same_run:
            return True
        if st.st_size != rec["size"]:
            return False
        fd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
        try:
            return sha256(fd) == rec["sha256"]
        finally:
            os.close(fd)
    except OSError:
        return False


def proven(out: Path, name: str, rec: Optional[dict], same_run: bool = False) -> bool:
    if rec is None:
        return False
    with parent(out, name) as at:
        return at is not None and proven_at(at, rec, same_run)


# -- the manifest --------------------------------------------------------------------------------
def read_manifest(out: Path) -> Optional[dict[str, dict]]:
    """The valid records of OUT's manifest; None when there is none, {} when it proves nothing."""
    return load(out)[0]


def load(out: Path) -> tuple[Optional[dict[str, dict]], Optional[str]]:
    """(the valid records of OUT's manifest, None) when this opdiff sealed it for this folder;
    (None, None) when there is none; ({}, why it proves nothing) otherwise. A file of its name
    that is not an opdiff manifest is an OutputConflict."""
    try:
        fd = os.open(out / MANIFEST, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise conflict(out, MANIFEST) from None
        log.warning("opdiff: %s is unreadable; nothing earlier runs wrote is removed", out / MANIFEST)
        return {}, f"{out / MANIFEST} is unreadable"
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise conflict(out, MANIFEST)
            data = json.loads(f.read(MAX_MANIFEST).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or not str(data.get("written_by", "")).startswith("opdiff"):
        raise conflict(out, MANIFEST)
    entries, folder = data.get("entries"), data.get("folder")
    untrusted = (f"{out / MANIFEST} was written by an older opdiff, for another folder or by "
                 f"someone else, and proves nothing")
    if data.get("format") != FORMAT or not isinstance(entries, dict):
        return {}, untrusted
    try:
        here = identity(os.stat(out))
    except OSError:
        return {}, untrusted
    if folder != here or not sealed(here, entries, data.get("mac")):
        return {}, untrusted
    return {n: r for n, r in entries.items() if valid_name(n) and valid_record(r)}, None


def valid_name(name: Any) -> bool:
    if not isinstance(name, str) or "\\" in name or "\x00" in name or name.startswith("/"):
        return False
    parts = name.split("/")
    return parts[0] not in RESERVED and all(p not in ("", ".", "..") for p in parts)


def valid_record(rec: Any) -> bool:
    if not isinstance(rec, dict) or rec.get("type") not in ("file", "dir"):
        return False
    if not all(type(rec.get(k)) is int for k in ("dev", "ino")):
        return False
    if "sha256" in rec:
        return (type(rec.get("size")) is int and isinstance(rec["sha256"], str)
                and re.fullmatch(r"[0-9a-f]{64}", rec["sha256"]) is not None)
    return True


def save_manifest(out: Path, entries: dict[str, dict]) -> None:
    """Write OUT's manifest (through a temporary file renamed over it)."""
    folder = identity(os.stat(out))
    text = json.dumps({"written_by": "opdiff", "format": FORMAT, "folder": folder,
                       "mac": seal(folder, entries), "entries": entries}, indent=1)
    path = out / MANIFEST
    tmp = path.with_name(f"{MANIFEST}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        quietly(os.unlink, tmp)
        raise OpdiffError(f"cannot write the list of opdiff's outputs {path} ({exc.strerror}); "
                          "check free space and permissions") from exc


def quietly(fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except OSError:
        pass
