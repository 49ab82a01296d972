"""CUDA tests: collected everywhere, run only where `torch.cuda.is_available()`.

Every test here is marked `cuda` (`pytest -m cuda tests/cuda`); on a machine without a CUDA
device each one is skipped with the reason, so CI sees them collected. `benchmarks/gpu_check.sh`
runs them on a lent GPU. Shared here: the float64 reference statistics and a dump reader.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

from opdiff.store import decoded_stats, open_dump
from statskit import expected_stats

# cuBLAS reads this when its first handle is made: set before any test touches CUDA, so that
# the observer tests' deterministic mode can hold (test_cuda_observer.py).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="no CUDA device here (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


def assert_close_stats(desc: dict, t: torch.Tensor, rel: float, what: str) -> None:
    """desc's statistics equal t's float64 reference: counts, max and min exactly (they are
    values of t), mean and norm within `rel` (the mean relative to the mean magnitude)."""
    got, want = decoded_stats(desc), expected_stats(t)
    x = t.detach().cpu().to(torch.float64)
    fin = x[torch.isfinite(x)]
    scale = fin.abs().mean().item() if fin.numel() else 0.0
    for k in ("nan", "inf"):
        assert got[k] == want[k], f"{what} {k}: {got[k]} != {want[k]}"
    for k in ("max", "min", "mean", "norm"):
        a, b = got[k], want[k]
        if math.isnan(b) or math.isinf(b):
            assert (math.isnan(a) and math.isnan(b)) or a == b, f"{what} {k}: {a} != {b}"
        elif k in ("max", "min"):
            assert a == b, f"{what} {k}: {a} != {b}"
        else:
            tol = rel * scale if k == "mean" else 0.0
            assert a == pytest.approx(b, rel=rel, abs=max(tol, 1e-300)), f"{what} {k}: {a} != {b}"


@pytest.fixture
def records():
    """records(step_rank_dir) -> {name: record} of a dump."""
    def read(path) -> dict:
        return {r["name"]: r for r in open_dump(path).records()}
    return read


@pytest.fixture
def close_stats():
    """close_stats(desc, tensor, rel, what): see assert_close_stats."""
    return assert_close_stats
