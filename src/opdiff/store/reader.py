"""Read a dump lazily: `open_dump(path)`, then iterate records and fetch tensors by key.

    dump = open_dump("./dump/npu/step0/rank0")
    for record in dump.records():
        for name, role, desc in iter_tensors(record):
            t = dump.tensor(desc["key"]) if "key" in desc else None

`find_dumps(root)` lists every step/rank directory under a dump root. Opening a dump never
executes code: the index is JSON and tensors are safetensors. `Dump` is the native
`opdiff.store.source.DumpSource`; `FORMAT` is how discovery finds it.

Tensors are mapped, not read: `tensor(key)` maps just that tensor's bytes of its shard
(copy-on-write, so the caller may modify it and the file never changes) and the mapping goes away
with the tensor. A compare that holds one pair at a time therefore keeps one pair's pages in
memory, however large the dump; keeping a shard open instead would keep every page read so far.

A tensor that viewed the bytes of one saved before it (a view, transpose, reshape, expand or
getitem output, unchanged since) is not written again: its shard's `__metadata__` holds
`"ref:<key>": '{"base": <key>, "offset": n, "shape": [...], "stride": [...]}'` (in elements of
the base, flattened), and `tensor(key)` gives it built from the base's bytes, contiguous like any
other. The base is in the same shard or an earlier one, so a reference is durable when its base
is; one whose base cannot be read is left out with a warning.
"""
from __future__ import annotations

import logging
import math
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional

from typing_extensions import TypedDict

from ..dtypes import SAFETENSORS_CODES
from ..errors import DumpError
from . import dumpfiles, layout
from .durable import unfinished
from .limits import check_size
from .records import record_problem
from .schema import Record, complete
from .source import DumpFormat

log = logging.getLogger("opdiff")

REF_PREFIX = "ref:"      # a `__metadata__` key naming a tensor stored as a reference


class _CutPlace(TypedDict):
    why: str                        # "killed", "disk full", "write failed", "raised", "exited"
    records: int                    # the whole records the step holds
    last_record: Optional[str]      # the last one's name


class Cut(_CutPlace, total=False):
    """Where a step's dump ends early (`Dump.cut`)."""
    error: str                      # "raised": the exception


@dataclass
class Dump:
    """One step of one rank of an opdiff dump (format v1)."""

    path: Path
    meta: dict[str, Any]
    step: int | None = None
    rank: int | None = None
    _stacks: dict[int, list[dict[str, Any]]] | None = field(default=None, repr=False)
    _tensor_index: dict[str, _Entry | _Ref] | None = field(default=None, repr=False)
    problems: list[str] = field(default_factory=list, repr=False)   # unreadable shards, for notes

    format = "opdiff"

    def records(self) -> Iterator[Record]:
        """Records in execution order, complete (`store.schema.complete`). A truncated or corrupt
        last line is skipped with a warning; any other line that is not a record is a DumpError
        (`store.dumpfiles` reads the file)."""
        path = self.path / layout.RECORDS
        with dumpfiles.open_file(path, self.path) as f:
            for number, raw, last in dumpfiles.lines(f, path):
                if not raw.strip():
                    continue
                record = _parse_line(path, number, raw, last)
                if record is None:
                    return
                problem = record_problem(record)
                if problem is not None:
                    raise DumpError(f"{path}: line {number} is not an opdiff record ({problem}); "
                                    "the dump is corrupt")
                yield complete(record)

    def stacks(self) -> dict[int, list[dict[str, Any]]]:
        """{stack id: [frame, ...]}, each frame {"file", "line", "function", "code"}, innermost first."""
        if self._stacks is None:
            stacks: dict[int, list[dict[str, Any]]] = {}
            path = self.path / layout.STACKS
            if os.path.lexists(path):
                with dumpfiles.open_file(path, self.path) as f:
                    for number, raw, last in dumpfiles.lines(f, path):
                        if not raw.strip():
                            continue
                        entry = _parse_line(path, number, raw, last)
                        if entry is None:
                            break
                        frames = entry.get("frames") if isinstance(entry, dict) else None
                        sid = entry.get("id") if isinstance(entry, dict) else None
                        if (not isinstance(sid, int) or not isinstance(frames, list)
                                or not all(isinstance(fr, dict) for fr in frames)):
                            raise DumpError(f"{path}: line {number} is not a call stack "
                                            '({"id": n, "frames": [...]}); the dump is corrupt')
                        stacks[sid] = frames
            self._stacks = stacks
        return self._stacks

    def stack(self, stack_id: int | None) -> list[dict[str, Any]]:
        """Frames of one stack id ([] when unknown)."""
        if stack_id is None:
            return []
        return self.stacks().get(stack_id, [])

    @property
    def holds_tensors(self) -> bool:
        """True for a tensor dump (task="tensor"): every recorded tensor was saved as it was."""
        return bool(self._index())

    def cut(self) -> Cut | None:
        """Where this step's dump ends early: {"why": "killed" | "disk full" | "write failed" |
        "raised" (with "error": the exception) | "exited" (without closing the step), "records":
        the whole records it holds, "last_record": the last one's name}; None when
        the step was closed cleanly or was whole at stop() (`opdiff.store.durable`). A dump
        without the mark (an older opdiff's) is cut when its last line is."""
        mark, torn = unfinished(self.path), _ends_cut(self.path / layout.RECORDS)
        if mark is None and not torn:
            return None
        mark = {"state": "writing"} if mark is None or torn and mark.get("state") == "stopped" else mark
        count, last = 0, None
        for record in self.records():
            count, last = count + 1, record.get("name") if isinstance(record, dict) else None
        state = mark.get("state")
        if state == "stopped" and mark.get("records") == count:
            return None
        why = state if state in ("disk full", "write failed", "raised", "exited") else "killed"
        cut: Cut = {"why": why, "records": count, "last_record": last}
        if why == "raised" and mark.get("error"):
            cut["error"] = str(mark["error"])
        return cut

    def record_count(self) -> int:
        """Lines of records.jsonl (0 when it cannot be read)."""
        path = self.path / layout.RECORDS
        try:
            with dumpfiles.open_file(path, self.path) as f:
                return sum(1 for _, line, _ in dumpfiles.lines(f, path) if line.strip())
        except (OSError, DumpError):
            return 0

    def tensor_keys(self) -> list[str]:
        """Keys of every saved tensor."""
        return list(self._index())

    def _index(self) -> dict[str, "_Entry | _Ref"]:
        if self._tensor_index is None:
            index: dict[str, _Entry | _Ref] = {}
            refs: dict[str, _Ref] = {}
            tdir = self.path / layout.TENSORS
            if tdir.is_dir():
                for shard in sorted(tdir.glob("*.safetensors")):
                    try:
                        dumpfiles.resolve(shard, self.path)     # a regular file of this dump
                        entries, found = _shard_header(shard)
                    except (OSError, ValueError, DumpError) as exc:  # cut short by a crash
                        log.warning("opdiff: skipping unreadable tensor shard %s (%s)", shard, exc)
                        self.problems.append(f"tensor shard {shard.name} is unreadable ({exc}); "
                                             "its tensors are compared by their statistics")
                        continue
                    index.update(entries)
                    refs.update(found)
            lost = [key for key, ref in refs.items() if not isinstance(index.get(ref.base), _Entry)
                    or not _fits(ref, index[ref.base])]     # type: ignore[arg-type]
            if lost:
                log.warning("opdiff: %s: %d saved tensors refer to tensors this dump lacks or that "
                            "cannot hold them (an unreadable shard?); they are not available, "
                            "e.g. %s", self.path, len(lost), lost[0])
            # (a key saved whole and again as a reference to itself keeps its bytes: the
            # reference would have nothing to read)
            gone = set(lost) | {k for k, r in refs.items() if r.base == k}
            index.update((k, r) for k, r in refs.items() if k not in gone)
            self._tensor_index = index
        return self._tensor_index

    def tensor(self, key: str) -> Any:
        """The saved tensor for a descriptor's key (a CPU torch.Tensor), or None if not saved.

        Raises OSError or ValueError when the shard changed or broke since the dump was opened.
        """
        index = self._index()
        entry = index.get(key)
        if entry is None:
            return None
        if isinstance(entry, _Ref):
            return _load_ref(entry, index[entry.base])     # type: ignore[arg-type]
        return _load(entry)


def _ends_cut(path: Path) -> bool:
    """records.jsonl ends in a line without its newline (a run killed mid-write)."""
    if not path.is_file():      # (never opened if a FIFO or a device: it could block)
        return False
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:
        return False


def _parse_line(path: Path, number: int, raw: bytes, last: bool) -> Any:
    """One JSON line of a dump file; None for a broken last line (the run was killed while
    writing it: skipped with a warning). DumpError for any other line that is not JSON."""
    try:
        return dumpfiles.parse(raw)
    except dumpfiles.TooDeep as exc:
        raise DumpError(f"{path}: line {number}: {exc}; the dump is corrupt") from None
    except ValueError:          # not JSON, or not UTF-8 (a character cut in two by a kill)
        if last:
            log.warning("opdiff: %s ends in a truncated line (the run was killed?); skipped", path)
            return None
        raise DumpError(f"{path}: line {number} is not valid JSON (UTF-8); the dump is "
                        "corrupt") from None


class _Entry(NamedTuple):
    """Where one tensor lies in a safetensors shard."""
    key: str
    shard: Path
    dtype: str          # safetensors' name: "F32", "BF16", ...
    shape: tuple[int, ...]
    offset: int         # from the start of the file
    nbytes: int


class _Ref(NamedTuple):
    """A tensor stored as a view of another's bytes (see the module's docstring)."""
    key: str
    base: str
    offset: int                 # in elements of the base
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _fits(ref: _Ref, base: _Entry) -> bool:
    """The reference's elements all lie inside its base."""
    numel = math.prod(base.shape)
    if any(n < 0 for n in ref.shape):
        return False
    if any(n == 0 for n in ref.shape):
        return 0 <= ref.offset <= numel
    last = ref.offset + sum((n - 1) * st for n, st in zip(ref.shape, ref.stride))
    return ref.offset >= 0 and all(st >= 0 for st in ref.stride) and last < numel


def _load_ref(ref: _Ref, base: _Entry) -> Any:
    """The referenced elements, contiguous: a contiguous run is mapped by itself, other views
    are copied out of the mapped base (which is then unmapped with it)."""
    import torch

    numel = math.prod(ref.shape)
    size = base.nbytes // max(1, math.prod(base.shape))
    expected, contiguous = 1, True
    for n, st in reversed(list(zip(ref.shape, ref.stride))):
        if n != 1 and st != expected:
            contiguous = False
        expected *= n
    if contiguous or numel == 0:
        return _load(base._replace(key=ref.key, shape=ref.shape, offset=base.offset + ref.offset * size,
                                   nbytes=numel * size))
    # a view may repeat its base's elements (stride 0): what it makes is bounded by the limit
    check_size(ref.key, numel * size, f"a reference repeating {base.nbytes} stored bytes")
    whole = _load(base).reshape(-1)
    return torch.as_strided(whole, ref.shape, ref.stride, ref.offset).contiguous()


def _torch_dtypes() -> dict[str, Any]:
    import torch

    # What opdiff writes, and the complex codes other safetensors writers use.
    names = {code: name for name, code in SAFETENSORS_CODES.items()}
    names.update({"C64": "complex64", "C128": "complex128"})
    return {k: getattr(torch, v) for k, v in names.items() if hasattr(torch, v)}


_DTYPES: dict[str, Any] | None = None
_MAX_HEADER = 100 << 20     # safetensors' own limit on the JSON header


def _shard_entries(shard: Path) -> dict[str, _Entry]:
    """The tensors whose bytes a shard holds (not its references), from its header."""
    return _shard_header(shard)[0]


def _shard_header(shard: Path) -> tuple[dict[str, _Entry], dict[str, _Ref]]:
    """Parse a shard's header (8-byte little-endian length, then JSON) without mapping its data:
    the tensors it holds and those it stores as references."""
    with dumpfiles.open_file(shard) as f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(8)
        if len(raw) < 8:
            raise ValueError("file too short for a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        if length > min(_MAX_HEADER, size - 8):
            raise ValueError(f"header length {length} does not fit in the file")
        header = dumpfiles.parse(f.read(length))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    start, entries = 8 + length, {}
    refs = _refs(shard, header.get("__metadata__"))
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            begin, end = (int(x) for x in info["data_offsets"])
            entry = _Entry(key, shard, str(info["dtype"]), tuple(int(x) for x in info["shape"]),
                           start + begin, end - begin)
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{key}: malformed header entry {info!r}") from None
        if not 0 <= begin <= end <= size - start:
            raise ValueError(f"{key}: data offsets {begin}..{end} lie outside the file")
        entries[key] = entry
    return entries, refs


def _refs(shard: Path, metadata: Any) -> dict[str, _Ref]:
    refs: dict[str, _Ref] = {}
    if not isinstance(metadata, dict):
        return refs
    for name, value in metadata.items():
        if not (isinstance(name, str) and name.startswith(REF_PREFIX)):
            continue
        key = name[len(REF_PREFIX):]
        try:
            info = dumpfiles.parse(value)
            refs[key] = _Ref(key, str(info["base"]), int(info["offset"]),
                             tuple(int(x) for x in info["shape"]), tuple(int(x) for x in info["stride"]))
            if len(refs[key].shape) != len(refs[key].stride):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{key}: malformed reference {value!r}") from None
    return refs


def _load(entry: _Entry) -> Any:
    import torch

    global _DTYPES
    if _DTYPES is None:
        _DTYPES = _torch_dtypes()
    dtype = _DTYPES.get(entry.dtype)
    if dtype is None:               # a dtype this torch build lacks a name for: ask safetensors
        from safetensors import safe_open

        with safe_open(str(entry.shard), framework="pt") as f:
            return f.get_tensor(entry.key)
    numel = math.prod(entry.shape)
    if numel * dtype.itemsize != entry.nbytes:
        raise ValueError(f"{entry.shard}: {entry.nbytes} bytes cannot hold a {entry.dtype} "
                         f"tensor of shape {list(entry.shape)}")
    if numel == 0:
        return torch.empty(entry.shape, dtype=dtype)
    base = entry.offset - entry.offset % mmap.ALLOCATIONGRANULARITY
    skip = entry.offset - base
    with dumpfiles.open_file(entry.shard) as f:
        if skip % dtype.itemsize:   # misaligned data (safetensors aligns; others may not): copy
            data = torch.empty(entry.nbytes, dtype=torch.uint8)
            f.seek(entry.offset)
            # an ndarray is a buffer; numpy's stubs do not say so for every Python
            if f.readinto(memoryview(data.numpy())) != entry.nbytes:  # type: ignore[arg-type]
                raise ValueError(f"{entry.shard}: file is shorter than its header says")
            return data.view(dtype).reshape(entry.shape)
        # ACCESS_COPY: private pages, so writes stay in this process. The tensor keeps the map
        # alive; it is unmapped when the tensor is freed.
        mapped = mmap.mmap(f.fileno(), skip + entry.nbytes, access=mmap.ACCESS_COPY, offset=base)
    return torch.frombuffer(mapped, dtype=dtype, count=numel, offset=skip).reshape(entry.shape)


def open_dump(path: str | os.PathLike[str]) -> Dump:
    """Open one step/rank directory of an opdiff dump. Raises DumpError with a reason if it is not one."""
    p = Path(path)
    if not p.exists():
        raise DumpError(f"{p}: no such file or directory")
    if not (p / layout.RECORDS).exists():
        raise DumpError(f"{p}: not an opdiff dump directory (no {layout.RECORDS})")
    meta_path = p / layout.META
    meta: Any = {}
    if os.path.lexists(meta_path):
        meta = dumpfiles.load(meta_path, p, max_bytes=dumpfiles.MAX_LINE_BYTES)
        if not isinstance(meta, dict):
            raise DumpError(f"{meta_path}: a JSON {type(meta).__name__}, not an object; not an "
                            "opdiff meta.json")
    version = meta.get("format_version", layout.FORMAT_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise DumpError(f"{meta_path}: format_version {version!r} is not a whole number; not an "
                        "opdiff meta.json")
    if version > layout.FORMAT_VERSION:
        raise DumpError(f"{p}: dump format v{version} is newer than this opdiff reads "
                        f"(v{layout.FORMAT_VERSION}); upgrade opdiff")
    step, rank = layout.parse_step_rank(p)
    return Dump(path=p, meta=meta, step=step, rank=rank)


def find_dumps(root: str | os.PathLike[str]) -> list[Path]:
    """Every opdiff step/rank directory under root (root itself if it is one), sorted by (step, rank)."""
    p = Path(root)
    if not p.exists():
        raise DumpError(f"{p}: no such file or directory")
    if (p / layout.RECORDS).exists():
        return [p]
    found = [d.parent for d in p.rglob(layout.RECORDS)]

    def order(d: Path) -> tuple[int, int, str]:
        s, r = layout.parse_step_rank(d)
        return (s if s is not None else -1, r if r is not None else -1, str(d))

    return sorted(found, key=order)


FORMAT = DumpFormat(
    name="opdiff", describe="an opdiff dump (step*/rank*/records.jsonl)",
    detect=lambda file: file.name == layout.RECORDS,
    open=lambda file: open_dump(file.parent),
    data_dirs=lambda hits: (layout.TENSORS,))
