"""The secret that makes an output directory's manifest opdiff's own: a random key kept outside
every OUT, in the user's state directory, readable by the user alone.

A manifest lists what opdiff may remove from OUT. Anyone who can write into OUT (a shared folder,
an unpacked archive) could plant one naming the user's files by their size, sha256 or inode (all
known without reading them), so a manifest proves something only when it carries an HMAC under
this key, bound to OUT's own identity (`seal`, `sealed`). The key is
`$XDG_STATE_HOME/opdiff/outputs.key` (default `~/.local/state/opdiff/outputs.key`), else, where
that cannot be kept, `<tempdir>/opdiff-<uid>/outputs.key`; a folder or key that is not the
user's own and private (another owner, group- or world-writable, a symlink, not 32 bytes) is never
used. Without a key manifests are written unsealed: nothing an earlier run wrote is removed, and a
file of a name opdiff writes is refused rather than replaced.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Iterator, Optional

log = logging.getLogger("opdiff")

KEY_NAME = "outputs.key"
KEY_BYTES = 32
_keys: dict[tuple[str, ...], Optional[bytes]] = {}


def seal(folder: dict, entries: dict) -> Optional[str]:
    """The HMAC of a manifest's `folder` identity and `entries`; None without a key."""
    key = secret()
    if key is None:
        return None
    return hmac.new(key, _canonical(folder, entries), hashlib.sha256).hexdigest()


def sealed(folder: dict, entries: dict, mac: object) -> bool:
    """Whether `mac` is this user's seal over `folder` and `entries`."""
    want = seal(folder, entries)
    return isinstance(mac, str) and want is not None and hmac.compare_digest(want, mac)


def secret() -> Optional[bytes]:
    """This user's key (created once, 0600), or None where none can be kept safely."""
    places = tuple(str(p) for p in _places())
    if places not in _keys:
        _keys[places] = next((k for k in map(_key_in, map(Path, places)) if k is not None), None)
        if _keys[places] is None:
            log.warning("opdiff: cannot keep its key in %s; output directories are not reused "
                        "(nothing earlier runs wrote there is removed)", " or ".join(places))
    return _keys[places]


def _canonical(folder: dict, entries: dict) -> bytes:
    return json.dumps({"folder": folder, "entries": entries}, sort_keys=True,
                      separators=(",", ":")).encode()


def _places() -> Iterator[Path]:
    state = os.environ.get("XDG_STATE_HOME", "")
    if os.path.isabs(state):
        yield Path(state) / "opdiff"
    else:
        with contextlib.suppress(RuntimeError, KeyError):
            yield Path.home() / ".local" / "state" / "opdiff"
    yield Path(tempfile.gettempdir()) / f"opdiff-{_uid()}"


def _uid() -> int:
    return os.getuid() if hasattr(os, "getuid") else -1


def _private(st: os.stat_result, kind) -> bool:
    return (kind(st.st_mode) and (_uid() < 0 or st.st_uid == _uid())
            and not st.st_mode & (0o022 if kind is stat.S_ISDIR else 0o077))


def _key_in(folder: Path) -> Optional[bytes]:
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if not _private(os.lstat(folder), stat.S_ISDIR):
            return None
        path = folder / KEY_NAME
        if not os.path.lexists(path):
            _create(path)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not _private(st, stat.S_ISREG) or st.st_size != KEY_BYTES:
                return None
            key = os.read(fd, KEY_BYTES)
        finally:
            os.close(fd)
        return key if len(key) == KEY_BYTES else None
    except OSError:
        return None


def _create(path: Path) -> None:
    """Write a new key beside `path` and link it in: two processes at once agree on one key."""
    tmp = path.with_name(f".{KEY_NAME}.{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secrets.token_bytes(KEY_BYTES))
        os.fsync(fd)
        os.close(fd)
        fd = -1
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
