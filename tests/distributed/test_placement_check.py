"""DTensor shards placed differently in the two runs are not compared, and their ops not judged.

Capture records a DTensor as this rank's local shard with its `placement` (capture/collectives.py
`local_shard`); compare pairs golden rank r with target rank r, so two runs on another mesh or
with other placements hold different slices there. Real dumps of a one-process gloo group with a
one-device mesh: there both shards hold the whole tensor, so the target's input is scaled to
stand for the other slice that rank r holds under the other placement (what a 2-rank run gives).
"""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist

import opdiff
from opdiff.comparison.rejudge import rejudge
from opdiff.comparison.result import PASS, WARNING
from opdiff.report.console import verdict_line
from opdiff.testing import inject_fault

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")

NOT_COMPARABLE = "not comparable: target placement"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """{name: dump root} of mm(x, w).full_tensor() then tanh, x placed and scaled per run."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    tmp = tmp_path_factory.mktemp("placement")
    runs = {"golden": (Shard(1), 1.0, False), "replicated": (Replicate(), 1.5, False),
            "replicated_fault": (Replicate(), 1.0, True), "same": (Shard(1), 1.0, False),
            "same_fault": (Shard(1), 1.0, True)}
    dist.init_process_group("gloo", init_method=f"file://{tmp / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        for name, (placement, scale, faulty) in runs.items():
            torch.manual_seed(0)
            x, w = torch.randn(2, 4) * scale, torch.randn(4, 3)
            xd = distribute_tensor(x, mesh, [placement])
            wd = distribute_tensor(w, mesh, [Shard(0)])
            fault = inject_fault("Torch.tanh", call=0, scale=1.05) if faulty \
                else contextlib.nullcontext()
            with fault, opdiff.dump(None, tmp / name, level="L1"):
                torch.tanh(torch.mm(xd, wd).full_tensor())
        # row-parallel mm: a partial sum against a single-device golden (below); the fault
        # stands for what rank r's partial sum lacks on a 2-device mesh
        torch.manual_seed(0)
        x, w = torch.randn(2, 4), torch.randn(4, 3)
        xd, wd = distribute_tensor(x, mesh, [Shard(1)]), distribute_tensor(w, mesh, [Shard(0)])
        with inject_fault("Torch.mm", call=0, scale=1.05), opdiff.dump(None, tmp / "partial",
                                                                      level="L1"):
            torch.tanh(torch.mm(xd, wd).full_tensor())
    finally:
        dist.destroy_process_group()
    with opdiff.dump(None, tmp / "plain", level="L1"):
        torch.tanh(torch.mm(x, w))
    return {name: str(tmp / name) for name in [*runs, "partial", "plain"]}


def _rows(result, op):
    return {row.target_name[len(op) + 1:]: row for row in result.rows if row.op_name == op}


def test_other_placements_are_not_compared_and_their_op_not_blamed(dumps):
    result = opdiff.compare(dumps["replicated"], dumps["golden"])
    mm = _rows(result, "Torch.mm.0.forward")
    x = mm["input.0"]
    assert x.result == WARNING and x.reason.startswith(NOT_COMPARABLE)
    assert "target placement R " in x.reason and "golden S(1) " in x.reason
    assert "mesh coordinate [0]" in x.reason and "global shape [2, 4]" in x.reason
    assert not x.metrics
    assert mm["input.1"].result == PASS          # w: Shard(0) in both runs, compared
    # mm's output differs (its x is another slice) but mm cannot be judged: its inputs that
    # compare agree, so without the placement check mm would be blamed
    out = mm["output.0"]
    assert out.metrics and "the op is not judged" in out.reason and out.result == WARNING
    assert result.first_divergence is None
    assert not any(row.reason.startswith("local error") for row in result.rows)
    assert any("sharded differently" in note and "1 op(s)" in note for note in result.notes)
    assert verdict_line(result).startswith("inconclusive: the runs were sharded differently")
    again = rejudge(result)                      # from the saved rows: still not blamed
    assert again.first_divergence is None
    assert _rows(again, "Torch.mm.0.forward")["input.0"].reason == x.reason


def test_a_fault_on_tensors_that_compare_is_still_found(dumps):
    # placements differ at mm's x only; tanh reads plain tensors that agree, and is faulty
    result = opdiff.compare(dumps["replicated_fault"], dumps["golden"])
    assert _rows(result, "Torch.mm.0.forward")["input.0"].reason.startswith(NOT_COMPARABLE)
    assert result.first_divergence is not None
    assert result.first_divergence.name == "Torch.tanh.0.forward"
    assert any("sharded differently" in note for note in result.notes)


def test_equal_placements_compare_as_before(dumps):
    same = opdiff.compare(dumps["same"], dumps["golden"])
    assert same.first_divergence is None
    assert not verdict_line(same).startswith("inconclusive")
    assert all(row.result == PASS for row in same.rows)
    assert not any("sharded differently" in note for note in same.notes)
    faulty = opdiff.compare(dumps["same_fault"], dumps["golden"])
    assert faulty.first_divergence is not None
    assert faulty.first_divergence.name == "Torch.tanh.0.forward"
    assert not any(row.reason.startswith("not comparable") for row in faulty.rows)


def test_a_partial_sum_against_a_plain_tensor_is_not_compared(dumps):
    result = opdiff.compare(dumps["partial"], dumps["plain"])
    mm = _rows(result, "Torch.mm.0.forward")
    # x and w: shards that are the whole tensor on a one-device mesh: compared with golden's
    assert mm["input.0"].result == PASS and mm["input.1"].result == PASS
    out = mm["output.0"]
    assert out.result == WARNING and out.reason.startswith(NOT_COMPARABLE)
    assert "P(sum)" in out.reason and "golden none (a plain tensor)" in out.reason
    assert result.first_divergence is None   # without the check: mm, a local error
    assert any("sharded differently" in note for note in result.notes)
