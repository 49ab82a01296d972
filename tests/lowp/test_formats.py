"""The format facts against torch's own casts: every float8 format's largest value and smallest
normal as torch.finfo says, and half_step bounding what a cast into the format does to any
value in its range (the bound the quantize-op judge rests on)."""
from __future__ import annotations

import pytest
import torch

from opdiff.lowp.formats import FORMATS, format_of, is_low_precision, unit_roundoff

FLOAT8 = [name for name, f in FORMATS.items() if not f.packed and not f.scale_only]


@pytest.mark.parametrize("name", FLOAT8)
def test_facts_are_torchs(name):
    fmt, info = FORMATS[name], torch.finfo(getattr(torch, name))
    assert fmt.largest == info.max
    assert fmt.smallest_normal == info.smallest_normal
    # the smallest subnormal is representable and half of it rounds to zero
    dtype = getattr(torch, name)
    tiny = torch.tensor([fmt.smallest_subnormal, fmt.smallest_subnormal * 0.49], dtype=torch.float64)
    assert tiny.to(dtype).to(torch.float64).tolist() == [fmt.smallest_subnormal, 0.0]


@pytest.mark.parametrize("name", FLOAT8)
def test_half_step_bounds_every_cast(name):
    fmt, dtype = FORMATS[name], getattr(torch, name)
    g = torch.Generator().manual_seed(0)
    # magnitudes spread over the whole range, subnormals and zero included, both signs
    exps = torch.empty(20000, dtype=torch.float64).uniform_(
        torch.log2(torch.tensor(fmt.smallest_subnormal / 4)).item(),
        torch.log2(torch.tensor(fmt.largest)).item(), generator=g)
    x = torch.pow(2.0, exps) * torch.where(torch.rand(20000, generator=g) < 0.5, -1.0, 1.0)
    x = x.to(torch.float32).to(torch.float64)           # what a cast from float32 sees
    q = x.to(torch.float32).to(dtype).to(torch.float64)
    bound = torch.tensor([fmt.half_step(v) for v in q.tolist()], dtype=torch.float64)
    assert bool(((q - x).abs() <= bound).all())
    # and it is tight: some element uses more than half of its bound
    assert float(((q - x).abs() / bound).max()) > 0.9


def test_names_and_roundoffs():
    assert format_of("torch.float8_e4m3fn") is FORMATS["float8_e4m3fn"]
    assert format_of("e5m2") is FORMATS["float8_e5m2"]
    assert format_of("bfloat16") is None and format_of(None) is None
    assert is_low_precision("float8_e5m2") and not is_low_precision("float8_e8m0fnu")
    assert not is_low_precision("int8")
    assert unit_roundoff("bfloat16") == 2.0 ** -8 and unit_roundoff("torch.float32") == 2.0 ** -24
