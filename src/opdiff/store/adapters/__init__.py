"""Open any dump opdiff understands and present it through the `Dump` interface.

`discover(path)` returns one dump object per step/rank found under `path`. Every object has
`path`, `meta`, `step`, `rank`, `format`, `records()`, `stack(id)`, `tensor(key)` and
`has_tensors`, exactly like `opdiff.store.Dump`, so compare never cares where a dump came from.
"""
from __future__ import annotations

import os
from pathlib import Path

from ...errors import DumpError
from ..reader import find_dumps, open_dump


def discover(path: str | os.PathLike) -> list:
    """All step/rank dumps under path, of any supported format, sorted by (step, rank)."""
    p = Path(path)
    if not p.exists():
        raise DumpError(f"{p}: no such file or directory")
    dumps = [open_dump(d) for d in find_dumps(p)]
    if not dumps:
        raise DumpError(f"{p}: no dump found here (expected records.jsonl under step*/rank*/)")
    return dumps
