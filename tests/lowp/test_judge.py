"""The quantize-op judge on tensors quantized as FP8 recipes do: an amax scale per tensor or per
row (block) passes whatever it rounds or underflows; a scale too large (2x, an amax of a local
piece) is outside by exactly the elements it clipped; a scale applied in bf16 is allowed bf16's
rounding and no more."""
from __future__ import annotations

import torch

from opdiff.lowp.formats import FORMATS
from opdiff.lowp.judge import measure

E4M3, E5M2 = FORMATS["float8_e4m3fn"], FORMATS["float8_e5m2"]


def _x(rows: int = 64, cols: int = 48) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-3, 1, rows)[:, None]
    return x.to(torch.bfloat16)


def _quantize(x, scale, fmt=E4M3, dtype=torch.float32):
    scaled = (x.to(dtype) * scale.to(dtype)).clamp(-fmt.largest, fmt.largest)
    return scaled.to(getattr(torch, fmt.name))


def test_amax_scale_per_tensor_is_within():
    x = _x()
    for fmt in (E4M3, E5M2):
        s = fmt.largest / x.float().abs().max()
        found = measure(x, _quantize(x, s, fmt), s.double(), fmt)
        assert found["outside"] == 0 and found["clipped"] == 0
        assert found["saturated"] > 0 and 0 < found["error"] <= found["bound"]


def test_small_values_underflow_without_blame():
    x = _x()
    s = E4M3.largest / x.float().abs().max() / 64          # a scale far too small: underflow
    found = measure(x, _quantize(x, s), s.double(), E4M3)
    assert found["outside"] == 0
    assert found["underflow"] > 0.05


def test_scale_twice_too_large_clips_and_is_outside():
    x = _x()
    s = 2 * E4M3.largest / x.float().abs().max()
    q = _quantize(x, s)
    found = measure(x, q, s.double(), E4M3)
    # clipped further than the half step past 448 that rounding to 448 could explain
    beyond = E4M3.largest + E4M3.half_step(E4M3.largest)
    clipped = int((x.double().abs() * s.double() > beyond).sum())
    assert found["outside"] == found["clipped"] == clipped > 0


def test_per_row_scales_one_row_wrong():
    x = _x()
    s = E4M3.largest / x.float().abs().amax(dim=1, keepdim=True)
    assert measure(x, _quantize(x, s), s.double(), E4M3)["outside"] == 0
    wrong = s.clone()
    wrong[5] *= 2                        # one block scaled 2x: its largest values clip
    found = measure(x, _quantize(x, wrong), wrong.double(), E4M3)
    assert 0 < found["outside"] == found["clipped"] <= x.shape[1]


def test_amax_of_a_local_piece_is_outside():
    x = _x()
    s = E4M3.largest / x[:32].float().abs().max()        # the first shard's amax only
    found = measure(x, _quantize(x, s), s.double(), E4M3)
    assert found["clipped"] > 0 and found["outside"] >= found["clipped"]


def test_dequantized_by_another_scale_is_outside():
    x = _x()
    s = E4M3.largest / x.float().abs().max()
    found = measure(x, _quantize(x, s), 2 * s.double(), E4M3)   # judged against the wrong scale
    assert found["outside"] > x.numel() // 2


def test_scale_applied_in_bf16_allowed_bf16_rounding_only():
    x = _x()
    s = E4M3.largest / x.float().abs().max()
    q = _quantize(x, s, dtype=torch.bfloat16)
    bf16 = 2.0 ** -8
    assert measure(x, q, s.to(torch.bfloat16).double(), E4M3, product=bf16)["outside"] == 0
    # judged as if the product were float32, the bf16 rounding shows
    assert measure(x, q, s.to(torch.bfloat16).double(), E4M3)["outside"] > 0


def test_nonfinite_from_finite_is_outside():
    x = _x()
    s = 4 * E5M2.largest / x.float().abs().max()
    q = (x.float() * s).to(torch.float8_e5m2)             # no clamp: e5m2 makes inf far past its max
    found = measure(x, q, s.double(), E5M2)
    assert found["nonfinite"] > 0 and found["outside"] >= found["nonfinite"]
