"""An FP8 GEMM through `torch._scaled_mm` (e4m3 inputs, amax scales, bf16 out) recorded at L2 on
CPU: both casts found as quantize ops and judged within their format and scale, `_scaled_mm`'s
inputs recorded as float8 with scale_a/scale_b beside them, an input scale 2x too large named at
its cast. tests/cuda/test_cuda_fp8.py runs the same on a GPU."""
from __future__ import annotations

import pytest
import torch

import opdiff
from opdiff.lowp import judge_run
from opdiff.store.adapters import discover

E4M3 = torch.float8_e4m3fn


def _cast(x: torch.Tensor, wrong: float = 1.0):
    scale = 448.0 / x.abs().max().float().clamp(min=1e-12) * wrong
    return (x.float() * scale).clamp(-448.0, 448.0).to(E4M3), scale


def _gemm(x, w, wrong: float = 1.0):
    xq, sx = _cast(x, wrong)
    wq, sw = _cast(w)
    return torch._scaled_mm(xq, wq.t(), scale_a=sx.reciprocal(), scale_b=sw.reciprocal(),
                            out_dtype=torch.bfloat16)


@pytest.mark.parametrize("wrong", [1.0, 2.0])
def test_scaled_mm_quantize_ops_judged(tmp_path, wrong):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 128, generator=g).bfloat16()
    w = (torch.randn(96, 128, generator=g) / 10).bfloat16()
    try:
        _gemm(x, w)
    except (RuntimeError, NotImplementedError) as exc:
        pytest.skip(f"torch._scaled_mm does not run on this CPU build: {exc}")
    with opdiff.dump(None, str(tmp_path / "d"), level="L2", task="tensor"):
        _gemm(x, w, wrong)
    dump = discover(tmp_path / "d")[0]
    records = list(dump.records())
    gemm = next(r for r in records if "scaled_mm" in r["op"])
    tensors = [d for d in gemm["inputs"] if isinstance(d, dict) and d.get("type") == "tensor"]
    assert [d["dtype"] for d in tensors] == ["float8_e4m3fn", "float8_e4m3fn", "float32", "float32"]
    assert all(d["stats"]["max"] > 0 for d in tensors[2:])          # the scales, with statistics
    verdicts = judge_run(dump, records)
    assert len(verdicts) == 2 and all(v.judged for v in verdicts)
    outside = [v for v in verdicts if not v.within]
    assert len(outside) == (1 if wrong != 1.0 else 0)
    if outside:
        assert outside[0].clipped > 0 and outside[0].record == verdicts[0].record


def test_scale_applied_in_bf16_then_widened_is_within(tmp_path):
    """x * s computed in bf16, widened to float32, clamped and cast: the product's bf16
    rounding is the format's to allow (the cast's own input is float32)."""
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(2)).bfloat16()
    with opdiff.dump(None, str(tmp_path / "d"), level="L1", task="tensor"):
        s = (448.0 / x.abs().max().float()).bfloat16()
        (x * s).float().clamp(-448.0, 448.0).to(E4M3)
    dump = discover(tmp_path / "d")[0]
    [verdict] = judge_run(dump)
    assert verdict.within, verdict.words()
