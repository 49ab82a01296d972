"""Real two-step, two-rank dumps of a small MLP (a gelu fault planted in the target), shared by
the incomplete-dump and Ray engine tests. The rank1 directories are copies of rank0's: laying
out a two-rank root needs no process group (the gloo tests in tests/capture run real ones)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import opdiff
from opdiff.testing.faults import inject_fault


def _run(root: Path, fault: bool = False) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
    dbg = opdiff.PrecisionDebugger(dump_path=str(root), level="L1", task="tensor")
    for _ in range(2):
        x = torch.randn(4, 8)
        with inject_fault("Functional.gelu", call=0, scale=1.05) if fault else _nothing():
            dbg.start()
            model(x).sum().backward()
            dbg.stop()
        dbg.step()
    for step in (0, 1):
        shutil.copytree(root / f"step{step}" / "rank0", root / f"step{step}" / "rank1")
    return root


class _nothing:  # noqa: N801
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture(scope="session")
def roots(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("incomplete")
    return _run(tmp / "target", fault=True), _run(tmp / "golden")


