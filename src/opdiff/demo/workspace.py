"""The demo's output directory: made fresh for every demo, never at the cost of a user's files.

A directory the demo writes holds a small marker file listing what the demo put there. The next
demo into the same directory removes exactly those entries and nothing else; a non-empty
directory without the marker is refused.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from .. import __version__
from ..errors import ConfigError

log = logging.getLogger("opdiff")

MARKER = ".opdiff-demo.json"


def prepare(output) -> Path:
    """Make `output` ready for a demo: create it, or clear a previous demo's files out of it.

    Raises ConfigError when `output` is a file, or a non-empty directory the demo did not write.
    """
    out = Path(os.fspath(output))
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; pass -o a new or empty directory for the demo")
    if out.is_dir() and any(out.iterdir()):
        marker = out / MARKER
        if not marker.is_file():
            raise ConfigError(f"{out} is not empty and was not written by 'opdiff demo'; pass -o "
                              f"a new or empty directory (nothing was changed)")
        _remove_previous(out, _created(marker))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{out}: cannot create the demo directory ({exc.strerror}); pass -o "
                          f"a writable path") from None
    _write_marker(out, [])
    return out


def record_created(out: Path, before: set) -> list:
    """List in the marker every entry of `out` that was not there before the demo ran."""
    created = sorted(p.name for p in out.iterdir() if p.name not in before and p.name != MARKER)
    _write_marker(out, created)
    return created


def _created(marker: Path) -> list:
    try:
        names = json.loads(marker.read_text()).get("created", [])
    except (OSError, ValueError, AttributeError):
        names = []
    # Only plain names of entries directly inside the directory: a tampered marker cannot reach out.
    return [n for n in names if isinstance(n, str) and n and n not in (".", "..")
            and os.sep not in n and (os.altsep is None or os.altsep not in n)]


def _remove_previous(out: Path, names: list) -> None:
    for name in names:
        path = out / name
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
    log.info("opdiff: replaced the previous demo in %s", out)


def _write_marker(out: Path, created: list) -> None:
    text = json.dumps({"written_by": "opdiff demo", "opdiff": __version__, "created": created},
                      indent=1)
    (out / MARKER).write_text(text + "\n")
