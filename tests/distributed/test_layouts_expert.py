"""Expert parallelism on 2 gloo CPU ranks: a tiny mixture of experts (router, top-1, 4 experts of
Linear/gelu/Linear), each rank holding 2 experts and half the batch of 16 tokens, tokens sent to
their expert's rank and back with all_to_all; the golden is the same MoE on one process with all
experts (each expert taking its tokens in global order; the two ranks' losses add up to its loss,
exactly). The ranks run different ops on different
tokens, which the tensor/data-parallel merge does not describe: merged as data parallel, the pair
named an innocent `Torch.argsort.0.forward` on rank 0, healthy or faulty, with error rows. Now
the compare says it is inconclusive (comparison/layouts/experts.py) and blames nothing.

One spawn of the 2-rank runs, statistics and tensors in each (workers in layout_runs.py).
"""
from __future__ import annotations

import pytest
import torch.distributed as dist

import opdiff
from layout_runs import run_layout

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]


@pytest.fixture(scope="session")
def ep_roots(tmp_path_factory):
    # the fault: rank 1's second gelu, its second expert's (expert 3)
    return run_layout(tmp_path_factory.mktemp("experts"), "expert", 2,
                      "one", "ep", "faulty:Functional.gelu:1")


@pytest.mark.parametrize("run", ["ep", "faulty"])
@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_expert_parallel_against_one_device_is_inconclusive_not_a_false_culprit(
        ep_roots, run, task, tmp_path):
    result = opdiff.compare(f"{ep_roots[run]}/{task}", f"{ep_roots['one']}/{task}",
                            output_path=tmp_path / "out")
    assert result.first_divergence is None, result.first_divergence
    assert result.counts["error"] == 0
    said = [n for n in result.notes if "inconclusive" in n]
    assert any("expert-parallel layout (all_to_all) is not merged" in n
               and "Distributed.all_to_all_single" in n for n in said), result.notes
    assert result.verdict.startswith("inconclusive"), result.verdict
    assert (tmp_path / "out" / "summary.json").exists()


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_expert_parallel_against_the_same_layout_is_compared_rank_by_rank(ep_roots, task):
    # laid out alike: not a layout to merge, so the all_to_all does not make it inconclusive;
    # the fault, in expert 3's gelu on rank 1, is named there
    result = opdiff.compare(f"{ep_roots['faulty']}/{task}", f"{ep_roots['ep']}/{task}")
    fd = result.first_divergence
    assert fd is not None and (fd.name, fd.rank) == ("Functional.gelu.1.forward", 1), fd
    assert not any("inconclusive" in n for n in result.notes), result.notes
