"""Sequence parallelism (torch `SequenceParallel` on two layer norms, the linears between them
column/row parallel with the sequence dim split at their ends) on 2 gloo CPU ranks, each given
its half of the sequence, compared with the same model on one process given the whole: the
ranks are merged into one run (comparison/layouts: the model's input held by a `Shard(1)`
DTensor is joined along the sequence, DTensor's gather-and-reorder (`wait_tensor`, `chunk`,
`cat`, `contiguous` after the all-gather) and reorder-and-scatter (`chunk`, `cat` before the
reduce-scatter) are left out with their collectives, and a partial sum's statistics are its
reduce-scatter's pieces'), so a healthy pair names nothing with nothing unmatched, and a 1%
fault on rank 1 is named at its op: the gelu on the hidden dim's shard, or the second layer
norm on the sequence's. Before, 26 rows were unmatched, the input was taken for a batch split
(an error row) and the gelu's gradient was judged 0.5 off.

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
def sp_roots(tmp_path_factory):
    return run_layout(tmp_path_factory.mktemp("sequence"), "sequence", 2, "one", "sp",
                      "gelu:Functional.gelu:0", "norm:Functional.layer_norm:1")


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_healthy_sequence_parallel_against_one_device_names_nothing(sp_roots, task):
    result = opdiff.compare(f"{sp_roots['sp']}/{task}", f"{sp_roots['one']}/{task}")
    assert result.first_divergence is None, result.first_divergence
    assert result.counts["error"] == result.counts["unmatched"] == 0, result.counts
    assert not any(n.startswith("inconclusive") for n in result.notes), result.notes
    said = [n for n in result.notes if "ranks [0, 1] were merged into one run" in n]
    assert said and "unknown" not in said[0], result.notes      # every tensor's layout known
    # from statistics, the backward partial sums DTensor reduces out of sight (the layer
    # norms' weight gradients, the linears' input gradients) are not judged; with tensors
    # every tensor is scored
    assert result.counts["warning"] == (10 if task == "statistics" else 0), result.counts


@pytest.mark.parametrize("task", ["statistics", "tensor"])
@pytest.mark.parametrize("fault,op,dim", [("gelu", "Functional.gelu.0.forward", 2),
                                          ("norm", "Functional.layer_norm.1.forward", 1)])
def test_a_fault_on_rank_1s_piece_is_named_at_its_op(sp_roots, task, fault, op, dim):
    result = opdiff.compare(f"{sp_roots[fault]}/{task}", f"{sp_roots['one']}/{task}")
    fd = result.first_divergence
    assert fd is not None and fd.name == op, fd
    assert fd.location is not None and fd.location.line > 0
    assert f"sharded along dim {dim}" in fd.reason, fd.reason
    if task == "tensor":
        assert fd.rank == 1 and "rank 1's piece" in fd.reason, fd
    else:
        assert "statistics cannot say which rank's piece differs" in fd.reason
