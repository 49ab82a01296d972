"""Two recorded runs of a tiny MLP, one with a fault planted below the recorder, compared."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

import opdiff
from opdiff.testing import inject_fault


def train(dump: Path, task: str = "tensor", fault: Optional[dict] = None,
          config: Optional[Path] = None, level: str = "mix") -> Path:
    """One recorded training step of the MLP into `dump` (a PrecisionDebugger of `config` when
    given, else `level` and `task`)."""
    opdiff.seed_all(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 16),
                                torch.nn.Tanh(), torch.nn.Linear(16, 4))
    x, y = torch.randn(32, 8), torch.randn(32, 4)
    planted = inject_fault(**fault) if fault else None
    if planted is not None:
        planted.__enter__()
    try:
        if config is not None:
            dbg = opdiff.PrecisionDebugger(config_path=str(config), dump_path=str(dump))
        else:
            dbg = opdiff.PrecisionDebugger(dump_path=str(dump), task=task, level=level)
        dbg.start(model)
        torch.nn.functional.mse_loss(model(x), y).backward()
        dbg.stop()
        dbg.step()
    finally:
        if planted is not None:
            planted.__exit__(None, None, None)
    return dump


def compare(root: Path, name: str = "out"):
    return opdiff.compare(root / "target", root / "golden", output_path=root / name, progress=False)


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text(encoding="utf-8"))
