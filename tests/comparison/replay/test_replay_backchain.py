"""Backward region replay (`opdiff.comparison.replay.backchain`): a backward region's forward
calls re-run as a chain from their saved inputs and differentiated with the gradients the target
recorded at the region's outputs (a vector-Jacobian product), in float64 and in their own
dtypes; the region's input gradients are judged against that. Where anything needed is missing
it says why and runs nothing."""
from __future__ import annotations

import copy
from contextlib import nullcontext

import pytest
import torch

import opdiff
from opdiff.comparison.replay.chain import Readers, replay_region
from opdiff.comparison.verdicts import Policy
from opdiff.store.reader import open_dump
from opdiff.testing import inject_fault

ATTENTION = ("Torch.matmul", "Tensor.__mul__", "Torch.softmax")


class Attention(torch.nn.Module):
    """Eager attention written out (what a region holds); `leak`: its weights are also read
    outside it."""

    def __init__(self, n: int = 16, leak: bool = False):
        super().__init__()
        self.proj = torch.nn.Linear(n, n)
        self.leak = leak

    def forward(self, x):
        q = self.proj(x)
        scores = torch.matmul(q, x.transpose(-1, -2)) * 0.25
        weights = torch.softmax(scores, dim=-1)
        out = torch.matmul(weights, x).sum()
        return out + weights.pow(2).sum() if self.leak else out


def _dump(path, fault=None, n=16, rows=8, leak=False, bf16=False):
    torch.manual_seed(0)
    model = Attention(n, leak)
    x = torch.randn(2, rows, n, requires_grad=True)
    planted = inject_fault(op="Torch.matmul", call=0, phase="backward", scale=1.02) \
        if fault else nullcontext()
    with planted:
        with opdiff.dump(model, str(path), level="mix", task="tensor"):
            with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
                loss = model(x)
            loss.backward()
    if fault:
        assert planted.hits == 1       # type: ignore[attr-defined]
    dump = open_dump(str(path / "step0" / "rank0"))
    return dump, list(dump.records())


def _backward(records, *ops):
    """The backward records of the attention's ops, in the order backward ran them."""
    found = [r for r in records if r["op"] in ops and r["phase"] == "backward"
             and r["kind"] == "api"]
    assert [r["op"] for r in found] == ["Torch.matmul", "Torch.softmax", "Tensor.__mul__",
                                        "Torch.matmul"], [r["op"] for r in found]
    return found


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return _dump(tmp_path_factory.mktemp("backchain") / "healthy")


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    return _dump(tmp_path_factory.mktemp("backchain") / "faulty", fault=True)


def _replay(records, members, dump, **kw):
    return replay_region("Region.1.backward", members, Readers(records), dump.tensor, Policy(),
                         **kw)


def test_a_healthy_backward_region_is_replayed_and_cleared(healthy):
    dump, records = healthy
    members = _backward(records, *ATTENTION)
    for shortcut in (True, False):
        local = _replay(records, members, dump, shortcut=shortcut)
        assert local.replayed and not local.culprit, local
        assert local.backward and local.ops == 4
        # judged: the gradients its backward records sent out of the region: q (from the
        # projection), x through the transpose, and x read by the last matmul
        first, last = members[-1]["name"], members[0]["name"]
        assert sorted(t.name for t in local.tensors) == sorted(
            [f"{first}.output.0", f"{first}.output.1", f"{last}.output.1"])
        assert "(a vector-Jacobian product)" in local.describe()
    # float64 on both sides: the target's float32 gradients are within float32's rounding
    assert max(t.error for t in local.tensors) < 1e-5


def test_a_fault_in_one_backward_kernel_is_found(faulty):
    dump, records = faulty
    local = _replay(records, _backward(records, *ATTENTION), dump)
    assert local.replayed and local.culprit, local
    worst = local.worst
    assert worst is not None and worst.name.startswith("Torch.matmul.0.backward.output.")
    assert "scaled by 1.02" in local.describe(), local.describe()
    # the same region judged forward is healthy: the fault is in the backward only
    forward = [r for r in records if r["name"] in {m["forward"] for m in _backward(
        records, *ATTENTION)}]
    assert not replay_region("Region.0.forward", forward, Readers(records), dump.tensor,
                             Policy()).culprit


def test_a_bf16_autocast_backward_region_is_judged_against_its_own_dtypes(tmp_path):
    dump, records = _dump(tmp_path / "bf16", bf16=True)
    local = _replay(records, _backward(records, *ATTENTION), dump, shortcut=False)
    assert local.replayed and not local.culprit, local
    assert "under autocast to bfloat16" in local.reference, local.reference


def _without(records, name, change):
    """The records with one record changed by `change(record)` (a deep copy)."""
    records = copy.deepcopy(records)
    change(next(r for r in records if r["name"] == name))
    return records


def test_what_is_missing_leaves_it_not_replayed_with_the_reason(healthy):
    dump, records = healthy
    members = _backward(records, *ATTENTION)
    first = members[-1]        # the first matmul's backward (backward runs last to first)

    def unlinked(r):
        r["forward"] = "Torch.matmul.99.forward"
    changed = _without(records, first["name"], unlinked)
    local = _replay(changed, _backward(changed, *ATTENTION), dump)
    assert not local.replayed and "names no forward call" in local.reason, local.reason

    def unsaved_input(r):
        r["inputs"][0].pop("key")
    changed = _without(records, first["forward"], unsaved_input)
    local = _replay(changed, _backward(changed, *ATTENTION), dump)
    assert not local.replayed and "was not saved" in local.reason, local.reason

    def unsaved_gradient(r):
        r["inputs"][0].pop("key")
    changed = _without(records, members[0]["name"], unsaved_gradient)
    local = _replay(changed, _backward(changed, *ATTENTION), dump)
    assert not local.replayed, local
    assert "the gradient arriving at Torch.matmul.1.forward.output.0 was not saved" in \
        local.reason, local.reason
    assert local.describe().startswith("not replayed as a chain: ")


def test_an_op_off_the_allow_list_refuses_the_whole_region(healthy, monkeypatch):
    dump, records = healthy
    names = {m["forward"] for m in _backward(records, *ATTENTION)}
    hostile = copy.deepcopy(records)
    for r in hostile:            # a hostile dump: both records of the softmax call name torch.load
        if r["op"] == "Torch.softmax" and (r["name"] in names or r.get("forward") in names):
            r["op"] = "Torch.load"
    members = [r for r in hostile if r["phase"] == "backward" and r.get("forward") in names]
    ran = []
    monkeypatch.setattr(torch, "matmul", lambda *a, **k: ran.append(a))
    local = _replay(hostile, members, dump)
    assert not local.replayed and "untrusted" in local.reason, local
    assert ran == []


def test_an_output_also_read_outside_the_region_is_not_replayed(tmp_path):
    """The softmax's weights are read by the last matmul (inside) and by the loss (outside):
    the gradient arriving from outside alone was never recorded, so nothing is guessed."""
    dump, records = _dump(tmp_path / "leak", leak=True)
    members = _backward(records, *ATTENTION)
    local = _replay(records, members, dump)
    assert not local.replayed, local
    assert "read inside the region and outside it" in local.reason, local.reason
    # without the last matmul the weights leave the region: replayed and cleared
    local = _replay(records, members[1:], dump)
    assert local.replayed and not local.culprit, local


def test_a_backward_region_over_max_tensor_mb_is_not_replayed(tmp_path, monkeypatch):
    dump, records = _dump(tmp_path / "big", n=8, rows=512)    # scores: 2x512x512 float64, 4 MB
    members = _backward(records, *ATTENTION)
    assert _replay(records, members, dump).replayed
    monkeypatch.setenv("OPDIFF_MAX_TENSOR_MB", "1")
    local = _replay(records, members, dump)
    assert not local.replayed and "max-tensor-mb" in local.reason.lower(), local.reason
