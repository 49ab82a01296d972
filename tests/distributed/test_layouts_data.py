"""DistributedDataParallel on 2 gloo CPU ranks, the global batch of 8 split between them (4
rows each), compared with the same model on one process given the whole batch: the ranks are
merged into one run (comparison/layouts: the batch is dim 0 of what the inputs made, parameters
are replicas, the mean loss is the ranks' weighted by their share of the batch, and so are its
gradients), so a healthy pair names nothing with nothing unmatched, and a 1% fault after rank
1's second gelu is named at that gelu (with tensors: on rank 1). Before, the compare refused the
pair ("look like dumps of different models") or named rank 0.

One spawn of the 2-rank runs, statistics and tensors in each (session fixture; the workers are
in layout_runs.py).
"""
from __future__ import annotations

import pytest
import torch.distributed as dist

import opdiff
from layout_runs import run_layout

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]

@pytest.fixture(scope="session")
def dp_roots(tmp_path_factory):
    return run_layout(tmp_path_factory.mktemp("data"), "ddp", 2,
                      "one", "dp", "faulty:Functional.gelu:1")


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_healthy_split_batch_against_one_device_names_nothing(dp_roots, task):
    result = opdiff.compare(f"{dp_roots['dp']}/{task}", f"{dp_roots['one']}/{task}")
    assert result.first_divergence is None, result.first_divergence
    assert result.counts["error"] == result.counts["unmatched"] == 0
    assert not any(n.startswith("inconclusive") for n in result.notes)
    # from statistics, the ranks' parameter gradients before DDP's bucket all-reduce are partial
    # means that cannot be merged (8: two per linear); with tensors every tensor is scored
    assert result.counts["warning"] == (8 if task == "statistics" else 0)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_fault_on_rank_1s_part_of_the_batch_is_named(dp_roots, task):
    result = opdiff.compare(f"{dp_roots['faulty']}/{task}", f"{dp_roots['one']}/{task}")
    fd = result.first_divergence
    assert fd is not None and fd.name == "Functional.gelu.1.forward", fd
    if task == "tensor":
        assert fd.rank == 1 and "rank 1's piece" in fd.reason, fd
    else:
        assert "statistics cannot say which rank's piece differs" in fd.reason
