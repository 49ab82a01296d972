"""FP8 on a GPU: an FP8 linear through `torch._scaled_mm` (e4m3 inputs, amax scales, bf16 out;
CUDA compute capability 8.9 or newer) recorded by opdiff: the casts are found as quantize ops
and judged within their format and scale, `_scaled_mm`'s scale_a/scale_b are recorded as its
inputs, and an input scale 2x too large is named at its cast. Not yet run on a GPU (the same
steps run on CPU in tests/lowp/test_scaled_mm.py)."""
from __future__ import annotations

import pytest
import torch

import opdiff
from opdiff.lowp import judge_run
from opdiff.store.adapters import discover

pytestmark = pytest.mark.cuda
E4M3 = torch.float8_e4m3fn


def _fp8_capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def _cast(x: torch.Tensor, wrong: float = 1.0):
    scale = 448.0 / x.abs().max().float().clamp(min=1e-12) * wrong
    return (x.float() * scale).clamp(-448.0, 448.0).to(E4M3), scale


def _step(path, wrong: float):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(64, 128, device="cuda", generator=g).bfloat16()
    w = (torch.randn(96, 128, device="cuda", generator=g) / 10).bfloat16()
    with opdiff.dump(None, str(path), level="L2", task="tensor"):     # (aten: _scaled_mm too)
        xq, sx = _cast(x, wrong)
        wq, sw = _cast(w)
        out = torch._scaled_mm(xq, wq.t(), scale_a=sx.reciprocal(), scale_b=sw.reciprocal(),
                               out_dtype=torch.bfloat16)
    return out


@pytest.mark.skipif(not _fp8_capable(), reason="torch._scaled_mm needs compute capability 8.9+")
@pytest.mark.parametrize("wrong", [1.0, 2.0])
def test_scaled_mm_quantize_ops_judged(tmp_path, wrong):
    _step(tmp_path / "d", wrong)
    dump = discover(tmp_path / "d")[0]
    records = list(dump.records())
    gemm = next(r for r in records if "scaled_mm" in r["op"])
    dtypes = [d.get("dtype") for d in gemm["inputs"] if isinstance(d, dict) and d.get("type") == "tensor"]
    assert dtypes[:2] == ["float8_e4m3fn", "float8_e4m3fn"] and len(dtypes) >= 4   # scales too
    verdicts = judge_run(dump, records)
    assert len(verdicts) == 2
    outside = [v for v in verdicts if not v.within]
    assert len(outside) == (1 if wrong != 1.0 else 0)
    if outside:
        assert outside[0].clipped > 0
