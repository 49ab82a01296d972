"""Region replay (`opdiff.comparison.replay.chain`): a chain of recorded ops re-run from its
saved inputs in float64 and in its own dtypes, fed by the dump's dataflow; where it cannot run,
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


class Attention(torch.nn.Module):
    """Eager attention written out: matmul, softmax, matmul (what a region holds)."""

    def __init__(self, n: int = 16):
        super().__init__()
        self.proj = torch.nn.Linear(n, n)

    def forward(self, x):
        q = self.proj(x)
        scores = torch.matmul(q, x.transpose(-1, -2)) * 0.25
        weights = torch.softmax(scores, dim=-1)
        return torch.matmul(weights, x).sum()


def _dump(path, fault=None, n=16, rows=8):
    torch.manual_seed(0)
    model = Attention(n)
    x = torch.randn(2, rows, n)
    with inject_fault(op="Torch.matmul", call=0, scale=1.02) if fault else nullcontext():
        with opdiff.dump(model, str(path), level="mix", task="tensor"):
            model(x)
    dump = open_dump(str(path / "step0" / "rank0"))
    return dump, list(dump.records())


def _members(records, *ops):
    """The forward records of these ops, in order (matmul, softmax, matmul: the attention)."""
    found = [r for r in records if r["op"] in ops and r["phase"] == "forward"
             and r["kind"] == "api"]
    assert [r["op"] for r in found] == ["Torch.matmul", "Tensor.__mul__", "Torch.softmax",
                                        "Torch.matmul"][-len(found):], [r["op"] for r in found]
    return found


ATTENTION = ("Torch.matmul", "Tensor.__mul__", "Torch.softmax")


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return _dump(tmp_path_factory.mktemp("chain") / "healthy")


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    return _dump(tmp_path_factory.mktemp("chain") / "faulty", fault=True)


def _replay(dump, records, members, **kw):
    return replay_region("Region.0.forward", members, Readers(records), dump.tensor, Policy(),
                         **kw)


def test_a_healthy_chain_is_replayed_and_cleared(healthy):
    dump, records = healthy
    members = _members(records, *ATTENTION)
    for shortcut in (True, False):      # settled on float64 alone, or against the own-dtype run
        local = _replay(dump, records, members, shortcut=shortcut)
        assert local.replayed and not local.culprit, local
        assert local.ops == 4
        # judged on what leaves the region: the last matmul's output (the sum reads it)
        assert [t.name for t in local.tensors] == [f"{members[-1]['name']}.output.0"]
        assert "replayed as a chain of its 4 target op(s)" in local.describe()


def test_the_chain_feeds_each_op_from_the_ops_before_it(faulty):
    dump, records = faulty
    members = _members(records, *ATTENTION)
    # the first matmul is 2% off: the chain from the region's saved inputs recomputes it and
    # sees the region's output off by what the fault made ...
    local = _replay(dump, records, members)
    assert local.replayed and local.culprit, local
    assert "float64 from the region's saved inputs" in local.describe()
    # ... while a chain starting after it reads the faulty tensor as a saved input: inherited
    later = _replay(dump, records, members[1:])
    assert later.replayed and not later.culprit, later


def test_an_input_neither_saved_nor_made_in_the_chain_is_not_replayed(healthy):
    dump, records = healthy
    members = copy.deepcopy(_members(records, *ATTENTION))
    first = members[0]["inputs"][0]
    first.pop("key")
    local = _replay(dump, records, members)
    assert not local.replayed
    assert "neither a saved input of the region nor made by an earlier op of it" in local.reason
    assert local.describe().startswith("not replayed as a chain: ")


def test_an_op_replay_does_not_trust_refuses_the_whole_chain(healthy, monkeypatch):
    dump, records = healthy
    members = copy.deepcopy(_members(records, *ATTENTION))
    members[2]["op"] = "Torch.load"         # a hostile dump: nothing of the chain may run
    ran = []
    monkeypatch.setattr(torch, "matmul", lambda *a, **k: ran.append(a))
    local = _replay(dump, records, members)
    assert not local.replayed and "untrusted" in local.reason, local
    assert members[2]["name"] in local.reason
    assert ran == []


def test_a_region_of_both_phases_is_not_replayed(healthy):
    """(A backward region is replayed through its forward calls: test_replay_backchain.py.)"""
    dump, records = healthy
    members = copy.deepcopy(_members(records, *ATTENTION))
    members[0]["phase"] = "backward"
    local = _replay(dump, records, members)
    assert not local.replayed and "both phases" in local.reason


def test_a_chain_over_max_tensor_mb_is_not_replayed(tmp_path, monkeypatch):
    dump, records = _dump(tmp_path / "big", n=8, rows=512)    # scores: 2x512x512 float64, 4 MB
    members = _members(records, *ATTENTION)
    assert _replay(dump, records, members).replayed
    monkeypatch.setenv("OPDIFF_MAX_TENSOR_MB", "1")
    local = _replay(dump, records, members)
    assert not local.replayed and "max-tensor-mb" in local.reason.lower(), local.reason


def test_a_dump_without_dataflow_is_not_replayed_as_a_chain(healthy, monkeypatch):
    from opdiff.comparison.replay import Replayer

    dump, records = healthy
    names = [r["name"] for r in _members(records, *ATTENTION)]
    assert Replayer(dump, records).judge_region("Region.0.forward", names).replayed
    monkeypatch.setattr(type(dump), "meta", property(lambda self: {}), raising=False)
    local = Replayer(dump, records).judge_region("Region.0.forward", names)
    assert not local.replayed and "no dataflow" in local.reason


def test_a_producer_that_is_not_one_is_no_producer(healthy):
    """A dump is untrusted: junk where a producer belongs neither crashes the compare nor
    feeds the chain (the input is read as the saved tensor it is)."""
    dump, records = healthy
    members = copy.deepcopy(_members(records, *ATTENTION))
    junk = [[1], {}]
    members[1]["inputs"][0]["producer"] = junk
    hostile = [m if m["name"] not in {x["name"] for x in members} else
               next(x for x in members if x["name"] == m["name"]) for m in records]
    local = replay_region("Region.0.forward", members, Readers(hostile), dump.tensor, Policy())
    assert local.replayed and not local.culprit, local
