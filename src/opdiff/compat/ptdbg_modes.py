"""How ptdbg_ascend's modes map onto opdiff's PrecisionDebugger, and where their files go.

A `Run` is one native opdiff debugger writing into ptdbg_ascend's layout
`dump_path/{dump_tag}_v4.0[/{mode}]/step{S}/rank{R}/`; when a step closes it adds the legacy
files (`{mode_}dump.pkl`, `{mode_}dump/`, `stack.json` in stack mode) next to the opdiff dump.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ..errors import ConfigError
from ..store.schema import RecordName
from . import legacy_files

log = logging.getLogger("opdiff")

LEGACY_VERSION = "v4.0"         # the folder name scripts written for ptdbg_ascend 4.0 point at
MODES = ("all", "list", "range", "stack", "acl", "api_list", "api_stack")
_WHOLE_NETWORK_MODES = ("all", "api_stack")
_warned: set = set()


def warn_once(key: str, message: str, *args) -> None:
    """Say once per process what opdiff does instead of a legacy option."""
    if key not in _warned:
        _warned.add(key)
        log.warning("opdiff: " + message, *args)


# -- what one mode records --------------------------------------------------------------------
def selection(mode: str | None, scope, api_list) -> dict:
    """Native PrecisionDebugger options (scope/list/task) for one ptdbg_ascend mode."""
    mode = mode or "all"
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    scope = _names("scope", scope)
    api_list = _names("api_list", api_list)
    if mode == "acl":
        warn_once("acl", "mode='acl' (ACL operator dumps) exists only on Ascend; opdiff records "
                   "the APIs in scope with their full tensors at the torch API level instead "
                   "(for aten-level records use opdiff.PrecisionDebugger(level='L2'))")
        return {"list": scope, "task": "tensor"}
    if mode == "list":
        return {"list": scope, "task": "tensor"}
    if mode == "range":
        if len(scope) != 2:
            raise ConfigError(f"mode='range' needs scope=[first_api, last_api]; got {scope!r}")
        return {"scope": scope, "task": "tensor"}
    if mode == "stack":
        # Call sites only: two names are ptdbg's range form, any other number a list of APIs.
        if len(scope) == 2:
            return {"scope": scope, "task": "statistics"}
        return {"list": scope, "task": "statistics"}
    if mode == "api_list":
        if not api_list:
            raise ConfigError("mode='api_list' needs api_list=[...], e.g. api_list=['relu']")
        return {"list": api_list, "task": "tensor"}
    return {"task": "tensor"}       # all, api_stack: the whole network (opdiff always keeps stacks)


def _names(key: str, value) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key} must be a list of API names such as ['Tensor___iadd___forward']; "
                          f"got {value!r}")
    return list(value)


def data_mode(value) -> list:
    """ptdbg's dump_mode / input_output_mode ("all", "forward", "backward", ...) -> data_mode."""
    if value is None:
        return ["all"]
    return [value] if isinstance(value, str) else list(value)


class Run:
    """One native opdiff debugger writing into ptdbg_ascend's layout, plus its legacy files."""

    def __init__(self, base: Path, mode: str, level: str, native: dict):
        from ..capture.debugger import PrecisionDebugger as Native

        self.mode = mode
        self.prefix = "" if mode == "all" else f"{mode}_"
        self.root = base if mode in _WHOLE_NETWORK_MODES else base / mode
        self.stack_only = mode == "stack"
        self.dbg = Native(dump_path=str(self.root), level=level, **native)
        self.open_dir = None        # the step being written (overflow_check may close it early)

    def start(self, model=None) -> None:
        self.dbg.start(model)
        self.open_dir = self.dbg.dump_dir or self.open_dir

    @property
    def closed_early(self) -> bool:
        """overflow_check stopped the run: its dump is complete, the legacy files are due."""
        return self.open_dir is not None and self.dbg.dump_dir is None

    def stop(self) -> None:
        self.dbg.stop()

    def step(self) -> None:
        """Close the step and write its legacy files."""
        directory = self.dbg.dump_dir or self.open_dir
        self.dbg.step()
        self.open_dir = None
        if directory is None:
            return
        try:
            pkl = legacy_files.write_ptdbg_files(directory, self.prefix, self.stack_only)
        except Exception as exc:   # the opdiff dump is complete; only the legacy view failed
            log.warning("opdiff: could not write the ptdbg_ascend files in %s (%s)", directory, exc)
            return
        if self.stack_only:
            log_stacks(Path(directory))
        log.info("opdiff: wrote %s", pkl)


def log_stacks(directory: Path) -> None:
    """Say where the matched APIs were called from, one line per call site."""
    sites: dict = {}
    for name, frames in json.loads((directory / "stack.json").read_text()).items():
        f = frames[0]
        parsed = RecordName.parse(name)
        op = parsed.op if parsed is not None else name
        sites.setdefault((op, f["file"], f["line"], f["code"]), []).append(name)
    for (op, file, line, code), names in sites.items():
        log.info("opdiff: %s (%d calls) at %s:%s `%s`", op, len(names), file, line, code)
    if not sites:
        log.warning("opdiff: stack mode recorded no call matching the scope; check the API names "
                    "against the compare CSV (for example Tensor___iadd___forward)")


def dump_base(dump_path, tag: str) -> Path:
    if dump_path is None or not str(dump_path):
        raise ConfigError("set a dump path first: set_dump_path('./dump_data/npu')")
    p = Path(dump_path)
    if p.is_file():
        raise ConfigError(f"dump path {p} is a file; give a directory")
    # Absolute: a script that changes directory later still writes where it said.
    return Path(os.path.abspath(p)) / f"{tag}_{LEGACY_VERSION}"


def check_fresh(root: Path) -> None:
    """Refuse early, before training starts, to write into an earlier run's dump."""
    from ..store import layout
    from ..capture.session import current_rank
    directory = layout.rank_dir(root, 0, current_rank())
    if (directory / layout.RECORDS).exists():
        raise ConfigError(f"{directory} already holds a dump from an earlier run; remove it or "
                          f"pass another dump_tag to set_dump_path")
