"""Read the JSON-lines `.pkl` dumps of ptdbg_ascend and torch_npu.hooks (despite the suffix, no
pickle: one JSON array per line; a real pickle is refused, since loading one can run code).

ptdbg_ascend (3.x-6.x; e.g. `ptdbg_dump_v4.0/step0/rank0/api_stack_dump.pkl`, tensors in the
sibling directory `api_stack_dump/` as `{tensor name}.npy`; bf16 tensors were saved as fp32)::

    ["Functional_conv2d_0_forward_input.0", 1, [], "torch.float32", [2, 3, 4, 4], [max, min, mean, norm]]
    ["Functional_conv2d_0_forward_stack_info", [["/x/model.py", "57", "forward", "out = conv(x)"], ...]]

(the statistics list has no norm before 4.0; scalars have dtype "<class 'int'>" and their value as
statistics). Backward lines follow msprobe's sense: `backward_input` are the gradients w.r.t. the
forward outputs.

torch_npu.hooks (`register_acc_cmp_hook`, torch_npu 1.8-1.11 era) writes whole tensors inline::

    ["Module_Conv2d_forward_input.0", [flat values as float], "torch.float16", [2, 3, 4, 4]]

(older builds: "forward_Conv2d_input.0"). Names carry no call counter, so one is assigned in
execution order per op; backward calls take the counter of the latest unmatched forward call of
the same op (backward runs in reverse). Its `backward_input` came from `register_backward_hook`'s
grad_input, the gradients w.r.t. the forward *inputs*: they become the record's outputs, to match
opdiff's and msprobe's sense (and `backward_output` becomes inputs). Names that are already dotted
msprobe names (`Functional.conv2d.0.forward.input.0`) are kept as they are.

Legacy underscore names map onto dotted ones: `Functional_conv2d_0_forward` ->
`Functional.conv2d.0.forward`, `Tensor___iadd___0_forward` -> `Tensor.__iadd__.0.forward`,
`Module_Conv2d_forward` (k-th call) -> `Module.Conv2d.forward.k`.

Their tensors load by key, but neither format offers replay (`holds_tensors` is False):
ptdbg_ascend saved bf16 tensors as fp32, so a replay would judge bf16 ops as fp32 ones; and
torch_npu.hooks records module calls, which replay never re-runs, with backward gradients from
`register_backward_hook`.
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from ...dtypes import short_dtype
from ...errors import DumpError
from .. import dumpfiles, layout
from ..dumpfiles import UnreadableTensor
from ..schema import Phase, Record, complete, tensor_name
from ..source import DumpFormat
from . import frames as _frames
from .descriptors import tensor_descriptor, value_descriptor
from .legacy_calls import Calls, TensorName, parse_hooks_name, parse_ptdbg_name

log = logging.getLogger("opdiff")

_SCALAR_DTYPE = re.compile(r"^<class '(int|float|bool|str)'>$")
# The name at the start of a line (`["Functional_conv2d_0_forward_input.0", ...`), read without
# parsing the rest: counting calls must not decode every tensor's values.
_LINE_NAME = re.compile(rb'^\s*\[\s*"((?:[^"\\]|\\.)*)"')


@dataclass
class _PklDump:
    """Shared by both legacy formats: a `.pkl` of JSON lines."""

    path: Path                 # the .pkl file
    meta: dict[str, Any]
    step: int | None = None
    rank: int | None = None
    _stacks: dict[int, list[dict[str, Any]]] = field(default_factory=dict, repr=False)  # id -> frames
    _stack_ids: dict[str, int] = field(default_factory=dict, repr=False)   # frames as JSON -> id
    _scanned: bool = field(default=False, repr=False)            # records() ran to the end once
    _count: int | None = field(default=None, repr=False)         # records, once known

    swap_backward = False       # torch_npu.hooks' backward lines name the other side
    format = ""

    def parse(self, name: str) -> Optional[TensorName]:
        """The format's line-name parser."""
        raise NotImplementedError

    def records(self) -> Iterator[Record]:
        """Records in execution order."""
        raise NotImplementedError

    @property
    def holds_tensors(self) -> bool:
        """False: see the module's notes."""
        return False

    def record_count(self) -> int:
        """The calls the lines make up, grouped from their names alone (values left unread)."""
        if self._count is None:
            calls, count = Calls(swap_backward=self.swap_backward), 0
            try:
                with dumpfiles.open_file(self.path, self.path.parent) as f:
                    for _, raw, _ in dumpfiles.lines(f, self.path):
                        m = _LINE_NAME.match(raw)
                        tn = self.parse(json.loads(b'"' + m.group(1) + b'"')) if m else None
                        if tn is not None:
                            count += calls.add(tn, desc={}) is not None
            except (OSError, ValueError, DumpError):
                return 0
            self._count = count + (calls.finish() is not None)
        return self._count

    def _scan(self) -> None:
        """Read the whole file once, for what only a full pass knows (stack ids, tensor keys)."""
        if not self._scanned:
            for _ in self.records():
                pass

    def _lines(self) -> Iterator[tuple[int, int, list[Any]]]:
        """(line number, byte offset, parsed line); a truncated last line is skipped with a warning."""
        offset = 0
        with dumpfiles.open_file(self.path, self.path.parent) as f:
            pending = None
            for number, raw, _ in dumpfiles.lines(f, self.path):
                if pending is not None:  # only the last line may be broken
                    raise DumpError(f"{self.path}: line {pending} is not valid JSON; the file is corrupt")
                start, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                try:
                    item = dumpfiles.parse(raw)
                except dumpfiles.TooDeep as exc:
                    raise DumpError(f"{self.path}: line {number}: {exc}; the file is corrupt") from None
                except ValueError:          # not JSON, or not UTF-8
                    pending = number
                    continue
                if not isinstance(item, list) or not item or not isinstance(item[0], str):
                    raise DumpError(f"{self.path}: line {number} is not a [name, ...] array; "
                                    f"expected {self.format} JSON lines")
                yield number, start, item
            if pending is not None:
                log.warning("opdiff: %s ends in a truncated line (the run was killed?); skipped", self.path)

    def _stack_id(self, frames: list[dict[str, Any]]) -> int:
        key = json.dumps(frames, sort_keys=True)
        sid = self._stack_ids.get(key)
        if sid is None:
            sid = self._stack_ids[key] = len(self._stacks)
            self._stacks[sid] = frames
        return sid

    def stacks(self) -> dict[int, list[dict[str, Any]]]:
        """{stack id: frames}, innermost user frame first."""
        self._scan()
        return self._stacks

    def stack(self, stack_id: int | None) -> list[dict[str, Any]]:
        """Frames of one stack id ([] when unknown)."""
        if stack_id is None:
            return []
        return self.stacks().get(stack_id, [])


@dataclass
class PtdbgDump(_PklDump):
    """A ptdbg_ascend dump: one `.pkl` index plus `.npy` tensors in the directory of the same name."""

    _files: set[str] | None = field(default=None, repr=False)
    format = "ptdbg_ascend"

    def parse(self, name: str) -> Optional[TensorName]:
        return parse_ptdbg_name(name)

    @property
    def data_dir(self) -> Path:
        return self.path.with_suffix("")

    def records(self) -> Iterator[Record]:
        calls = Calls(swap_backward=False)
        files = self._npy_files()
        stacks: dict[str, Any] = {}
        count = 0
        for record in self._records(calls, files):
            # A backward call without its own stack gets its forward call's (the user's line).
            forward = record.get("forward")
            if record["stack"] is None and forward is not None and forward in stacks:
                record["stack"] = stacks[forward]
            elif record["phase"] == Phase.FORWARD and record["stack"] is not None:
                stacks[record["name"]] = record["stack"]
            count += 1
            yield record
        self._scanned, self._count = True, count

    def _records(self, calls: "Calls", files: set[str]) -> Iterator[Record]:
        for number, _, item in self._lines():
            tn = self.parse(item[0])
            if tn is None:
                log.debug("opdiff: %s line %d: unrecognised name %r skipped", self.path, number, item[0])
                continue
            if tn.role == "stack_info":     # the call's stack, not a tensor
                frames = [f for f in map(_frames.parse_list_frame, item[1] if len(item) > 1 else []) if f]
                done = calls.add(tn, stack=self._stack_id(_frames.user_frames(frames)))
            else:
                done = calls.add(tn, desc=self._descriptor(item, files))
            if done:
                yield _with_stack(done)
        last = calls.finish()
        if last:
            yield _with_stack(last)

    def _descriptor(self, item: list[Any], files: set[str]) -> dict[str, Any]:
        name = item[0]
        dtype = item[3] if len(item) > 3 else None
        summary = item[5] if len(item) > 5 and isinstance(item[5], list) else []
        scalar = _SCALAR_DTYPE.match(str(dtype))
        if scalar:
            return value_descriptor(summary[0] if summary else None)
        stats = (summary + [None] * 4)[:4]
        shape = item[4] if len(item) > 4 and isinstance(item[4], list) else None
        return tensor_descriptor(dtype, shape, max=stats[0], min=stats[1], mean=stats[2], norm=stats[3],
                                 key=name if name in files else None)

    def _npy_files(self) -> set[str]:
        if self._files is None:
            self._files = set()
            if self.data_dir.is_dir():
                with os.scandir(self.data_dir) as it:
                    self._files = {e.name[:-4] for e in it if e.name.endswith(".npy")}
        return self._files

    def tensor_keys(self) -> list[str]:
        """Keys of every `.npy` tensor in the data directory."""
        return sorted(self._npy_files())

    def tensor(self, key: str) -> Any:
        """The saved tensor (`.npy`, loaded without pickle) or None. bf16 tensors come back as fp32."""
        if key not in self._npy_files():
            return None
        from .msprobe import load_tensor_file

        return load_tensor_file(self.data_dir / f"{key}.npy", self.path.parent)


@dataclass
class NpuHooksDump(_PklDump):
    """A torch_npu.hooks dump: every tensor's values inline in the `.pkl`."""

    _offsets: dict[str, int] = field(default_factory=dict, repr=False)   # tensor key -> line offset
    format = "torch_npu_hooks"
    swap_backward = True

    def parse(self, name: str) -> Optional[TensorName]:
        return parse_hooks_name(name)

    def records(self) -> Iterator[Record]:
        calls = Calls(swap_backward=True)
        offsets: dict[str, int] = {}
        count = 0
        for number, offset, item in self._lines():
            tn = self.parse(item[0])
            if tn is None or len(item) < 4:
                log.debug("opdiff: %s line %d: unrecognised entry %r skipped", self.path, number, item[0])
                continue
            try:
                desc = _inline_descriptor(item)
            except (TypeError, ValueError) as exc:
                raise DumpError(f"{self.path}: line {number}: values that are not numbers "
                                f"({str(exc)[:80]}); the file is corrupt") from None
            done = calls.add(tn, desc=desc)
            if done:
                count += 1
                yield _with_stack(done)
            # the key is the record's tensor name, known once the call is started
            desc["key"] = tensor_name(calls.current_name, calls.role_of(tn),
                                      ".".join(tn.path or ("0",)))
            offsets[desc["key"]] = offset
        last = calls.finish()
        if last:
            count += 1
            yield _with_stack(last)
        self._offsets, self._scanned, self._count = offsets, True, count

    def tensor_keys(self) -> list[str]:
        """Keys of every tensor in the `.pkl` (one pass over it, the first time)."""
        self._scan()
        return list(self._offsets)

    def tensor(self, key: str) -> Any:
        """The tensor rebuilt from the values in the `.pkl`, in its recorded dtype."""
        self._scan()
        offset = self._offsets.get(key)
        if offset is None:
            return None
        with dumpfiles.open_file(self.path, self.path.parent) as f:
            f.seek(offset)
            item = dumpfiles.parse(f.readline(dumpfiles.MAX_LINE_BYTES))
        try:
            return _inline_tensor(item)
        except (TypeError, ValueError, IndexError, RuntimeError) as exc:
            raise UnreadableTensor(f"{self.path}: {key}: not a tensor ({exc})") from None


def _with_stack(record: dict[str, Any]) -> Record:
    """The finished call's record, complete (`schema.complete`), with its stack id."""
    stack = record.pop("_stack", None)
    if stack is not None:
        record["stack"] = stack
    return complete(record)


def _inline_tensor(item: list[Any]) -> Any:
    import torch

    values, dtype, shape = item[1], item[2], item[3]
    t = torch.tensor(values if isinstance(values, list) else [values], dtype=torch.float32)
    target = getattr(torch, short_dtype(dtype) or "float32", None)
    if isinstance(target, torch.dtype) and target != torch.float32:
        t = t.to(target)
    return t.reshape(list(shape)) if isinstance(shape, (list, tuple)) else t


def _inline_descriptor(item: list[Any]) -> dict[str, Any]:
    """Statistics computed from the inline values (this format stores no statistics)."""
    import numpy as np

    values, dtype, shape = item[1], item[2], item[3]
    a = np.asarray(values if isinstance(values, list) else [values], dtype=np.float64)
    if a.size == 0:
        return tensor_descriptor(dtype, shape)
    with np.errstate(all="ignore"):
        return tensor_descriptor(dtype, shape, max=float(a.max()), min=float(a.min()),
                                 mean=float(a.mean()), norm=float(np.sqrt(np.sum(a * a))),
                                 nan=int(np.isnan(a).sum()), inf=int(np.isinf(a).sum()))


def open_pkl(path: Path) -> PtdbgDump | NpuHooksDump:
    """Open a ptdbg_ascend or torch_npu.hooks `.pkl`, telling them apart by their first line."""
    try:
        with dumpfiles.open_file(path, path.parent) as f:
            head = f.read(2)
            if head[:1] == b"\x80":
                raise DumpError(f"{path}: is a real Python pickle, which opdiff never loads (it "
                                "can run code); expected ptdbg_ascend / torch_npu.hooks JSON lines")
            f.seek(0)
            first = b""
            for _, raw, _ in dumpfiles.lines(f, path):
                if raw.strip():
                    first = raw
                    break
    except OSError as exc:
        raise DumpError(f"{path}: cannot read ({exc.strerror})") from None
    if not first:
        raise DumpError(f"{path}: empty file; the dump run wrote nothing")
    try:
        item = dumpfiles.parse(first)
    except dumpfiles.TooDeep as exc:
        raise DumpError(f"{path}: line 1: {exc}; the file is corrupt") from None
    except ValueError:
        raise DumpError(f"{path}: first line is not JSON; expected ptdbg_ascend / torch_npu.hooks "
                        "JSON lines like [\"Functional_conv2d_0_forward_input.0\", ...]") from None
    step, rank = layout.parse_step_rank(path.parent)
    if step is None and rank is None:  # .../step0/x.pkl
        step = layout.parse_step_rank(path.parent / "x")[0]
    if isinstance(item, list) and len(item) == 4 and isinstance(item[1], list) and isinstance(item[2], str):
        return NpuHooksDump(path=path, meta={"tool": "torch_npu.hooks"}, step=step, rank=rank)
    if isinstance(item, list) and item and isinstance(item[0], str) and (
            (len(item) >= 6 and isinstance(item[3], str)) or item[0].endswith("stack_info")):
        return PtdbgDump(path=path, meta={"tool": "ptdbg_ascend"}, step=step, rank=rank)
    raise DumpError(f"{path}: unknown .pkl layout; expected ptdbg_ascend lines [name, step, [], dtype, "
                    "shape, stats] or torch_npu.hooks lines [name, values, dtype, shape]")


FORMAT = DumpFormat(
    name="legacy_pkl", describe="a ptdbg_ascend / torch_npu.hooks .pkl",
    detect=lambda file: file.suffix == ".pkl",
    open=open_pkl, leaf=False,
    # ptdbg_ascend keeps a .pkl's tensors in the directory named like it
    data_dirs=lambda hits: {Path(h).stem for h in hits},
    shared_name=True)
