"""A 2-stage pipeline on 2 gloo CPU ranks (rank 0: block 0; rank 1: block 1 and the loss;
activations and gradients sent between them), compared with the same model on one process:
the stages are chained into one run (comparison/layouts/chain.py), so a healthy pair names
nothing with nothing unmatched, and a 1% fault after stage 1's gelu is named at that gelu, on
rank 1, at its line. Before, 72 of 158 rows were unmatched and the faulty pair named rank 0.

One spawn of the 2-rank runs, statistics and tensors in each (session fixture; the workers are
in layout_runs.py).
"""
from __future__ import annotations

import pytest
import torch.distributed as dist

import opdiff

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]

@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_healthy_pipeline_against_one_device_names_nothing(pp_roots, task):
    result = opdiff.compare(f"{pp_roots['pp']}/{task}", f"{pp_roots['one']}/{task}")
    assert result.first_divergence is None, result.first_divergence
    assert result.counts["error"] == result.counts["unmatched"] == result.counts["warning"] == 0
    assert any("chained into one run as pipeline stages" in n for n in result.notes)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_fault_in_stage_1_is_named_on_rank_1_at_its_line(pp_roots, task):
    result = opdiff.compare(f"{pp_roots['faulty']}/{task}", f"{pp_roots['one']}/{task}")
    fd = result.first_divergence
    # stage 1's first gelu is the logical run's second
    assert fd is not None and fd.name == "Functional.gelu.1.forward", fd
    assert fd.rank == 1 and "pipeline stage 1" in fd.reason
    assert fd.location is not None and "model(inp)" in fd.location.code
