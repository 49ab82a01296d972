"""DumpConfig: what to capture, validated once, with errors that name the offending key.

Accepts the keyword arguments of `PrecisionDebugger` and msprobe's / ptdbg_ascend's config.json:

    {"task": "statistics", "dump_path": "./dump", "rank": [], "step": [0], "level": "mix",
     "statistics": {"scope": [], "list": [], "data_mode": ["all"]},
     "tensor": {"scope": [], "list": [], "data_mode": ["all"]},
     "overflow_check": {"overflow_nums": 1}}
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List

from .errors import ConfigError

log = logging.getLogger("opdiff")

TASKS = ("statistics", "tensor", "overflow_check")
LEVELS = ("L0", "L1", "mix", "L2")
DATA_MODES = ("all", "forward", "backward", "input", "output")

# config.json keys msprobe accepts that have no meaning off Ascend or in opdiff: accepted, and
# what opdiff does instead is said once.
_IGNORED_KEYS = {
    "is_deterministic": "use opdiff.seed_all(deterministic=True) instead",
    "enable_dataloader": "call dbg.step() at the end of each step instead",
    "acl_config": "ACL dumps exist only on Ascend; use level='L2' for aten-level capture",
    "async_dump": "opdiff always batches statistics and writes tensors in the background",
    "extra_info": "opdiff always records call stacks and module structure",
    "precision": "opdiff always accumulates statistics in float32 or wider",
    "framework": "opdiff is PyTorch-only",
    "seed": "use opdiff.seed_all(seed) instead",
    "dump_enable": "use dbg.start()/dbg.stop() instead",
    "risk_level": "opdiff records every API call",
    "custom_op_namespaces": "opdiff sees every torch API call without registration",
}
_TASK_KEYS = {"scope", "list", "data_mode", "overflow_nums", "check_mode", "summary_mode",
              "tensor_list", "file_format", "backward_input", "online_run_ut", "nfs_path",
              "is_print_compare_log"}
_IGNORED_TASK_KEYS = {"check_mode", "summary_mode", "tensor_list", "file_format",
                      "backward_input", "online_run_ut", "nfs_path", "is_print_compare_log"}


def _int_list(key: str, value) -> list[int]:
    """msprobe's step/rank values: a list of ints and "a-b" ranges; [] or None means all."""
    if value is None:
        return []
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"'{key}' must be a list of integers, e.g. [0, 1] or [\"0-4\"]; got {value!r}")
    out: list[int] = []
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            out.append(item)
        elif isinstance(item, str) and "-" in item:
            lo, _, hi = item.partition("-")
            if not (lo.strip().isdigit() and hi.strip().isdigit()) or int(lo) > int(hi):
                raise ConfigError(f"'{key}' range {item!r} must look like \"2-5\"")
            out.extend(range(int(lo), int(hi) + 1))
        else:
            raise ConfigError(f"'{key}' entries must be non-negative integers or \"a-b\" ranges; got {item!r}")
    return sorted(set(out))


def _str_list(key: str, value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"'{key}' must be a list of strings; got {value!r}")
    return list(value)


@dataclass
class DumpConfig:
    """Validated capture settings. Build with `DumpConfig.create(...)` or `DumpConfig.from_file(path)`."""

    dump_path: str = "./dump"
    task: str = "statistics"
    level: str = "L1"
    step: List[int] = field(default_factory=list)   # [] = every step
    rank: List[int] = field(default_factory=list)   # [] = every rank
    scope: List[str] = field(default_factory=list)  # [first_name, last_name] or []
    list: List[str] = field(default_factory=list)   # names or substrings; [] = everything
    data_mode: List[str] = field(default_factory=lambda: ["all"])
    overflow_nums: int = 1

    @classmethod
    def create(cls, **kwargs) -> "DumpConfig":
        unknown = set(kwargs) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise ConfigError(f"unknown option '{sorted(unknown)[0]}' (valid: "
                              f"{', '.join(cls.__dataclass_fields__)})")
        cfg = cls(**{k: v for k, v in kwargs.items() if v is not None})
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"'task' must be one of {', '.join(TASKS)}; got {self.task!r}")
        if self.level not in LEVELS:
            raise ConfigError(f"'level' must be one of {', '.join(LEVELS)}; got {self.level!r}")
        if not isinstance(self.dump_path, (str, os.PathLike)) or not str(self.dump_path):
            raise ConfigError("'dump_path' must be a directory path")
        self.dump_path = str(self.dump_path)
        if Path(self.dump_path).is_file():
            raise ConfigError(f"'dump_path' {self.dump_path} is a file; give a directory")
        self.step = _int_list("step", self.step)
        self.rank = _int_list("rank", self.rank)
        self.scope = _str_list("scope", self.scope)
        if self.scope and len(self.scope) != 2:
            raise ConfigError(f"'scope' must name exactly two ops (first and last); got {self.scope!r}")
        self.list = _str_list("list", self.list)
        self.data_mode = _str_list("data_mode", self.data_mode) or ["all"]
        for mode in self.data_mode:
            if mode not in DATA_MODES:
                raise ConfigError(f"'data_mode' entries must be among {', '.join(DATA_MODES)}; got {mode!r}")
        if not isinstance(self.overflow_nums, int) or isinstance(self.overflow_nums, bool) or \
                self.overflow_nums == 0 or self.overflow_nums < -1:
            raise ConfigError(f"'overflow_nums' must be a positive integer or -1 (never stop); "
                              f"got {self.overflow_nums!r}")

    @classmethod
    def from_file(cls, path: str | os.PathLike, **overrides) -> "DumpConfig":
        """Load msprobe's config.json; keyword arguments given to the debugger take precedence."""
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} not found")
        try:
            raw = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{p}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{p}: expected a JSON object at the top level")
        values: dict = {}
        for key, value in raw.items():
            if key in ("task", "dump_path", "level", "step", "rank"):
                values[key] = value
            elif key in TASKS:
                if not isinstance(value, dict):
                    raise ConfigError(f"{p}: '{key}' must be an object")
                for sub in value:
                    if sub not in _TASK_KEYS:
                        raise ConfigError(f"{p}: unknown key '{key}.{sub}' (valid: "
                                          f"{', '.join(sorted(_TASK_KEYS - _IGNORED_TASK_KEYS))})")
                    if sub in _IGNORED_TASK_KEYS:
                        log.warning("opdiff: config key '%s.%s' has no effect in opdiff", key, sub)
                    elif key == raw.get("task", "statistics") or sub == "overflow_nums":
                        values[sub] = value[sub]
            elif key in _IGNORED_KEYS:
                log.warning("opdiff: config key '%s' is accepted but ignored: %s", key, _IGNORED_KEYS[key])
            else:
                raise ConfigError(f"{p}: unknown key '{key}' (valid: task, dump_path, level, step, "
                                  f"rank, {', '.join(TASKS)})")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.create(**values)

    def as_dict(self) -> dict:
        return asdict(self)
