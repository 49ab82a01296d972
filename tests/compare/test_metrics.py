"""Metrics against an independent numpy implementation of msprobe's formulas."""
import math

import numpy as np
import pytest
import torch

from opdiff.compare.metrics import measure, stats_measure, tensor_metrics
from opdiff.compare.result import METRICS


def msprobe_reference(n: np.ndarray, b: np.ndarray) -> dict:
    """msprobe's definitions (research/msprobe.md §2.3), written out directly in numpy."""
    n = n.reshape(-1).astype(np.float64)
    b = b.reshape(-1).astype(np.float64)
    eps = np.finfo(np.float64).eps
    nz, bz = n.copy(), b.copy()
    zero = bz == 0
    bz[zero] += eps
    nz[zero] += eps
    rel = np.abs((nz - bz) / bz)
    cos = n.dot(b) / (np.linalg.norm(n) * np.linalg.norm(b))
    return {"Cosine": cos, "MaxAbsErr": np.max(np.abs(n - b)), "MaxRelativeErr": np.max(rel),
            "One Thousandth Err Ratio": np.mean(rel < 0.001),
            "Five Thousandths Err Ratio": np.mean(rel < 0.005)}


@pytest.mark.parametrize("n", [7, 1000, 200_003])   # 200_003 spans several streaming chunks
def test_agrees_with_msprobe_formulas(n):
    rng = np.random.default_rng(n)
    g = rng.standard_normal(n).astype(np.float32)
    g[:: 17] = 0.0                                    # golden zeros take msprobe's eps path
    t = (g * (1 + rng.normal(0, 3e-3, n))).astype(np.float32)
    t[:: 34] = 1e-3                                   # target nonzero where golden is zero
    got = tensor_metrics(torch.from_numpy(t), g)      # torch and numpy inputs both work
    ref = msprobe_reference(t, g)
    for key, value in ref.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
    assert set(got) == set(METRICS)


def test_identical_tensors_score_perfectly():
    x = torch.randn(64, 3, generator=torch.Generator().manual_seed(2))
    m = tensor_metrics(x, x.clone())
    assert m["Cosine"] == 1.0 and m["MaxAbsErr"] == 0.0 and m["RMSE"] == 0.0
    assert m["One Thousandth Err Ratio"] == 1.0 and m["KLD"] == 0.0


def test_scale_fault_shows_in_error_and_scale_error():
    g = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    m = measure(g * 1.01, g)                     # float32 rounding of g*1.01 moves digits ~1e-7
    assert m.error == pytest.approx(0.01 / 1.01, rel=1e-5)
    assert m.scale_error == pytest.approx(0.01, rel=1e-5)
    assert m.metrics["RelEuclideanDistance"] == pytest.approx(0.01, rel=1e-5)
    assert m.metrics["MaxRelativeErr"] == pytest.approx(0.01, rel=1e-4)
    assert m.metrics["One Thousandth Err Ratio"] == 0.0


def test_bf16_rounding_is_random_not_systematic():
    g = torch.randn(100_000, generator=torch.Generator().manual_seed(1))
    m = measure(g.bfloat16(), g)
    assert 5e-4 < m.error < 3e-3            # about 0.4 of bf16's unit roundoff 2^-8
    assert abs(m.scale_error) < 1e-4        # unbiased rounding averages out


def test_nan_inf_at_same_positions_are_not_errors():
    g = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0])
    t = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0 + 1e-6])
    m = measure(t, g)
    assert not m.nonfinite_mismatch
    assert math.isfinite(m.error) and m.error < 1e-6
    assert m.metrics["MaxAbsErr"] == pytest.approx(1e-6, rel=0.2)


def test_nan_at_different_positions_is_reported():
    g = torch.tensor([1.0, 2.0, 3.0])
    t = torch.tensor([1.0, float("nan"), 3.0])
    m = measure(t, g)
    assert m.nonfinite_mismatch == 1
    assert math.isnan(m.metrics["Cosine"]) and "inf/NaN" in m.message
    assert measure(torch.tensor([1.0, float("inf")]), torch.tensor([1.0, -float("inf")])).nonfinite_mismatch


def test_zero_and_constant_tensors_give_no_nan_error():
    z = torch.zeros(100)
    assert measure(z, z.clone()).error == 0.0
    c = torch.full((100,), 3.0)
    m = measure(c + 1e-3, c)
    assert math.isfinite(m.metrics["KLD"]) and math.isfinite(m.error) and m.error > 0
    only_target = measure(torch.ones(10), torch.zeros(10))
    assert only_target.error == 1.0 and math.isnan(only_target.metrics["Cosine"])


def test_scalars_and_empty_tensors():
    m = tensor_metrics(torch.tensor(2.0), torch.tensor(2.5))
    assert m["Cosine"] is None and m["One Thousandth Err Ratio"] is None
    assert m["MaxAbsErr"] == 0.5 and m["MaxRelativeErr"] == pytest.approx(0.2)
    assert tensor_metrics(torch.ones(1), torch.ones(1))["Cosine"] is None
    assert all(v is None for v in tensor_metrics(torch.ones(0), torch.ones(0)).values())


def test_integer_and_bool_tensors():
    a = torch.tensor([1, 2, 3])
    assert measure(a, a.clone()).error == 0.0
    assert measure(torch.tensor([True, False]), torch.tensor([True, True])).error > 0


def test_statistics_only_mean_near_zero_is_not_an_alarm():
    # msprobe's diff_analyze flags batch_norm outputs whose mean is ~0; opdiff measures the mean
    # difference against the tensor's RMS instead.
    g = {"max": 3.0, "min": -3.0, "mean": 1e-7, "norm": 100.0, "nan": 0, "inf": 0}
    t = {"max": 3.001, "min": -3.0, "mean": 5e-6, "norm": 100.02, "nan": 0, "inf": 0}
    m = stats_measure(t, g, numel=10_000)
    assert m.error < 1e-3 and m.mode == "statistics"
    assert m.metrics["MeanRelativeErr"] > 10           # the naive relative diff is huge
    bad = stats_measure({**t, "nan": 3}, g, numel=10_000)
    assert bad.nonfinite_mismatch
