"""Real msprobe dumps (mindstudio-probe 26.2, tests/data/msprobe_llama/) of a tiny Llama with
eager attention and with SDPA, against each other and against opdiff dumps of the same model
(same config, seed and input: tests/comparison/regionkit.py).

msprobe records an op's backward through a different autograd node than opdiff does, and reduces
statistics in the tensor's dtype (a float32 attention mask of finfo.min has mean -inf); before
`comparison/crossformat.py` and the statistics rule in `store/adapters/descriptors.py`, healthy
pairs across the two formats blamed `Functional.cross_entropy.0.backward` or `Torch.where`.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import opdiff
from opdiff.report.console import verdict_line
from opdiff.store.adapters.descriptors import tensor_descriptor

DATA = Path(__file__).resolve().parents[1] / "data" / "msprobe_llama"
SDPA = "Functional.scaled_dot_product_attention"


def _side(hf_dump, side: str, fault: bool = False) -> str:
    tool, impl = side.split(":")
    if tool == "msprobe":
        assert not fault
        return str(DATA / impl)
    return str(hf_dump("llama", impl, "statistics", fault=f"{SDPA}:1" if fault else None))


@pytest.mark.parametrize("target,golden", [
    ("msprobe:sdpa", "msprobe:eager"),     # two msprobe dumps, different attention
    ("opdiff:sdpa", "msprobe:eager"),      # opdiff target, msprobe golden
    ("msprobe:sdpa", "opdiff:eager"),      # msprobe target, opdiff golden
    ("opdiff:eager", "msprobe:eager"),     # the same ops, two formats
])
def test_healthy_pairs_name_nothing(hf_dump, target, golden):
    result = opdiff.compare(_side(hf_dump, target), _side(hf_dump, golden), progress=False)
    assert result.first_divergence is None, verdict_line(result)
    assert not verdict_line(result).startswith("inconclusive"), verdict_line(result)
    assert result.counts["error"] == 0 and result.counts["pass"] > 300, result.counts
    mixed = target.split(":")[0] != golden.split(":")[0]
    assert mixed == any("not paired across formats" in str(n) for n in result.notes), result.notes
    if mixed:   # parameter gradients are still compared across formats
        assert any(".parameters_grad" in (r.op_name or "") and r.result == "pass"
                   for r in result.rows)


def test_a_fault_in_sdpa_against_a_real_msprobe_golden_names_the_attention_region(hf_dump):
    result = opdiff.compare(_side(hf_dump, "opdiff:sdpa", fault=True),
                            _side(hf_dump, "msprobe:eager"), progress=False)
    first = result.first_divergence
    assert first is not None and first.origin == "region", verdict_line(result)
    assert first.phase == "forward"
    assert SDPA in {o["op"] for o in first.region["target_ops"]}
    assert "Functional.softmax" in {o["op"] for o in first.region["golden_ops"]}
    assert "region in `model.layers.1.self_attn`" in first.reason, first.reason


def test_a_mean_that_overflowed_in_the_tools_own_sum_is_unknown_not_inf():
    mask = tensor_descriptor("torch.float32", [2, 8], max=0.0, min=-3.4028234663852886e+38,
                             mean=float("-inf"), norm=float("inf"))
    assert mask["stats"]["mean"] is None and mask["stats"]["norm"] is None
    assert mask["stats"]["inf"] == 0
    real_inf = tensor_descriptor("torch.float32", [2], max=float("inf"), min=0.0,
                                 mean=float("inf"), norm=float("inf"))
    assert real_inf["stats"]["mean"] == "Infinity" and real_inf["stats"]["max"] == "Infinity"
