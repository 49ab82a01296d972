"""Files the explain commands write for the user: the next capture's config, the skill."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import ConfigError


def write_new(path: Path, text: str, what: str, force: bool = False) -> bool:
    """Write `text` at `path` unless a different file is there (nothing of the user's is
    lost: a ConfigError then, unless `force`). False when the same text was there already."""
    if path.is_dir():
        raise ConfigError(f"{path} is a directory; name a file for the {what}")
    if path.exists():
        try:
            same = path.read_text(encoding="utf-8") == text
        except (OSError, UnicodeDecodeError):
            same = False
        if same:
            return False
        if not force:
            raise ConfigError(f"{path} exists and is not this {what}; remove it or name another file")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return True


def write_config(chain: dict[str, Any], path: str) -> Path:
    """Write the chain's next capture config (msprobe's config.json) at `path`."""
    nxt = chain.get("next") or {}
    config = nxt.get("config")
    if not config:
        raise ConfigError(f"no capture to make: the next step is {nxt.get('action', 'none')} "
                          f"({nxt.get('why', '')})")
    out = Path(path)
    write_new(out, json.dumps(config, indent=2) + "\n", "capture config")
    return out


__all__ = ["write_config", "write_new"]
