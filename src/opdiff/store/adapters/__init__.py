"""Open any dump opdiff understands, each as an `opdiff.store.source.DumpSource`.

`discover(path)` returns one dump object per step/rank found under `path`, whatever tool wrote
it; nothing after discovery asks which tool that was.

Formats, tried in this order, told apart by the files they leave:

- opdiff (`opdiff.store.reader`): `records.jsonl` in `step{S}/rank{R}/`.
- msprobe / mindstudio-probe (`.msprobe`): `dump.json` in `step{S}/rank{R}/` or `proc{pid}/`.
- ptdbg_ascend and torch_npu.hooks (`.legacy`): a JSON-lines `.pkl` (e.g.
  `ptdbg_dump_v4.0/step0/rank0/api_stack_dump.pkl`, `.npy` tensors in the directory named like
  it; torch_npu.hooks' lines carry the tensor data).

Adding a format is one adapter module and one `register_format` line below.

    for dump in discover("./dump/npu"):
        print(dump.format, dump.step, dump.rank, dump.record_count())
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from ...errors import DumpError
from .. import reader
from ..source import DumpFormat, DumpSource, formats, register_format
from . import legacy, msprobe

log = logging.getLogger("opdiff")

register_format(reader.FORMAT)
register_format(msprobe.FORMAT)
register_format(legacy.FORMAT)


def discover(path: str | os.PathLike[str]) -> list[DumpSource]:
    """All step/rank dumps under path, of any registered format, sorted by (step, rank).

    `path` may be a dump root, one step/rank directory, or one index file (`records.jsonl`,
    `dump.json`, a `.pkl`). Raises DumpError when nothing readable is there.
    """
    p = Path(path)
    if not p.exists():
        raise DumpError(f"{p}: no such file or directory")
    if p.is_file():
        fmt = next((f for f in formats() if f.detect(p)), None)
        if fmt is None:
            raise DumpError(f"{p}: not a dump file ({_expected()})")
        return [fmt.open(p)]
    dumps, skipped = [], []
    for fmt, f in _candidates(p):
        try:
            dumps.append(fmt.open(f))
        except DumpError as exc:
            if not fmt.shared_name:
                raise
            # Any other .pkl lying around (a real pickle, some other tool's file) is not ours.
            log.debug("opdiff: skipping %s (%s)", f, exc)
            skipped.append(exc)
    if not dumps:
        if skipped:
            raise skipped[0]
        raise DumpError(f"{p}: no dump found here ({_expected()})")
    return sorted(dumps, key=_order)


def _expected() -> str:
    described = [f.describe for f in formats()]
    if len(described) == 1:
        return f"expected {described[0]}"
    return f"expected {', '.join(described[:-1])} or {described[-1]}"


def _candidates(root: Path) -> list[tuple[DumpFormat, Path]]:
    """(format, index file) under root, skipping directories that only hold tensors."""
    found = []
    # A directory with a step/rank index (opdiff's, msprobe's) is that dump and nothing else.
    known = sorted(formats(), key=lambda f: not f.leaf)
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        skip: set[str] = set()
        for fmt in known:
            hits = sorted(n for n in filenames if fmt.detect(here / n))
            skip.update(fmt.data_dirs(hits))
            if hits and fmt.leaf:
                found.append((fmt, here / hits[0]))
                dirnames[:] = []
                break
            found.extend((fmt, here / n) for n in hits)
        else:
            # Tensor directories can hold thousands of files and never an index: skip them.
            dirnames[:] = sorted(d for d in dirnames if d not in skip)
    return found


def _order(dump: DumpSource) -> tuple[int, int, str]:
    s, r = dump.step, dump.rank
    return (s if s is not None else -1, r if r is not None else -1, str(dump.path))


__all__ = ["discover", "register_format", "DumpFormat", "DumpSource"]
