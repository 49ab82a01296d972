"""A fault at step 0 of a three-step dump: steps 1 and 2 start from weights trained with that
difference, so their divergence is origin "parameter" carried over from step 0, never "the
runs do not start from the same weights" nor a local error of an op of theirs."""
import contextlib
from dataclasses import replace

import pytest
import torch
from torch import nn

import opdiff
from opdiff.comparison.origins import across_steps, is_carried_over


def three_steps(path, *, fault):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                          nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(32, 8), torch.randn(32, 4)
    dbg = opdiff.PrecisionDebugger(dump_path=str(path), level="mix", step=[0, 1, 2])
    for step in range(3):
        planted = (opdiff.testing.inject_fault(op="Functional.linear", call=1, scale=1.05)
                   if fault and step == 0 else contextlib.nullcontext())
        with planted:
            dbg.start(model)
            (model(x) - y).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            dbg.stop()
        dbg.step()
    return path


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    root = tmp_path_factory.mktemp("carried")
    return opdiff.compare(three_steps(root / "t", fault=True), three_steps(root / "g", fault=False))


def test_fault_at_step_0_is_named_there(result):
    fd = result.first_divergence
    assert (fd.step, fd.name, fd.origin) == (0, "Functional.linear.1.forward", "op")


def test_later_steps_say_their_parameters_carry_step_0s_difference(result):
    later = {p["step"]: p["first_divergence"] for p in result.pairs if p["step"] > 0}
    assert set(later) == {1, 2}
    for step, fd in later.items():
        assert fd is not None and fd.origin == "parameter", (step, fd)
        assert is_carried_over(fd), fd.reason
        assert "carried over from step 0" in fd.reason
        assert "do not start from the same weights" not in fd.reason
        assert "different weights" not in fd.reason
    assert not any("for their own reasons" in n for n in result.notes), result.notes
    assert any("because an earlier step did" in n for n in result.notes), result.notes


def test_an_op_named_at_a_later_step_with_drifted_weights_is_no_local_error(result):
    """Weights may drift below the tolerance a leaf is held to while an op's output crosses
    its own: the op named then is origin "parameter" too, not a local error in that op."""
    pairs = sorted(result.pairs, key=lambda p: p["step"])
    rows = {s: [r for r in result.rows if r.step == s] for s in (0, 1, 2)}
    step0 = pairs[0]["first_divergence"]
    as_op = replace(step0, step=2, name="Functional.linear.3.forward", origin="op", kind="local",
                    reason="... — local error in this op")

    class Pair:                 # the per-pair results across_steps reads
        def __init__(self, step, fd):
            self.step, self.rank, self.first_divergence, self.rows = step, 0, fd, rows[step]

    results = [Pair(0, step0), Pair(1, None), Pair(2, as_op)]
    across_steps(results)
    fd = results[2].first_divergence
    assert fd.origin == "parameter" and fd.kind == "leaf", fd
    assert "not a local error" in fd.reason and "carried over from step 0" in fd.reason
    assert fd.tensor and fd.tensor.endswith(("weight", "bias"))
    # a step whose parameters are equal keeps its op: nothing carried it
    same = [replace(r, error=0.0, metrics={}) if r.leaf == "parameter" else r for r in rows[2]]
    results = [Pair(0, step0), Pair(2, as_op)]
    results[1].rows = same
    across_steps(results)
    assert results[1].first_divergence.origin == "op"


def test_every_rank_of_a_ddp_run_carries_the_step_0_difference(result):
    """Rank 1's fault at step 0 reaches rank 0 through the gradient all-reduce; at step 1 both
    ranks start from the weights it trained: both say so, citing where it started."""
    step0 = next(p for p in result.pairs if p["step"] == 0)["first_divergence"]
    step1 = next(p for p in result.pairs if p["step"] == 1)["first_divergence"]
    rows1 = [r for r in result.rows if r.step == 1]

    class Pair:
        def __init__(self, step, rank, fd):
            self.step, self.rank, self.first_divergence, self.rows = step, rank, fd, rows1

    received = replace(step0, rank=0, origin="collective", name="Distributed.all_reduce.0.forward")
    results = [Pair(0, 0, received), Pair(0, 1, replace(step0, rank=1)),
               Pair(1, 0, replace(step1, rank=0, carried_from=None, reason="3 of 6 parameters differ before any op: "
                                  "the runs start from different weights")),
               Pair(1, 1, replace(step1, rank=1, carried_from=None, reason="3 of 6 parameters differ before any op: "
                                  "the runs start from different weights"))]
    across_steps(results)
    for rank in (0, 1):
        fd = results[2 + rank].first_divergence
        assert fd.origin == "parameter" and is_carried_over(fd), fd.reason
        assert "different weights" not in fd.reason
    for rank in (0, 1):     # both cite where it started: rank 1's op, not rank 0's all_reduce
        reason = results[2 + rank].first_divergence.reason
        assert f"at {step0.name} (rank 1)" in reason and "all_reduce" not in reason
