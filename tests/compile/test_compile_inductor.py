"""Eager golden against `torch.compile` with Inductor on the CPU (one layer of a tiny Llama):
Inductor's generated C++ kernels run without a dispatch, so only its extern kernels (mm, bmm)
are recorded. The compare is not refused, blames nothing, and says "inconclusive" with what
to do; capture adds no graph break and leaves the step bitwise."""
from __future__ import annotations

import pytest
import torch

import opdiff
from compilekit import run_step
from opdiff.report.console import verdict_line


@pytest.mark.slow
def test_inductor_on_cpu_is_inconclusive_not_refused_and_unchanged(tmp_path):
    plain = run_step(None, backend="inductor", layers=1)
    target = run_step(tmp_path / "inductor", "L2", backend="inductor", layers=1)
    golden = run_step(tmp_path / "eager", "L2", layers=1)
    assert torch.equal(plain.loss, target.loss) and torch.equal(plain.grads, target.grads)
    assert not target.counters.get("graph_break"), target.counters
    assert target.counters["stats"]["unique_graphs"] == plain.counters["stats"]["unique_graphs"]
    result = opdiff.compare(str(target.path), str(golden.path), str(tmp_path / "out"),
                            progress=False)
    assert result.first_divergence is None, result.first_divergence
    line = verdict_line(result)
    assert line.startswith("inconclusive: the target ran Inductor-generated kernels"), line
    assert "Aten.mm" in line and 'backend="aot_eager"' in line
