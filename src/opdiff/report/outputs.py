"""The output directory (`-o OUT`): what opdiff writes there, and how.

Every command that writes into OUT asks here, so that a reused OUT never mixes two runs: stale
timestamped CSVs or `onnx_dump_*` folders beside a fresh summary.json would be read as one
result. opdiff keeps a small manifest, OUT/.opdiff-outputs.json, of the names it wrote; the next
run removes exactly those and nothing else (the user's own files in OUT stay)::

    from opdiff.report import outputs
    out = outputs.prepare("./out")                # create OUT, remove what opdiff wrote last time
    outputs.remember(out, [out / "result.csv"])   # before writing: an interrupted run is cleaned too
    with outputs.atomic_open(out / "result.csv", "the CSV") as f:
        f.write("...")

Files are written to a temporary name and renamed, with the mode the umask gives (0644 under the
usual umask 022), like any file the user's tools write.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
from pathlib import Path
from typing import IO, Iterable, Iterator

from ..errors import ConfigError, OpdiffError

log = logging.getLogger("opdiff")

MANIFEST = ".opdiff-outputs.json"


def prepare(out, keep: Iterable = ()) -> Path:
    """Create the directory `out` (a ConfigError when that cannot be) and remove what opdiff
    wrote there before; return it as a Path.

    Only names opdiff recorded are removed: those in the manifest, or, in a directory written
    before the manifest existed, the files listed under "files" in its summary.json. An entry
    that is or holds a path in `keep` (the dumps being compared, say) is left alone.
    """
    out = Path(os.fspath(out))
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; pass a directory for the output")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{out}: cannot create the output directory ({exc.strerror})") from None
    kept = [Path(os.path.abspath(os.fspath(k))) for k in keep]
    for name in _previous(out):
        entry = out / name
        here = Path(os.path.abspath(entry))
        if any(k == here or here in k.parents for k in kept):
            continue
        _remove(entry)
    _write_manifest(out, [])
    return out


def remember(out, paths: Iterable) -> None:
    """Add `paths` (files or folders directly inside `out`) to the manifest of what opdiff wrote
    there. Call it before writing them, so a run interrupted half-way is cleaned up too."""
    out = Path(os.fspath(out))
    names = [n for n in _manifest(out) or [] if os.path.lexists(out / n)]
    for p in paths:
        p = Path(os.fspath(p))
        if os.path.abspath(p.parent) != os.path.abspath(out):
            raise ValueError(f"{p} is not directly inside {out}")
        if p.name not in names:
            names.append(p.name)
    _write_manifest(out, names)


@contextlib.contextmanager
def atomic_open(path, what: str, newline: str | None = None) -> Iterator[IO[str]]:
    """A text file to write `path` through: a temporary file beside it, renamed over `path` when
    the block ends without error, removed otherwise. Its mode follows the umask. An OSError
    becomes an OpdiffError naming `what` ("the CSV", "the HTML report")."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise OpdiffError(f"cannot write {what} {path} ({exc.strerror}); choose a writable "
                          "output path") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline=newline) as f:
            yield f
        os.replace(tmp, path)
    except OSError as exc:
        _unlink_quietly(tmp)
        raise OpdiffError(f"cannot write {what} {path} ({exc.strerror}); check free space and "
                          "permissions") from exc
    except BaseException:
        _unlink_quietly(tmp)
        raise


def atomic_write_text(path, text: str, what: str) -> Path:
    """Write `text` to `path` through `atomic_open`; return the path."""
    with atomic_open(path, what) as f:
        f.write(text)
    return Path(path)


def _previous(out: Path) -> list[str]:
    names = _manifest(out)
    if names is not None:
        return names
    # A directory from an opdiff without the manifest: its summary.json lists what it wrote.
    try:
        files = json.loads((out / "summary.json").read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(files, dict):
        return []
    return [os.path.basename(str(p)) for p in files.values()
            if isinstance(p, str) and (out / os.path.basename(p)).is_file()]


def _manifest(out: Path) -> list[str] | None:
    """The names in the manifest (only plain names: nothing outside `out`); None without one."""
    try:
        data = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        log.warning("opdiff: %s is unreadable; nothing earlier runs wrote is removed", out / MANIFEST)
        return []
    names = data.get("written") if isinstance(data, dict) else None
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and n not in ("", ".", "..", MANIFEST)
            and "/" not in n and "\\" not in n]


def _write_manifest(out: Path, names: list[str]) -> None:
    text = json.dumps({"written_by": "opdiff", "written": names}, indent=1)
    atomic_write_text(out / MANIFEST, text + "\n", "the list of opdiff's outputs")


def _remove(entry: Path) -> None:
    try:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif os.path.lexists(entry):
            entry.unlink()
    except OSError as exc:
        log.warning("opdiff: could not remove %s from an earlier run (%s)", entry, exc.strerror)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


__all__ = ["MANIFEST", "prepare", "remember", "atomic_open", "atomic_write_text"]
