"""The replay's own error measures give what the compare's `measure` gives (error, scale error,
inf/NaN mismatch) on real tensors: rounded, scaled, zeros, shared and misplaced inf/NaN, complex,
and tensors longer than one chunk."""
from __future__ import annotations

import math

import pytest
import torch

from opdiff.comparison.metrics import measure
from opdiff.comparison.replay import errors
from opdiff.comparison.replay.errors import errors_against


def _cases():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5000, generator=g, dtype=torch.float64)
    relu = torch.relu(x)
    with_inf = x.clone()
    with_inf[[3, 70]] = math.inf
    with_inf[9] = math.nan
    moved = with_inf.clone()
    moved[[3, 4]] = moved[[4, 3]]
    neg = with_inf.clone()
    neg[70] = -math.inf
    c = torch.randn(300, generator=g, dtype=torch.complex128)
    return {
        "bf16 rounding": (x.bfloat16(), x),
        "scaled 1.001": ((x * 1.001).float(), x),
        "relu zeros": (relu.half(), relu),
        "all zero golden": (torch.ones(10), torch.zeros(10, dtype=torch.float64)),
        "both zero": (torch.zeros(10), torch.zeros(10, dtype=torch.float64)),
        "identical": (x.clone(), x),
        "shared inf/NaN": (with_inf.float(), with_inf),
        "misplaced inf": (moved, with_inf),
        "inf of the other sign": (neg, with_inf),
        "complex": (c.to(torch.complex64), c),
        "scalar": (torch.tensor(2.5), torch.tensor(2.0, dtype=torch.float64)),
    }


@pytest.mark.parametrize("case", list(_cases()))
def test_errors_against_is_measure(case):
    t, e = _cases()[case]
    got, want = errors_against(t, e), measure(t, e)
    assert got.nonfinite_mismatch == want.nonfinite_mismatch
    for a, b in ((got.error, want.error), (got.scale_error, want.scale_error)):
        assert (math.isinf(a) and math.isinf(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-15)
    if case == "scaled 1.001":
        assert got.scale_error == pytest.approx(1e-3, rel=1e-3)
    if case == "misplaced inf":
        assert got.nonfinite_mismatch == 2 and math.isinf(got.error)


def test_chunks_fold_to_the_one_pass_sums(monkeypatch):
    g = torch.Generator().manual_seed(1)
    e = torch.randn(10_007, generator=g, dtype=torch.float64)
    t = (e * 1.0003).bfloat16()
    whole = errors_against(t, e)
    monkeypatch.setattr(errors, "_CHUNK", 1000)        # eleven chunks, the last one short
    chunked = errors_against(t, e)
    assert chunked.error == pytest.approx(whole.error, rel=1e-12)
    assert chunked.scale_error == pytest.approx(whole.scale_error, rel=1e-9)
    assert whole.error == pytest.approx(measure(t, e).error, rel=1e-9)
