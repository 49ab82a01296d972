"""From the step and module trend found to the op-level tools: a config.json for the next run.

    config = next_dump_config(step=412, module="blocks.7.mlp", module_type="Mlp", rank=0)
    write_next_dump(config, "out")       # out/next_dump.json
    dbg = opdiff.PrecisionDebugger(config_path="out/next_dump.json", dump_path="./dump/npu")

The file uses msprobe's config.json keys, which opdiff.PrecisionDebugger reads: the step to
dump, the rank, level mix, and a scope that opens when the module is called and closes when it
returns (its own ops, and their backward, are inside). For the optimizer, whose ops run outside
any module, the whole step at level L1; for inf/NaN in one run, the overflow check, which stops
at the op that creates it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..monitor.stream import write_json_atomic

NEXT_DUMP = "next_dump.json"


def module_record(module: str, module_type: Optional[str]) -> Optional[str]:
    """The name opdiff's capture gives a module's forward calls, without the call counter:
    `Module.blocks.7.mlp.Mlp.forward` (a scope or list entry matches every call)."""
    if not module_type:
        return None
    return f"Module.{module}.{module_type}.forward"


def next_dump_config(step: int, module: Optional[str] = None, module_type: Optional[str] = None,
                     rank: int = 0, task: str = "statistics",
                     dump_path: Optional[str] = None) -> dict:
    """msprobe-style config for dumping `step` around `module` (None or "optimizer": no scope)."""
    dump_path = dump_path or f"./dump/step{step}"
    if task == "overflow_check":
        return {"task": "overflow_check", "dump_path": dump_path, "level": "mix",
                "step": [step], "rank": [rank], "overflow_check": {"overflow_nums": 1}}
    record = None
    if module not in (None, "optimizer", "loss", "grad_norm"):
        record = module_record(module, module_type)
    level = "mix" if record else "L1"
    return {"task": task, "dump_path": dump_path, "level": level, "step": [step], "rank": [rank],
            task: {"scope": [record, record] if record else [], "list": [],
                   "data_mode": ["all"]}}


def write_next_dump(config: dict, output) -> Path:
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    path = out / NEXT_DUMP
    write_json_atomic(path, config)
    return path
