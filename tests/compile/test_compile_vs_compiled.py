"""Compiled against compiled: both runs under torch.compile (two devices, two torch versions or,
here, two compiler configurations of one CPU): the same pairing and judging as eager against
compiled. Inductor against Inductor pairs kernel with kernel, each judged as an op; Inductor
against aot_eager judges each kernel as a region of the aten ops it fuses. A healthy pair names
nothing; a wrong `aten.silu` decomposition in the target's Inductor is named at the kernel
holding that silu, in layer 0, at the model's line."""
from __future__ import annotations

from pathlib import Path

import pytest

import opdiff
from compilekit import fresh_compile, run_step, wrong_silu_decomposition
from opdiff.report.console import verdict_line

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def inductor(tmp_path_factory):
    root = tmp_path_factory.mktemp("vs_compiled")
    out: dict[tuple[str, str], Path] = {}
    for level in ("L2", "mix"):
        with fresh_compile():
            out["healthy", level] = run_step(root / f"healthy_{level}", level,
                                             backend="inductor").path
        with wrong_silu_decomposition():
            out["silu", level] = run_step(root / f"silu_{level}", level, backend="inductor").path
    return out


def _compare(target: Path, golden: Path, out: Path):
    return opdiff.compare(str(target), str(golden), str(out), progress=False)


def _named_at_the_silu_kernel(first) -> None:
    assert first is not None, first
    assert "node `cpp_fused" in first.reason and "silu" in first.reason, first.reason
    assert "model.layers.0.mlp" in first.reason, first.reason          # layer 0: the first
    assert first.location is not None and first.location.file.endswith("modeling_llama.py")


@pytest.mark.parametrize("level", ["L2", "mix"])
def test_inductor_against_inductor_pairs_kernels_and_names_the_wrong_one(inductor, level,
                                                                         tmp_path):
    healthy = _compare(inductor["healthy", level], inductor["healthy", level], tmp_path / "h")
    assert healthy.first_divergence is None, healthy.first_divergence
    assert not verdict_line(healthy).startswith("inconclusive"), verdict_line(healthy)
    result = _compare(inductor["silu", level], inductor["healthy", level], tmp_path / "s")
    first = result.first_divergence
    _named_at_the_silu_kernel(first)
    # kernel against kernel: the op itself, not a region
    assert first.name.startswith("Inductor.cpp_fused_") and "silu" in first.name, first.name
    assert first.origin != "region", first


def test_inductor_against_aot_eager_judges_each_kernel_as_a_region(inductor, compiled_step,
                                                                   tmp_path):
    golden = compiled_step("L2", "aot_eager").path
    healthy = _compare(inductor["healthy", "L2"], golden, tmp_path / "h")
    assert healthy.first_divergence is None, healthy.first_divergence
    assert not verdict_line(healthy).startswith("inconclusive"), verdict_line(healthy)
    first = _compare(inductor["silu", "L2"], golden, tmp_path / "s").first_divergence
    _named_at_the_silu_kernel(first)
    assert first.origin == "region", first
    assert "Aten.silu" in [op["op"] for op in first.region["golden_ops"]], first.region


def test_inductor_against_aot_eager_at_mix_is_inconclusive_and_says_to_record_L2(
        inductor, compiled_step, tmp_path):
    # kernels against another backend's aten ops, at mix: no dataflow pairs them
    golden = compiled_step("mix", "aot_eager").path
    result = _compare(inductor["silu", "mix"], golden, tmp_path / "s")
    line = verdict_line(result)
    assert result.first_divergence is None and line.startswith("inconclusive"), line
    assert "one run ran Inductor's kernels and the other the aten ops of another backend" in line
    assert 'level="L2"' in line, line
