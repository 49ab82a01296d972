"""Read a dump lazily: `open_dump(path)`, then iterate records and fetch tensors by key.

    dump = open_dump("./dump/npu/step0/rank0")
    for record in dump.records():
        for name, role, desc in iter_tensors(record):
            t = dump.tensor(desc["key"]) if "key" in desc else None

`find_dumps(root)` lists every step/rank directory under a dump root. Opening a dump never
executes code: the index is JSON and tensors are safetensors.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ..errors import DumpError
from . import layout

log = logging.getLogger("opdiff")


@dataclass
class Dump:
    """One step of one rank of an opdiff dump (format v1)."""

    path: Path
    meta: dict
    step: int | None = None
    rank: int | None = None
    _stacks: dict | None = field(default=None, repr=False)
    _tensor_index: dict | None = field(default=None, repr=False)
    _handles: dict = field(default_factory=dict, repr=False)

    format = "opdiff"

    def records(self) -> Iterator[dict]:
        """Records in execution order. A truncated or corrupt last line is skipped with a warning."""
        path = self.path / layout.RECORDS
        with open(path, "rb") as f:
            lines = f.readlines()
        for i, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                yield json.loads(raw)
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    log.warning("opdiff: %s ends in a truncated line (the run was killed?); skipped", path)
                    return
                raise DumpError(f"{path}: line {i + 1} is not valid JSON; the dump is corrupt")

    def stacks(self) -> dict[int, list[dict]]:
        """{stack id: [frame, ...]}, each frame {"file", "line", "function", "code"}, innermost first."""
        if self._stacks is None:
            self._stacks = {}
            path = self.path / layout.STACKS
            if path.exists():
                for raw in path.read_bytes().splitlines():
                    try:
                        entry = json.loads(raw)
                    except json.JSONDecodeError:
                        continue  # a truncated last line after a crash
                    self._stacks[entry["id"]] = entry["frames"]
        return self._stacks

    def stack(self, stack_id: int | None) -> list[dict]:
        """Frames of one stack id ([] when unknown)."""
        if stack_id is None:
            return []
        return self.stacks().get(stack_id, [])

    @property
    def has_tensors(self) -> bool:
        return bool(self._index())

    def tensor_keys(self) -> list[str]:
        return list(self._index())

    def _index(self) -> dict[str, Path]:
        if self._tensor_index is None:
            self._tensor_index = {}
            tdir = self.path / layout.TENSORS
            if tdir.is_dir():
                from safetensors import safe_open

                for shard in sorted(tdir.glob("*.safetensors")):
                    try:
                        with safe_open(str(shard), framework="pt") as f:
                            for key in f.keys():
                                self._tensor_index[key] = shard
                    except Exception as exc:  # a shard cut short by a crash
                        log.warning("opdiff: skipping unreadable tensor shard %s (%s)", shard, exc)
        return self._tensor_index

    def tensor(self, key: str):
        """The saved tensor for a descriptor's key (a CPU torch.Tensor), or None if not saved."""
        shard = self._index().get(key)
        if shard is None:
            return None
        handle = self._handles.get(shard)
        if handle is None:  # one open handle per shard: reopening per key costs a header parse
            from safetensors import safe_open

            handle = self._handles[shard] = safe_open(str(shard), framework="pt")
        return handle.get_tensor(key)


def open_dump(path: str | os.PathLike) -> Dump:
    """Open one step/rank directory of an opdiff dump. Raises DumpError with a reason if it is not one."""
    p = Path(path)
    if not p.exists():
        raise DumpError(f"{p}: no such file or directory")
    if not (p / layout.RECORDS).exists():
        raise DumpError(f"{p}: not an opdiff dump directory (no {layout.RECORDS})")
    meta_path = p / layout.META
    meta: dict = {}
    if meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError as exc:
            raise DumpError(f"{meta_path}: not valid JSON ({exc.msg})") from None
    version = meta.get("format_version", layout.FORMAT_VERSION)
    if version > layout.FORMAT_VERSION:
        raise DumpError(f"{p}: dump format v{version} is newer than this opdiff reads "
                        f"(v{layout.FORMAT_VERSION}); upgrade opdiff")
    step, rank = layout.parse_step_rank(p)
    return Dump(path=p, meta=meta, step=step, rank=rank)


def find_dumps(root: str | os.PathLike) -> list[Path]:
    """Every opdiff step/rank directory under root (root itself if it is one), sorted by (step, rank)."""
    p = Path(root)
    if not p.exists():
        raise DumpError(f"{p}: no such file or directory")
    if (p / layout.RECORDS).exists():
        return [p]
    found = [d.parent for d in p.rglob(layout.RECORDS)]

    def order(d: Path):
        s, r = layout.parse_step_rank(d)
        return (s if s is not None else -1, r if r is not None else -1, str(d))

    return sorted(found, key=order)
