"""FSDP2 (`fully_shard` on each linear and the root) on 2 gloo CPU ranks, the global batch of 8
split between them, compared with the same model on one process given the whole batch: the
ranks are merged into one run (comparison/layouts: FSDP2's parameter all-gathers left out, the
whole parameters its modules read given their leaf records where the one-device run has them,
the `Shard(0)` parameters and reduce-scattered gradients of the optimizer step joined, the
gradient reduce-scatter left out), so a healthy pair names nothing with nothing unmatched, and
a 1% fault after rank 1's second gelu is named at that gelu (with tensors: on rank 1). One
layer is 15 wide: its parameters' shards are uneven (8 and 7 rows). Before, 100 rows were
unmatched (the all-gathers' staging ops and the parameters' leaves).

One spawn of the 2-rank runs, statistics and tensors in each (session fixture; the workers are
in layout_runs.py).
"""
from __future__ import annotations

import math

import pytest
import torch.distributed as dist

import opdiff
from layout_runs import run_layout
from opdiff.store.adapters import discover

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]

@pytest.fixture(scope="session")
def fsdp_roots(tmp_path_factory):
    return run_layout(tmp_path_factory.mktemp("fsdp"), "fsdp", 2,
                      "one", "fsdp", "faulty:Functional.gelu:1")


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_healthy_fsdp2_against_one_device_names_nothing(fsdp_roots, task):
    result = opdiff.compare(f"{fsdp_roots['fsdp']}/{task}", f"{fsdp_roots['one']}/{task}")
    assert result.first_divergence is None, result.first_divergence
    assert result.counts["error"] == result.counts["unmatched"] == 0, result.counts
    assert not any(n.startswith("inconclusive") for n in result.notes)
    assert any("ranks [0, 1] were merged into one run" in n for n in result.notes)
    # from statistics, each rank's parameter gradients before the reduce-scatter are partial
    # means that cannot be merged (8: two per linear); with tensors every tensor is scored
    assert result.counts["warning"] == (8 if task == "statistics" else 0), result.counts


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_fault_on_rank_1s_part_of_the_batch_is_named(fsdp_roots, task):
    result = opdiff.compare(f"{fsdp_roots['faulty']}/{task}", f"{fsdp_roots['one']}/{task}")
    fd = result.first_divergence
    assert fd is not None and fd.name == "Functional.gelu.1.forward", fd
    assert fd.location is not None and fd.location.line > 0
    if task == "tensor":
        assert fd.rank == 1 and "rank 1's piece" in fd.reason, fd
    else:
        assert "statistics cannot say which rank's piece differs" in fd.reason


def test_gathered_parameters_are_the_one_device_leaves(fsdp_roots):
    from opdiff.comparison.layouts import MergedSource

    for task in ("statistics", "tensor"):           # first gather (as_strided) and a later one
        merged = list(MergedSource(discover(f"{fsdp_roots['fsdp']}/{task}")).records())
        one = list(discover(f"{fsdp_roots['one']}/{task}")[0].records())
        # the same records in the same order: FSDP2's all-gathers and reduce-scatters left out
        assert [r["name"] for r in merged] == [r["name"] for r in one]
        by_name = {r["name"]: r for r in merged}
        for rec in one:
            if rec.get("leaf") != "parameter":
                continue
            m, o = by_name[rec["name"]], rec
            assert m["reader"] == o["reader"] and m["tensor"] == o["tensor"]
            a, b = m["outputs"][0], o["outputs"][0]
            assert a["shape"] == b["shape"]
            for key in ("max", "min", "mean", "norm"):
                assert math.isclose(float(a["stats"][key]), float(b["stats"][key]),
                                    rel_tol=1e-12), (rec["name"], key)
        # the optimizer step's sharded parameters, uneven ones too, join to the whole
        step = [r for r in merged if r["op"] == "Tensor.add_"]
        weight = step[4]["inputs"][0]
        assert weight["shape"] == [15, 8] and [p["shape"] for p in weight["pieces"]] == \
            [[8, 8], [7, 8]]
