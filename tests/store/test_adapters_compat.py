"""The legacy files opdiff's compat layer writes read back through discover() with every name.

opdiff.compat writes ptdbg_ascend's `dump.pkl` and torch_npu.hooks' `.pkl` from an opdiff dump;
reading them back must give the same records, tensor names, statistics and values.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import opdiff
from opdiff.store.schema import Kind
from opdiff.store import decoded_stats, iter_tensors, open_dump
from opdiff.store.adapters import discover

legacy_files = pytest.importorskip("opdiff.compat.legacy_files")


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        out = self.conv(x)
        out += 1.0
        return self.fc(torch.relu(out).mean(dim=(2, 3)))


@pytest.fixture(scope="module")
def opdiff_dump(tmp_path_factory):
    root = tmp_path_factory.mktemp("compat") / "dump"
    torch.manual_seed(0)
    model, x = _Net(), torch.randn(2, 2, 4, 4)
    with opdiff.dump(model, root, level="mix", task="tensor"):
        F.mse_loss(model(x), torch.zeros(2, 2)).backward()
    return root


def _tensors(dump):
    # Leaf records (parameters and inputs at their first read) are opdiff's own: the legacy
    # formats never had them, and their writers leave them out.
    return [(name, desc) for r in dump.records() if r.get("kind") != Kind.LEAF
            for name, _, desc in iter_tensors(r)]


def test_ptdbg_dump_pkl_written_by_opdiff_reads_back(opdiff_dump):
    rank = opdiff_dump / "step0" / "rank0"
    pkl = legacy_files.write_ptdbg_files(rank)
    original, (legacy,) = open_dump(rank), discover(pkl)
    assert legacy.format == "ptdbg_ascend"
    ours, theirs = _tensors(original), _tensors(legacy)
    assert [n for n, _ in theirs] == [n for n, _ in ours] and len(ours) > 20
    for (name, a), (_, b) in zip(ours, theirs):
        sa, sb = decoded_stats(a), decoded_stats(b)
        assert (b["dtype"], b["shape"]) == (a["dtype"], a["shape"]), name
        for k in ("max", "min", "mean", "norm"):
            assert sb[k] == pytest.approx(sa[k], nan_ok=True), (name, k)
    iadd = next(r for r in legacy.records() if r["op"] == "Tensor.__iadd__")
    assert legacy.stack(iadd["stack"])[0]["code"] == "out += 1.0"
    # The opdiff dump in the same directory still wins when the directory is opened.
    assert discover(rank)[0].format == "opdiff"


def test_torch_npu_hooks_pkl_written_by_opdiff_reads_back(opdiff_dump, tmp_path):
    pkl = tmp_path / "npu_module_op.pkl"
    assert legacy_files.write_hooks_pkl(opdiff_dump, pkl) > 20
    original, (legacy,) = open_dump(opdiff_dump / "step0" / "rank0"), discover(pkl)
    assert legacy.format == "torch_npu_hooks"
    saved = {n: d for n, d in _tensors(original) if "key" in d}
    theirs = _tensors(legacy)
    assert [n for n, _ in theirs] == list(saved)
    for name, desc in theirs:
        expected = original.tensor(saved[name]["key"])
        assert torch.equal(legacy.tensor(desc["key"]), expected), name
