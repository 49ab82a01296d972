"""The files ptdbg_ascend and torch_npu.hooks users look for, written from an opdiff dump.

opdiff always records into its own dump (records.jsonl, stacks.jsonl, safetensors); these
writers translate one finished step/rank of it into the legacy files a seed user's script or
habits expect, next to it:

- `write_ptdbg_files(dump_dir, prefix)`: ptdbg_ascend's `{prefix}dump.pkl` (JSON lines:
  `[name, step, [], dtype, shape, [max, min, mean, norm]]` per tensor and
  `[name_stack_info, [[file, line, function, code], ...]]` per op), `{prefix}dump` (a link to the saved tensors) and,
  for stack mode, `stack.json` (`{op name: [{"file", "line", "function", "code"}, ...]}`).
- `write_hooks_pkl(dump_dir, pkl_path)`: torch_npu.hooks' `.pkl`, one JSON line per tensor,
  `[name, flat data, dtype, shape]`, which the seed reads back with `json.loads`.

`dump_for_pkl(pkl_path)` goes the other way: the opdiff dump a legacy file was written from.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..store import layout
from ..store.reader import open_dump
from ..store.records import decoded_stats, iter_tensors
from ..store.schema import API_PREFIXES, Kind, RecordName

log = logging.getLogger("opdiff")

# torch_npu.hooks keeps its opdiff dump in a folder named after the .pkl: a.pkl -> a.opdiff/
HOOKS_DUMP_SUFFIX = ".opdiff"

def legacy_records(dump):
    """The records the legacy tools had: op calls. Leaves (a parameter, buffer or input that
    opdiff records once before its first read, capture/leaves.py) were never in their files."""
    return (r for r in dump.records() if r["kind"] != Kind.LEAF)


def legacy_op_name(name: str) -> str:
    """opdiff's `Tensor.__iadd__.0.forward` as ptdbg_ascend wrote it: `Tensor___iadd___0_forward`.

    Module and parameter-gradient records had no ptdbg_ascend name; they keep opdiff's.
    """
    parsed = RecordName.parse(name)
    if parsed is None or parsed.kind not in (Kind.API, Kind.ATEN) or parsed.text != name:
        return name
    prefix, _, api = parsed.op.partition(".")
    if prefix not in API_PREFIXES or not api:
        return name
    return f"{prefix}_{api}_{parsed.index}_{parsed.phase}"


def legacy_tensor_name(record_name: str, tensor_name: str) -> str:
    """`Tensor.__iadd__.0.forward.input.0` -> `Tensor___iadd___0_forward_input.0`."""
    legacy = legacy_op_name(record_name)
    if legacy == record_name:
        return tensor_name
    rest = tensor_name[len(record_name) + 1:]           # "input.0", "output.0.1", "parameters.weight"
    return f"{legacy}_{rest}"


def write_ptdbg_files(dump_dir: str | os.PathLike, prefix: str = "", stack_only: bool = False) -> Path:
    """Write ptdbg_ascend's `{prefix}dump.pkl` (and friends) into one step/rank directory."""
    dump = open_dump(dump_dir)
    directory = Path(dump_dir)
    pkl = directory / f"{prefix}dump.pkl"
    stacks: dict[str, list] = {}
    with open(pkl, "w", encoding="utf-8") as f:
        for record in legacy_records(dump):
            frames = dump.stack(record["stack"])
            if frames:
                stacks[record["name"]] = frames
                legacy = legacy_op_name(record["name"])
                if legacy != record["name"]:     # ptdbg_ascend kept call sites of APIs only
                    frames_out = [[fr["file"], str(fr["line"]), fr["function"], fr["code"]] for fr in frames]
                    f.write(json.dumps([f"{legacy}_stack_info", frames_out], ensure_ascii=False) + "\n")
            if stack_only:
                continue
            for tensor_name, _, desc in iter_tensors(record):
                s = decoded_stats(desc)
                summary = [s.get("max"), s.get("min"), s.get("mean"), s.get("norm")]
                line = [legacy_tensor_name(record["name"], tensor_name), dump.step or 0, [],
                        f"torch.{desc.get('dtype')}", desc.get("shape"), summary]
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
    if stack_only:
        (directory / "stack.json").write_text(json.dumps(stacks, indent=1, ensure_ascii=False))
    tensors = directory / layout.TENSORS
    data_dir = directory / f"{prefix}dump"
    if tensors.is_dir() and not data_dir.exists():
        try:
            os.symlink(layout.TENSORS, data_dir, target_is_directory=True)
        except OSError as exc:  # a filesystem without links: the tensors stay in tensors/
            log.info("opdiff: could not link %s to %s (%s)", data_dir, tensors, exc)
    return pkl


def write_hooks_pkl(dump_root: str | os.PathLike, pkl_path: str | os.PathLike) -> int:
    """Write torch_npu.hooks' JSON-lines `.pkl` with every saved tensor; returns the line count.

    Every step under dump_root goes in, in order: a script that set the same path twice got
    both recordings appended, as with the original tool.
    """
    from ..store.reader import find_dumps

    count = 0
    tmp = Path(f"{pkl_path}.partial")
    with open(tmp, "w", encoding="utf-8") as f:
        for directory in find_dumps(dump_root):
            dump = open_dump(directory)
            for record in legacy_records(dump):
                for tensor_name, _, desc in iter_tensors(record):
                    t = dump.tensor(desc["key"]) if "key" in desc else None
                    if t is None:
                        continue
                    data = t.detach().reshape(-1).float().tolist()
                    f.write(json.dumps([tensor_name, data, f"torch.{desc.get('dtype')}", list(t.shape)]) + "\n")
                    count += 1
    os.replace(tmp, pkl_path)   # whole or absent: a crash never leaves half a .pkl
    return count


def dump_for_pkl(pkl_path: str | os.PathLike) -> Path | None:
    """The opdiff dump directory a legacy `.pkl` written by opdiff.compat came from, or None.

    ptdbg_ascend files sit inside their step/rank dump; a torch_npu.hooks `a.pkl` has its dump
    in `a.opdiff/`. A `.pkl` written by the real legacy tools has neither.
    """
    p = Path(pkl_path)
    if (p.parent / layout.RECORDS).exists():
        return p.parent
    sidecar = p.with_suffix(HOOKS_DUMP_SUFFIX)
    if sidecar.is_dir():
        from ..store.reader import find_dumps
        if find_dumps(sidecar):
            return sidecar
    return None
