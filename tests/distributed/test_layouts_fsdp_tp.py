"""FSDP2 x tensor parallel on a 2 x 2 mesh of 4 gloo CPU ranks (`fully_shard` of each linear
and the root over the dp dim, `parallelize_module` ColwiseParallel/RowwiseParallel over the tp
dim), the batch of 8 split between the two data-parallel halves; compared with the same model
on one process given the whole batch. FSDP2's parameter all-gather over the data-parallel group
is each rank's first group collective, so each data-parallel group ([0, 2], [1, 3]: one
tensor-parallel shard each) is merged first, as FSDP2 (its 2-D parameter placements
`(_StridedShard(0), Shard(0))` read along the dp dim, the tp placements carried), then the two
logical ranks as tensor parallel (comparison/layouts/mesh.py). A healthy pair names nothing
with nothing unmatched; a 1% fault after rank 1's second gelu (dp half 0, tp rank 1) is named
at that gelu (with tensors: on rank 1). Before, the compare refused the pair: "look like dumps
of different models: only 0 of 102 target and 33 golden ops line up".

The statistics dump is the model's first step (FSDP2's first gather makes its DTensor
parameters with `as_strided` and `detach`), the tensor dump its second. One spawn of the 4-rank
runs (session fixture; the workers are in layout_runs.py).
"""
from __future__ import annotations

import math

import pytest
import torch.distributed as dist

import opdiff
from layout_runs import run_layout
from opdiff.comparison.layouts import logical_pairs
from opdiff.store.adapters import discover

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]


@pytest.fixture(scope="session")
def fsdp_tp_roots(tmp_path_factory):
    return run_layout(tmp_path_factory.mktemp("fsdp_tp"), "fsdp_tp", 4,
                      "one", "fsdptp", "faulty:Functional.gelu:1")


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_healthy_fsdp2_x_tp_against_one_device_names_nothing(fsdp_tp_roots, task):
    result = opdiff.compare(f"{fsdp_tp_roots['fsdptp']}/{task}", f"{fsdp_tp_roots['one']}/{task}")
    assert result.first_divergence is None, result.first_divergence
    assert result.counts["error"] == result.counts["unmatched"] == 0, result.counts
    assert not any("inconclusive" in n for n in result.notes), result.notes
    said = [n for n in result.notes if "as a 2 x 2 mesh" in n]
    assert said and "groups [0, 2], [1, 3] first, then those as tensor parallel" in said[0], \
        result.notes
    assert "unknown" not in said[0], said
    # from statistics, the parameter gradients before FSDP2's reduce-scatter are partial
    # means, and the row-parallel inputs' gradients partial sums DTensor reduces out of sight;
    # with tensors every tensor is scored
    assert result.counts["warning"] == (9 if task == "statistics" else 0), result.counts


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_fault_on_rank_1s_shard_is_named_at_its_op(fsdp_tp_roots, task):
    result = opdiff.compare(f"{fsdp_tp_roots['faulty']}/{task}", f"{fsdp_tp_roots['one']}/{task}")
    fd = result.first_divergence
    assert fd is not None and fd.name == "Functional.gelu.1.forward", fd
    assert fd.location is not None and fd.location.line > 0
    if task == "tensor":
        assert fd.rank == 1 and "rank 1's piece" in fd.reason, fd
        assert "the other pieces agree" in fd.reason
    else:
        assert "statistics cannot say which rank's piece differs" in fd.reason


def test_merged_parameters_are_the_one_device_leaves(fsdp_tp_roots):
    for task in ("statistics", "tensor"):
        found = logical_pairs(discover(f"{fsdp_tp_roots['fsdptp']}/{task}"),
                              discover(f"{fsdp_tp_roots['one']}/{task}"))
        assert found is not None and len(found[0]) == 1, found
        merged, one = found[0][0]
        records = list(merged.records())
        golden = list(one.records())
        # the same records in the same order: FSDP2's gathers and reduce-scatters, DTensor's
        # views and the all-reduces left out
        assert [r["name"] for r in records] == [r["name"] for r in golden]
        by_name = {r["name"]: r for r in records}
        checked = 0
        for rec in golden:
            if rec.get("leaf") != "parameter":
                continue
            a, b = by_name[rec["name"]]["outputs"][0], rec["outputs"][0]
            assert a["shape"] == b["shape"] and "placement" not in a, (rec["name"], a)
            for key in ("max", "min", "mean", "norm"):
                x, y = float(a["stats"][key]), float(b["stats"][key])
                assert math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-15), (rec["name"], key, x, y)
            checked += 1
        assert checked == 8
