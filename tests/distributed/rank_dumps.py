"""Real multi-rank dump roots of a small MLP, laid out without a process group (`step{S}/rank{R}`
directories written by one process): shared by conftest.py's two-step tensor roots and the
streaming tests' statistics roots. The gloo tests (test_ddp_bucket, test_fsdp_tp,
tests/capture/test_capture_distributed.py) run real process groups.

    dump_ranks(tmp / "target", task="tensor", ranks=2, steps=2, faulty={0})   # rank1 copies rank0
    dump_ranks(tmp / "target", task="statistics", ranks=3, hidden=2, faulty={2}, call=1,
               own_inputs=True)                                            # each rank its batch
"""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Collection

import torch

import opdiff
from opdiff.testing.faults import inject_fault


def mlp(hidden: int) -> torch.nn.Module:
    """Linear(8, 16), then `hidden` times GELU + Linear, the last one to 2 outputs."""
    layers: list[torch.nn.Module] = [torch.nn.Linear(8, 16)]
    for i in range(hidden):
        layers += [torch.nn.GELU(), torch.nn.Linear(16, 2 if i == hidden - 1 else 16)]
    return torch.nn.Sequential(*layers)


def dump_ranks(root: Path, *, task: str, ranks: int, steps: int = 1, hidden: int = 1,
               faulty: Collection[int] = (), call: int = 0, own_inputs: bool = False) -> Path:
    """A dump root of `ranks` ranks and `steps` steps (L1, `task`), one forward and backward
    each step, gelu call `call` scaled by 1.05 on the ranks in `faulty`.

    own_inputs: every rank is its own run with its own batch (seed 100 + rank), as data-parallel
    ranks are; otherwise rank 0 runs and the other ranks' directories are copies of it."""
    runs = range(ranks) if own_inputs else range(1)
    for r in runs:
        torch.manual_seed(0)
        model = mlp(hidden)
        if own_inputs:
            torch.manual_seed(100 + r)
        tmp = root / f"_r{r}"
        dbg = opdiff.PrecisionDebugger(dump_path=str(tmp), level="L1", task=task)
        for _ in range(steps):
            x = torch.randn(4, 8)
            fault = inject_fault("Functional.gelu", call=call, scale=1.05) if r in faulty \
                else contextlib.nullcontext()
            with fault:
                dbg.start()
                model(x).sum().backward()
                dbg.stop()
            dbg.step()
        for step in range(steps):
            for dest in ([r] if own_inputs else range(ranks)):
                shutil.copytree(tmp / f"step{step}" / "rank0", root / f"step{step}" / f"rank{dest}")
        shutil.rmtree(tmp)
    return root
