"""Read msprobe (mindstudio-probe) PyTorch dumps through opdiff's `Dump` interface.

One msprobe step/rank directory looks like this (msprobe 1.x to 26.x)::

    step{S}/rank{R}/  (or proc{pid}/ when torch.distributed was not initialised)
        dump.json            {"task", "level", "framework", "dump_data_dir", "data": {name: entry}}
        stack.json           {"0": [[names...], [frame strings...]]}  (older: {name: [frames]})
        construct.json       {name: parent module name | null}
        dump_tensor_data/    task="tensor": one file per tensor, `{tensor name}.pt` (or .npy)

`data` keeps execution order (msprobe appends as ops run; Python keeps JSON object order), with
forward and backward entries where they happened. Entries translate to opdiff records:

    "Functional.conv2d.0.forward": {"input_args", "input_kwargs", "output"}   -> kind "api"
    "Functional.conv2d.0.backward": {"input", "output"}                      -> kind "api", backward
    "Module.fc.Linear.forward.0": {..., "parameters": {"weight": t}}          -> kind "module"
    "Module.fc.Linear.parameters_grad.0": {"weight": [t]}                     -> kind "param_grad"

Tensor entries carry Max/Min/Mean/Norm (msprobe writes bare NaN/Infinity into dump.json, which
Python's json module reads), dtype, shape, requires_grad and, in tensor mode, data_name.
Tensor keys are the data file's name without extension, which is also the tensor's name.

A tensor dump's files load by key, but replay is not offered on them (`holds_tensors` is False):
msprobe 26.2's forward tensors replay faithfully, its backward records do not hold what replay
needs (a Linear backward's gradients in another order; a healthy fp32 cross_entropy backward
replays 58% off), so replay would blame healthy ops.
"""
from __future__ import annotations

import logging
import mmap
import os
import pickle
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ...dtypes import short_dtype
from ...errors import DumpError
from .. import dumpfiles
from ..dumpfiles import UnreadableTensor
from ..records import encode_float
from ..schema import Kind, Phase, Record, complete, name_parts, record_name, record_op
from ..source import DumpFormat
from . import frames as _frames
from .descriptors import tensor_descriptor

log = logging.getLogger("opdiff")

DUMP_JSON = "dump.json"
STACK_JSON = "stack.json"
CONSTRUCT_JSON = "construct.json"
TENSOR_DIR = "dump_tensor_data"

# dump.json's entries, found without parsing it (for a cheap record count): keys that end in a
# phase, a module call's counter or a parameter-gradient counter, whose value is an object.
_ENTRY = re.compile(rb'\.(?:forward|backward|parameters_grad)(?:\.\d+)?"\s*:\s*\{')
_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^(?:rank|proc)(\d+)$")

_TENSOR_TYPES = {"torch.Tensor", "torch.nn.parameter.Parameter", "mindspore.Tensor", "numpy.ndarray"}
_VALUE_TYPES = {"int": "int", "float": "float", "bool": "bool", "str": "str"}
_TYPED_VALUES = {"torch.dtype": "dtype", "torch.device": "device", "torch.Size": "size"}


def parse_name(name: str) -> dict[str, Any]:
    """kind, op, phase and the forward record's name for one msprobe entry name."""
    parts = name_parts(name)        # RecordName.parse's parts, without building one
    if parts is None:
        return {"kind": Kind.API, "op": name,
                "phase": Phase.BACKWARD if Phase.BACKWARD in name else Phase.FORWARD}
    op, phase, index, kind = parts
    if kind == Kind.PARAM_GRAD:
        return {"kind": kind, "op": record_op(op, kind), "phase": phase}
    if phase == Phase.BACKWARD:
        return {"kind": kind, "op": op, "phase": phase,
                "forward": record_name(op, Phase.FORWARD, index, kind)}
    return {"kind": kind, "op": op, "phase": phase}


def step_rank(directory: Path) -> tuple[int | None, int | None]:
    """(step, rank) from `.../step{S}/rank{R}`; a `proc{pid}` directory has no rank (None)."""
    step_m = _STEP.match(directory.parent.name)
    rank = None
    if directory.name.startswith("rank"):
        m = _RANK.match(directory.name)
        rank = int(m.group(1)) if m else None
    return (int(step_m.group(1)) if step_m else None, rank)


@dataclass
class MsprobeDump:
    """One step of one rank of an msprobe dump, read as opdiff records."""

    path: Path
    meta: dict[str, Any]
    step: int | None = None
    rank: int | None = None
    _stacks: dict[int, list[dict[str, Any]]] | None = field(default=None, repr=False)
    _stack_of: dict[str, int] | None = field(default=None, repr=False)
    _files: dict[str, str] | None = field(default=None, repr=False)

    format = "msprobe"

    # -- records --------------------------------------------------------------------------------
    def records(self) -> Iterator[Record]:
        """Records in execution order (dump.json's order)."""
        data = _load_json(self.path / DUMP_JSON).get("data")
        if not isinstance(data, dict):
            raise DumpError(f"{self.path / DUMP_JSON}: no \"data\" object; not an msprobe dump.json")
        parents = self._construct()
        self.stacks()
        for seq, (name, entry) in enumerate(data.items()):
            if not isinstance(entry, dict):
                continue
            yield complete(self._record(seq, name, entry, parents.get(name)))

    def _record(self, seq: int, name: str, entry: dict[str, Any], parent: str | None) -> dict[str, Any]:
        info = parse_name(name)
        stack_of = self._stack_of or {}      # filled by stacks(), which records() calls first
        stack = stack_of.get(name)
        if stack is None and "forward" in info:
            # msprobe keeps no stack for backward calls; the forward call's is the user's line.
            stack = stack_of.get(info["forward"])
        record = {"seq": seq, "name": name, "op": info["op"], "kind": info["kind"],
                  "phase": info["phase"], "module": parent, "stack": stack}
        if "forward" in info:
            record["forward"] = info["forward"]
        if info["kind"] == Kind.PARAM_GRAD:
            # msprobe wraps each parameter's gradient in a one-element list.
            record["parameters"] = {p: self._arg(v[0] if isinstance(v, list) and len(v) == 1 else v)
                                    for p, v in entry.items()}
            return record
        inputs = entry.get("input_args", entry.get("input"))
        record["inputs"] = [self._arg(v) for v in inputs] if isinstance(inputs, list) else []
        kwargs = entry.get("input_kwargs")
        if isinstance(kwargs, dict) and kwargs:
            record["kwargs"] = {k: self._arg(v) for k, v in kwargs.items()}
        outputs = entry.get("output")
        if isinstance(outputs, list):
            record["outputs"] = [self._arg(v) for v in outputs]
        elif isinstance(outputs, dict):  # a single value rather than a list, in some versions
            record["outputs"] = [self._arg(outputs)]
        else:
            record["outputs"] = []
        params = entry.get("parameters")
        if isinstance(params, dict) and params:
            record["parameters"] = {k: self._arg(v) for k, v in params.items()}
        return record

    def _arg(self, value: Any, depth: int = 0) -> dict[str, Any]:
        """One msprobe argument description as an opdiff descriptor."""
        if value is None:
            return {"type": "none"}
        if isinstance(value, list):
            return {"type": "list", "items": [self._arg(v, depth + 1) for v in value]}
        if not isinstance(value, dict):
            return {"type": "object", "value": repr(value)[:120]}
        kind = value.get("type")
        if kind is None:  # a dict argument: msprobe writes its items directly
            return {"type": "dict", "items": {str(k): self._arg(v, depth + 1) for k, v in value.items()}}
        if kind in _TENSOR_TYPES or ("dtype" in value and "shape" in value and kind not in _VALUE_TYPES):
            return self._tensor(value)
        if kind in _VALUE_TYPES:
            v = value.get("value")
            if isinstance(v, float):
                v = encode_float(v)
            return {"type": _VALUE_TYPES[kind], "value": v}
        if kind in _TYPED_VALUES:
            return {"type": _TYPED_VALUES[kind], "value": value.get("value")}
        if kind in ("NoneType", "None"):
            return {"type": "none"}
        text = value.get("value", kind)
        return {"type": "object", "value": str(text)[:120]}

    def _tensor(self, value: dict[str, Any]) -> dict[str, Any]:
        data_name = value.get("data_name")
        key = None
        if isinstance(data_name, str):
            stem = _stem(data_name)
            if stem in self._tensor_files():
                key = stem
        return tensor_descriptor(
            short_dtype(value.get("dtype")), value.get("shape"),
            max=value.get("Max"), min=value.get("Min"), mean=value.get("Mean"), norm=value.get("Norm"),
            requires_grad=value.get("requires_grad"), key=key)

    # -- module tree and stacks ---------------------------------------------------------------
    def _construct(self) -> dict[str, Any]:
        path = self.path / CONSTRUCT_JSON
        if not path.exists():
            return {}
        try:
            parents = _load_json(path)
        except DumpError as exc:  # extra information only: a broken one costs the module column
            log.warning("opdiff: %s; module nesting unknown", exc)
            return {}
        return parents if isinstance(parents, dict) else {}

    def stacks(self) -> dict[int, list[dict[str, Any]]]:
        """{stack id: [frame, ...]}, innermost user frame first."""
        if self._stacks is None:
            self._stacks, self._stack_of = {}, {}
            path = self.path / STACK_JSON
            raw: Any = {}
            if path.exists():
                try:
                    raw = _load_json(path)
                except DumpError as exc:
                    log.warning("opdiff: %s; stacks unknown", exc)
            for position, (sid, entry) in enumerate(raw.items() if isinstance(raw, dict) else ()):
                if (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], list)
                        and isinstance(entry[1], list)):
                    names, lines = entry            # 8.x/26.x: grouped by identical stack
                    stack_id = int(sid) if str(sid).isdigit() else position
                else:
                    names, lines = [sid], entry     # older: one stack per op name
                    stack_id = position
                frames = _frames.parse_msprobe_frames(lines)
                self._stacks[stack_id] = _frames.user_frames(frames)
                for n in names:
                    self._stack_of[n] = stack_id
        return self._stacks

    def stack(self, stack_id: int | None) -> list[dict[str, Any]]:
        """Frames of one stack id ([] when unknown)."""
        if stack_id is None:
            return []
        return self.stacks().get(stack_id, [])

    # -- tensors ------------------------------------------------------------------------------
    def _tensor_files(self) -> dict[str, str]:
        if self._files is None:
            self._files = {}
            tdir = self.path / TENSOR_DIR
            if tdir.is_dir():
                with os.scandir(tdir) as it:
                    for e in it:
                        if e.name.endswith((".pt", ".npy")) and e.is_file():
                            self._files[_stem(e.name)] = e.name
        return self._files

    @property
    def holds_tensors(self) -> bool:
        """False: its backward tensors do not replay faithfully (see the module's notes)."""
        return False

    def record_count(self) -> int:
        """dump.json's entries, counted by their names without parsing the file."""
        try:
            with dumpfiles.open_file(self.path / DUMP_JSON, self.path) as f:
                if os.fstat(f.fileno()).st_size == 0:
                    return 0
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    return sum(1 for _ in _ENTRY.finditer(data))
        except (OSError, ValueError, DumpError):
            return 0

    def tensor_keys(self) -> list[str]:
        """Keys of every tensor file in dump_tensor_data/."""
        return list(self._tensor_files())

    def tensor(self, key: str) -> Any:
        """The saved tensor for a key (a CPU torch.Tensor), or None if not saved.

        `.pt` files load with `weights_only=True` and `.npy` with `allow_pickle=False`, so an
        untrusted dump cannot run code.
        """
        fname = self._tensor_files().get(key)
        if fname is None:
            return None
        return load_tensor_file(self.path / TENSOR_DIR / fname, self.path)


def load_tensor_file(path: Path, root: Path | None = None) -> Any:
    """A `.pt` or `.npy` tensor file as a CPU torch.Tensor, never unpickling code: `.pt` loads
    with `weights_only=True`, `.npy` with `allow_pickle=False`, each from a regular file inside
    `root` (`store.dumpfiles`). A file that is none of these, or holds something else, raises
    `UnreadableTensor` (a ValueError): that tensor's problem, compared by its statistics, not
    the dump's."""
    import torch

    try:
        with dumpfiles.open_file(path, root) as f:
            if path.suffix == ".npy":
                import numpy as np

                value = torch.from_numpy(np.load(f, allow_pickle=False))
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")     # torch's notes on pickle protocols
                    value = torch.load(f, map_location="cpu", weights_only=True)
    except DumpError as exc:            # not a regular file of the dump
        raise UnreadableTensor(f"cannot load tensor: {exc}") from None
    except pickle.UnpicklingError:
        raise UnreadableTensor(f"{path}: cannot load tensor (a pickle that is not plain tensor "
                               "data; opdiff never runs what a pickle names)") from None
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UnreadableTensor(f"{path}: cannot load tensor ({type(exc).__name__}: "
                               f"{first[:200]})") from None
    if not isinstance(value, torch.Tensor):
        raise UnreadableTensor(f"{path}: holds a {type(value).__name__}, not a tensor")
    return value


def _stem(file_name: str) -> str:
    for ext in (".pt", ".npy"):
        if file_name.endswith(ext):
            return file_name[: -len(ext)]
    return file_name


def _load_json(path: Path) -> Any:
    """Parse a (possibly non-strict: bare NaN/Infinity) JSON file of an msprobe step/rank
    directory, or raise a one-line DumpError (`store.dumpfiles.load`)."""
    return dumpfiles.load(path, path.parent)


def open_msprobe(directory: Path) -> MsprobeDump:
    """Open one msprobe step/rank directory; cheap checks now, full parse on `records()`."""
    path = directory / DUMP_JSON
    try:
        with dumpfiles.open_file(path, directory) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(4096)
            f.seek(max(0, size - 64))
            tail = f.read()
    except OSError as exc:
        raise DumpError(f"{path}: cannot read ({exc.strerror})") from None
    if not head.strip():
        raise DumpError(f"{path}: empty file; the msprobe run wrote no data (did it call debugger.stop()?)")
    if not head.lstrip().startswith(b"{"):
        raise DumpError(f"{path}: not an msprobe dump.json (expected a JSON object)")
    if not tail.rstrip().endswith(b"}"):
        raise DumpError(f"{path}: truncated (does not end with '}}'); the msprobe run was cut short, "
                        "dump this step again")
    meta: dict[str, Any] = {"tool": "msprobe", "config": {}}
    for key in ("task", "level", "framework"):
        m = re.search(rb'"%s"\s*:\s*"([^"]*)"' % key.encode(), head)
        if m:
            meta["config"][key] = m.group(1).decode(errors="replace")
    step, rank = step_rank(directory)
    return MsprobeDump(path=directory, meta=meta, step=step, rank=rank)


FORMAT = DumpFormat(
    name="msprobe", describe="an msprobe dump (step*/rank*/dump.json)",
    detect=lambda file: file.name == DUMP_JSON,
    open=lambda file: open_msprobe(file.parent),
    data_dirs=lambda hits: (TENSOR_DIR,))
