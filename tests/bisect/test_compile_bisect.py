"""`opdiff.compile_bisect(step)`: torch's CompilerBisector judged by opdiff's verdict, the step
run in this process with real torch.compile (aot_eager family and Inductor on CPU)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import opdiff
from bisectkit import step, wrong_silu
from opdiff.bisect import BisectInputError
from opdiff.bisect.judge import judge, named_tensors


def test_a_wrong_silu_decomposition_is_named_as_the_decomposition_stage():
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    # a manual bisect's state in the user's Inductor cache (torch's do_bisect would remove it)
    theirs = Path(cache_dir()) / "bisect" / "opdiff-test-keep.txt"
    theirs.parent.mkdir(parents=True, exist_ok=True)
    kept = not theirs.exists()
    if kept:
        theirs.write_text("kept")
    try:
        with wrong_silu():
            result = opdiff.compile_bisect(step)
        assert theirs.exists()
    finally:
        if kept:
            theirs.unlink(missing_ok=True)
    assert result.found, result.lines()
    assert (result.backend, result.subsystem) == ("aot_eager_decomp_partition", "decomposition")
    assert result.detail == "aten.silu.default"
    assert isinstance(result.application, int) and result.application >= 0
    # the printed settings were run: the application named differs, the one before agrees
    assert result.confirmed
    settings = dict(result.reproduce)
    n = result.application
    assert settings[f"TORCH_BISECT_BACKEND=aot_eager_decomp_partition TORCH_BISECT_SUBSYSTEM="
                    f"decomposition TORCH_BISECT_MAX={n}"] == "differs"
    assert settings[f"TORCH_BISECT_BACKEND=aot_eager_decomp_partition TORCH_BISECT_SUBSYSTEM="
                    f"decomposition TORCH_BISECT_MAX={n - 1}"] == "agrees"
    text = "\n".join(result.lines())
    assert f"application #{n}: aten.silu.default" in text
    assert "float32 tolerance" in result.evidence
    # the bisector's state is gone: compiling again is plain compiling
    from torch._inductor.compiler_bisector import CompilerBisector
    assert not CompilerBisector.bisection_enabled and CompilerBisector.get_backend() is None


@pytest.mark.slow
def test_a_healthy_compiled_step_names_no_stage_through_inductor():
    result = opdiff.compile_bisect(step)
    assert result.answer == "none", result.lines()
    assert result.summary().startswith("no compiler stage makes the difference")
    assert result.runs == 5           # eager, aot_eager, decomp_partition, crossref, inductor


def test_a_step_that_fails_under_one_backend_is_inconclusive_not_a_stage(capsys):
    from torch._inductor.compiler_bisector import CompilerBisector

    def fragile():
        if CompilerBisector.get_backend() == "aot_eager":
            raise RuntimeError("lowering failed")
        return step()

    result = opdiff.compile_bisect(fragile)
    assert result.answer == "inconclusive" and not result.found
    assert "raised under backend aot_eager" in result.summary()
    assert "lowering failed" in result.summary()
    assert "Bisection status" not in capsys.readouterr().out    # torch's prints: in the log


def test_steps_it_cannot_bisect_are_refused_in_one_line():
    def broken():
        raise ValueError("no data")

    with pytest.raises(BisectInputError, match="fails in eager: ValueError: no data"):
        opdiff.compile_bisect(broken)

    def unseeded():
        return torch.compile(torch.nn.Linear(4, 4))(torch.randn(2, 4))

    with pytest.raises(BisectInputError, match="not reproducible"):
        opdiff.compile_bisect(unseeded)

    torch.manual_seed(0)
    compiled_before = torch.compile(torch.nn.Linear(4, 4))

    def stale():
        return compiled_before(torch.ones(2, 4))

    with pytest.raises(BisectInputError, match="call torch.compile inside the step"):
        opdiff.compile_bisect(stale)

    with pytest.raises(BisectInputError, match="no tensor"):
        opdiff.compile_bisect(lambda: None)


def test_a_run_is_judged_by_what_its_dtype_allows():
    g = torch.randn(256, generator=torch.Generator().manual_seed(0))
    golden = named_tensors({"loss": g})
    assert judge(named_tensors({"loss": g * (1 + 1e-7)}), golden).agrees
    assert not judge(named_tensors({"loss": g * 1.001}), golden).agrees
    # the same relative change is rounding in bfloat16
    gb = g.bfloat16()
    assert judge(named_tensors({"loss": (g * 1.001).bfloat16()}), named_tensors({"loss": gb})).agrees
    assert not judge(named_tensors({"loss": g[:3]}), golden).agrees


def _wrong_from(backends):
    """A step whose compiled result is 0.1% off whenever the bisector compiles with one of
    `backends`, whatever their subsystems do: a fault of a whole backend."""
    from torch._inductor.compiler_bisector import CompilerBisector

    def stepped():
        out = step()
        if CompilerBisector.get_backend() in backends:
            out[0] = out[0] * 1.001
        return out
    return stepped


def test_a_backend_without_subsystems_is_named_with_the_backend_before_it_agreeing():
    result = opdiff.compile_bisect(_wrong_from({"aot_eager", "aot_eager_decomp_partition"}))
    assert result.found and (result.backend, result.subsystem) == ("aot_eager", None)
    assert result.summary().startswith("the difference appears with AOTAutograd's tracing")
    assert dict(result.reproduce) == {"TORCH_BISECT_BACKEND=aot_eager": "differs",
                                      "TORCH_BISECT_BACKEND=eager": "agrees"}
    assert result.confirmed


def test_a_backend_none_of_whose_subsystems_removes_the_difference_is_inconclusive():
    result = opdiff.compile_bisect(_wrong_from({"aot_eager_decomp_partition"}))
    assert result.answer == "inconclusive" and not result.found
    assert result.backend == "aot_eager_decomp_partition"
    assert ("turning off none of its subsystems (aot_eager_decomp_partition_cse, decomposition) "
            "one at a time removes it") in result.summary()
