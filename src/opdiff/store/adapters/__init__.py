"""Open any dump opdiff understands and present it through the `Dump` interface.

`discover(path)` returns one dump object per step/rank found under `path`. Every object has
`path`, `meta`, `step`, `rank`, `format`, `records()`, `stack(id)`, `tensor(key)` and
`has_tensors`, exactly like `opdiff.store.Dump`, so compare never cares where a dump came from.

Formats, told apart by the files they leave:

- opdiff (`format == "opdiff"`): `records.jsonl` in `step{S}/rank{R}/`.
- msprobe / mindstudio-probe (`"msprobe"`): `dump.json` in `step{S}/rank{R}/` or `proc{pid}/`.
- ptdbg_ascend (`"ptdbg_ascend"`): a JSON-lines `.pkl` (e.g. `ptdbg_dump_v4.0/step0/rank0/
  api_stack_dump.pkl`) with `.npy` tensors in the directory named like the `.pkl`.
- torch_npu.hooks (`"torch_npu_hooks"`): a JSON-lines `.pkl` whose lines carry the tensor data.

    for dump in discover("./dump/npu"):
        print(dump.format, dump.step, dump.rank, sum(1 for _ in dump.records()))
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from ...errors import DumpError
from .. import layout
from ..reader import open_dump
from .legacy import open_pkl
from .msprobe import DUMP_JSON, open_msprobe

log = logging.getLogger("opdiff")

_EXPECTED = ("expected an opdiff dump (step*/rank*/records.jsonl), an msprobe dump "
             "(step*/rank*/dump.json) or a ptdbg_ascend / torch_npu.hooks .pkl")


def discover(path: str | os.PathLike) -> list:
    """All step/rank dumps under path, of any supported format, sorted by (step, rank).

    `path` may be a dump root, one step/rank directory, or one file (`records.jsonl`,
    `dump.json`, a `.pkl`). Raises DumpError when nothing readable is there.
    """
    p = Path(path)
    if not p.exists():
        raise DumpError(f"{p}: no such file or directory")
    if p.is_file():
        return [_open_file(p)]
    dumps, skipped = [], []
    for f in _candidates(p):
        try:
            dumps.append(_open_dir_entry(f))
        except DumpError as exc:
            if f.suffix != ".pkl":
                raise
            # Any other .pkl lying around (a real pickle, some other tool's file) is not ours.
            log.debug("opdiff: skipping %s (%s)", f, exc)
            skipped.append(exc)
    if not dumps:
        if skipped:
            raise skipped[0]
        raise DumpError(f"{p}: no dump found here ({_EXPECTED})")
    return sorted(dumps, key=_order)


def _open_file(p: Path):
    if p.name == layout.RECORDS:
        return open_dump(p.parent)
    if p.name == DUMP_JSON:
        return open_msprobe(p.parent)
    if p.suffix == ".pkl":
        return open_pkl(p)
    raise DumpError(f"{p}: not a dump file ({_EXPECTED})")


def _open_dir_entry(f: Path):
    if f.name == layout.RECORDS:
        return open_dump(f.parent)
    if f.name == DUMP_JSON:
        return open_msprobe(f.parent)
    return open_pkl(f)


def _candidates(root: Path) -> list[Path]:
    """Index files under root, skipping directories that only hold tensors."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        names = set(filenames)
        if layout.RECORDS in names:
            found.append(Path(dirpath) / layout.RECORDS)
            dirnames[:] = []            # an opdiff step/rank directory: nothing more below
            continue
        if DUMP_JSON in names:
            found.append(Path(dirpath) / DUMP_JSON)
            dirnames[:] = []
            continue
        pkls = sorted(n for n in names if n.endswith(".pkl"))
        found.extend(Path(dirpath) / n for n in pkls)
        # Tensor directories can hold thousands of files and never an index: skip them
        # (ptdbg_ascend keeps a .pkl's tensors in the directory named like it).
        skip = {layout.TENSORS, "dump_tensor_data", *(n[:-4] for n in pkls)}
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
    return found


def _order(dump) -> tuple:
    s, r = dump.step, dump.rank
    return (s if s is not None else -1, r if r is not None else -1, str(dump.path))
