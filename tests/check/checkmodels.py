"""Dumps of the replay tests' tiny real models (a residual CNN with BatchNorm, an LSTM, a
2-layer transformer encoder) in fp32, bf16 autocast or fp16, with an optional planted fault."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "comparison" / "replay"))
import replay_models  # noqa: E402

import opdiff  # noqa: E402
import opdiff.testing  # noqa: E402

MODELS = ("cnn", "lstm", "transformer")


def dump(name: str, path: Path, precision: str = "fp32", fault: dict | None = None,
         task: str = "tensor") -> Path:
    """One forward+backward step dumped at level mix; returns the step/rank directory.
    precision: "fp32", "bf16" (CPU autocast; the LSTM, which CPU autocast leaves in fp32, is
    cast to bf16 instead) or "fp16" (the model and input cast to fp16)."""
    model, x = replay_models.make(name)
    autocast = precision == "bf16" and name != "lstm"
    if precision == "fp16":
        model, x = model.half(), x.half()
    elif precision == "bf16" and not autocast:
        model, x = model.bfloat16(), x.bfloat16()
    ctx = opdiff.testing.inject_fault(**fault) if fault else contextlib.nullcontext()
    with ctx, opdiff.dump(model, path, level="mix", task=task):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(x)
        out.float().pow(2).mean().backward()
    return path / "step0" / "rank0"
