"""One opdiff at a time in an output directory: an flock on OUT/.opdiff-lock.

A second run waits (saying so once); a dead holder holds nothing (the kernel drops its flock), so
a lock file left by a killed run is taken over at once. The holder removes the file while still
holding it; a waiter that then finds the path gone or replaced locks the new one.
"""
from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Optional

from .records import LOCK, OutputConflict, identity, same, quietly

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("opdiff")


def lock(out: Path) -> Optional[int]:
    """An flock on OUT/.opdiff-lock, waited for when another process holds it (a dead process
    holds none). None when the file system cannot lock (a warning)."""
    if fcntl is None:
        return None
    path, waited = out / LOCK, False
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            raise OutputConflict(f"cannot lock {path} ({exc.strerror}); remove it if it is "
                                 f"not opdiff's, or choose another -o") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not waited:
                    holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
                    log.warning("opdiff: %s is being written by another opdiff (%s); waiting "
                                "for it to finish", out, holder or "another process")
                    waited = True
                fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                log.warning("opdiff: cannot lock %s (%s); do not run two opdiff into it at once",
                            out, exc.strerror)
                return None
            raise
        try:
            current = same(os.stat(path, follow_symlinks=False), identity(os.fstat(fd)))
        except FileNotFoundError:
            current = False
        if not current:             # the holder removed the file as it finished: lock the new one
            os.close(fd)
            continue
        content = os.pread(fd, 64, 0).decode("ascii", "replace")
        if content and not content.startswith("opdiff "):
            os.close(fd)
            raise OutputConflict(f"{path} is not opdiff's lock file; remove it or choose another -o")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"opdiff pid {os.getpid()}\n".encode(), 0)
        return fd


def held(out: Path) -> bool:
    """Whether another process holds OUT's lock now (read only: no lock file is created)."""
    if fcntl is None:
        return False
    try:
        fd = os.open(out / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)          # closing drops the shared lock taken above


def unlock(out: Path, fd: Optional[int]) -> None:
    if fd is None:
        return
    quietly(os.unlink, out / LOCK)     # while still locked: a waiter then locks a fresh file
    os.close(fd)
