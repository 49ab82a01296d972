"""Helpers for the capture tests: read a dump back strictly, index its records."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from opdiff.store import decoded_stats, open_dump
from opdiff.store import layout
from opdiff.store.schema import complete
from statskit import expected_stats


def _reject_constant(token):
    raise ValueError(f"bare {token} in strict JSON")


def strict_json_lines(path) -> list:
    """Parse a JSON Lines file, rejecting the NaN/Infinity tokens Python's json accepts by default."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            out.append(json.loads(line, parse_constant=_reject_constant))
    return out


class DumpView:
    """One step/rank of a dump, read strictly, with records indexed by name."""

    def __init__(self, directory):
        self.dir = Path(directory)
        self.dump = open_dump(self.dir)
        self.records = strict_json_lines(self.dir / layout.RECORDS)
        # (the reader completes each record with its defaults, store/schema.complete)
        assert [complete(copy.deepcopy(r)) for r in self.records] == list(self.dump.records()), \
            "reader and strict parse disagree"
        self.meta = json.loads((self.dir / layout.META).read_text(), parse_constant=_reject_constant)
        self.by_name = {}
        for r in self.records:
            assert r["name"] not in self.by_name, f"duplicate record name {r['name']}"
            self.by_name[r["name"]] = r

    def __getitem__(self, name):
        return self.by_name[name]

    def names(self, kind=None, phase=None) -> list:
        return [r["name"] for r in self.records
                if (kind is None or r["kind"] == kind) and (phase is None or r["phase"] == phase)]

    def ops(self, kind=None, phase=None) -> list:
        return [r["op"] for r in self.records
                if (kind is None or r["kind"] == kind) and (phase is None or r["phase"] == phase)]

    def with_op(self, op, phase="forward") -> list:
        return [r for r in self.records if r["op"] == op and r["phase"] == phase]

    def tensor(self, desc):
        return self.dump.tensor(desc["key"])


@pytest.fixture
def read_dump():
    """read_dump(dump_root, step=0, rank=0) -> DumpView."""
    def read(root, step: int = 0, rank: int = 0) -> DumpView:
        return DumpView(layout.rank_dir(root, step, rank))
    return read


def assert_stats(desc: dict, t: torch.Tensor, rel: float = 1e-6, what: str = "") -> None:
    """A descriptor's statistics equal the tensor's, computed in float64 here."""
    got = decoded_stats(desc)
    want = expected_stats(t)
    # The mean of values that cancel (a BatchNorm output) is tiny next to its terms: judge it
    # against the size of the terms, as float32 accumulation can only be that exact.
    x = t.detach().to(torch.float64)
    scale = x[torch.isfinite(x)].abs().mean().item() if x.numel() and torch.isfinite(x).any() else 0.0
    assert desc["dtype"] == str(t.dtype).replace("torch.", ""), what
    assert desc["shape"] == list(t.shape), what
    for k in ("nan", "inf"):
        assert got[k] == want[k], f"{what} {k}: {got[k]} != {want[k]}"
    for k in ("max", "min", "mean", "norm"):
        a, b = got[k], want[k]
        if math.isnan(b):
            assert math.isnan(a), f"{what} {k}: {a} != nan"
        elif math.isinf(b):
            assert a == b, f"{what} {k}: {a} != {b}"
        else:
            tol = max(1e-12, rel * scale) if k == "mean" else 1e-12
            assert a == pytest.approx(b, rel=rel, abs=tol), f"{what} {k}: {a} != {b}"


@pytest.fixture
def strict_lines():
    """strict_lines(path) -> parsed JSON Lines, rejecting bare NaN/Infinity."""
    return strict_json_lines


@pytest.fixture
def check_stats():
    return assert_stats


@pytest.fixture(autouse=True)
def capture_leaves_nothing_behind():
    """After every capture test: no global module hook, no torch-function or dispatch mode and no
    running debugger left over (opdiff must always clean up, even after errors). The global
    module hooks of level mix/L0 stay between steps and go with their debugger or model
    (capture/modules.py): the test's own are gone once collected."""
    import gc

    import torch.nn.modules.module as nn_module

    from opdiff.capture import debugger

    def state():
        return (len(nn_module._global_forward_hooks), len(nn_module._global_forward_pre_hooks),
                torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack())

    before = state()
    if before != (0, 0, 0, 0):     # hooks of debuggers earlier tests dropped (another directory's
        gc.collect()                # tests in this worker): collected now, not during this test
        before = state()
    yield
    after = state()
    if after != before:
        gc.collect()
        after = state()
    active = debugger._active
    debugger._active = None   # do not let one leak fail every later test
    assert after == before, f"left behind (fwd hooks, pre hooks, function modes, dispatch modes): {after}"
    assert active is None, "a debugger is still marked running"
