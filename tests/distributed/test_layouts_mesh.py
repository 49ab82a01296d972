"""A 2 x 2 mesh on 4 gloo CPU ranks: tensor parallel (DTensor ColwiseParallel/RowwiseParallel)
over the inner dim, DDP over the outer one (`_pre_dp_module_transform`, DDP on the data-parallel
group), the batch of 8 split between the two data-parallel halves; compared with the same model
on one process given the whole batch. Each tensor-parallel group is merged first, then the two
groups as data parallel (comparison/layouts/mesh.py); the parameters, which DDP's hook turns
into local tensors and back (`from_local`) before the forward, take their placements from the
DTensors made of them and their leaf records move to where the one-device run has them
(layouts/held.py). A healthy pair names nothing with nothing unmatched; a 1% fault after rank
1's second gelu (data-parallel half 0, tensor-parallel rank 1) is named at that gelu, on rank 1.

Also: capture records DDP's gradient all-reduce on DDP's own group ([1, 3] on rank 1); before,
its comm hook reduced over the whole world, mixing the tensor-parallel peers' gradients.

The healthy run is two steps: from the second on, DDP's hook leaves the DTensors it made of the
parameters in the modules and reads them (no new `from_local`), and capture records each
parameter's leaf where such a DTensor is first read (capture/leaves.py). Before, the second
step had no parameter leaves: 28 rows unmatched, 18 tensors of unknown layout, "inconclusive".

One spawn of the 4-rank runs (session fixture; the workers are in layout_runs.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist

import opdiff
from layout_runs import run_layout

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]


@pytest.fixture(scope="session")
def mesh_roots(tmp_path_factory):
    return run_layout(tmp_path_factory.mktemp("mesh"), "mesh", 4,
                      "one", "one2", "mesh2", "faulty:Functional.gelu:1")


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_healthy_dp_x_tp_mesh_against_one_device_names_nothing_in_either_step(mesh_roots, task):
    result = opdiff.compare(f"{mesh_roots['mesh2']}/{task}", f"{mesh_roots['one2']}/{task}")
    assert result.first_divergence is None, result.first_divergence
    assert result.counts["error"] == result.counts["unmatched"] == 0, result.counts
    assert not any("inconclusive" in n for n in result.notes), result.notes
    said = [n for n in result.notes if "as a 2 x 2 mesh" in n]
    assert [n.split(":")[0] for n in said] == ["step 0", "step 1"], result.notes
    for note in said:
        assert "groups [0, 1], [2, 3] first, then those as data parallel" in note
        assert "unknown" not in note, said
    assert [p["step"] for p in result.pairs] == [0, 1]
    for pair in result.pairs:
        assert pair["first_divergence"] is None
        # from statistics, each half's parameter gradients before DDP's all-reduce are partial
        # means that cannot be merged, and the row-parallel inputs' gradients partial sums
        # DTensor reduces out of sight; with tensors every tensor is scored
        assert pair["counts"] == {"pass": 71 if task == "statistics" else 80, "error": 0,
                                  "warning": 9 if task == "statistics" else 0,
                                  "unmatched": 0}, pair


def test_a_fault_on_rank_1_is_named_at_its_op_and_rank(mesh_roots):
    result = opdiff.compare(f"{mesh_roots['faulty']}/tensor", f"{mesh_roots['one']}/tensor")
    fd = result.first_divergence
    assert fd is not None and fd.name == "Functional.gelu.1.forward", fd
    assert fd.rank == 1 and "rank 1's piece" in fd.reason and "other pieces agree" in fd.reason
    assert fd.location is not None and fd.location.line > 0


def test_ddp_all_reduce_is_recorded_on_ddp_s_own_group(mesh_roots):
    recs = [json.loads(line) for line in
            (Path(mesh_roots["mesh2"]) / "statistics" / "step0" / "rank1" / "records.jsonl").open()]
    groups = [r["group"]["ranks"] for r in recs if r["op"] == "Distributed.all_reduce"]
    assert groups[:2] == [[0, 1], [0, 1]] and groups[-1] == [1, 3], groups
