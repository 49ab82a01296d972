"""One metric specification: the numpy implementation against the torch one, and the table."""
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from opdiff.comparison.metric_table import (ALL_METRICS, DIGITS, METRIC_TABLE, METRICS,
                                           STAT_METRICS)
from opdiff.comparison.metrics import measure
from opdiff.comparison.metrics_numpy import numpy_measure, numpy_metrics

EXACT = {"MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio", "Five Thousandths Err Ratio"}


def _same(a, b, key) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    if key in EXACT:
        return a == b
    # Summation order differs (chunked dots against numpy's pairwise sums): float64 noise.
    # KLD and scale_error are small differences of O(1) sums, so their noise is absolute.
    if key in ("KLD", "scale_error"):
        return abs(a - b) <= 1e-12
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b)) + 1e-15


def assert_agree(t, g):
    want = measure(torch.from_numpy(np.array(t)), torch.from_numpy(np.array(g)))
    got = numpy_measure(t, g)
    assert list(got.metrics) == list(METRICS)
    for key in METRICS:
        assert _same(got.metrics[key], want.metrics[key], key), (key, got.metrics[key],
                                                                  want.metrics[key])
    assert list(got.extra) == [k for k in ALL_METRICS if k not in METRICS] == list(want.extra)
    for key in got.extra:
        assert _same(got.extra[key], want.extra[key], key), key
    for key in ("error", "scale_error"):
        assert _same(getattr(got, key), getattr(want, key), key), key
    assert got.nonfinite_mismatch == want.nonfinite_mismatch
    assert got.nonfinite_shared == want.nonfinite_shared
    assert got.numel == want.numel and got.message == want.message


def _random_pairs():
    rng = np.random.default_rng(18)
    for i in range(40):
        n = int(rng.choice([2, 3, 17, 1000, 140_001]))     # 140_001: two torch chunks
        dtype = rng.choice([np.float32, np.float64, np.float16])
        g = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6)).astype(dtype)
        t = (g * (1 + rng.normal(0, 10.0 ** rng.integers(-7, -1), n))).astype(dtype)
        if i % 3 == 0:
            g[rng.integers(0, n, max(1, n // 7))] = 0      # golden zeros
        if i % 4 == 0:
            t[rng.integers(0, n, max(1, n // 11))] = 0
        if i % 5 == 0:
            g = np.maximum(g, 0).astype(dtype)             # relu: zeros on both sides
            t = np.maximum(t, 0).astype(dtype)
        yield f"random{i}-{n}-{np.dtype(dtype).name}", t, g


def _edge_pairs():
    f = np.float32
    yield "msprobe max rel", np.array([1, 0, 2, 3], f), np.array([1, 1e-12, 2, 3], f)
    yield "zeros", np.zeros(10, f), np.zeros(10, f)
    yield "zeros vs ones", np.ones(10, f), np.zeros(10, f)
    yield "golden zero, target not", np.array([0, 1e-20, 2, 1], f), np.array([0, 0, 0, 1], f)
    yield "tiny golden", np.array([1e-30, 1.0], np.float64), np.array([2e-30, 1.0], np.float64)
    yield "subnormal golden", np.array([1.0, 2.0], np.float64), np.array([1e-320, 2.0], np.float64)
    yield "constant", np.full(50, 3.001, f), np.full(50, 3.0, f)
    yield "nan same place", np.array([1, np.nan, 3], f), np.array([1, np.nan, 3.1], f)
    yield "inf same place", np.array([1, np.inf, -np.inf, 2], f), np.array([1, np.inf, -np.inf, 2.5], f)
    yield "nan elsewhere", np.array([1, np.nan, 3], f), np.array([1, 2, 3], f)
    yield "inf sign differs", np.array([1, np.inf], f), np.array([1, -np.inf], f)
    yield "identical with nan", np.array([1, np.nan], f), np.array([1, np.nan], f)
    yield "identical", np.arange(12, dtype=f), np.arange(12, dtype=f)
    yield "int", np.array([1, 2, 3, 4]), np.array([1, 2, 3, 5])
    yield "int identical", np.array([1, 2, 3]), np.array([1, 2, 3])
    yield "int vs float", np.array([1, 2, 3], np.int64), np.array([1.0, 2.0, 3.5])
    yield "bool", np.array([True, False, True]), np.array([True, True, True])
    yield "fp16 vs fp32 equal values", np.array([1, 2], np.float16), np.array([1, 2], np.float32)
    yield "one element", np.array([2.0], f), np.array([2.5], f)
    yield "0-d", np.array(2.0, f), np.array(2.5, f)
    yield "empty", np.zeros(0, f), np.zeros(0, f)
    yield "2-d", np.arange(12, dtype=f).reshape(3, 4) + 0.5, np.arange(12, dtype=f).reshape(3, 4)
    yield "negative", -np.linspace(1, 2, 9, dtype=f), -np.linspace(1, 2.01, 9, dtype=f)
    yield "huge", np.array([1e200, 2.0]), np.array([1e200, 1.0])


@pytest.mark.parametrize("case", list(_random_pairs()) + list(_edge_pairs()), ids=lambda c: c[0])
def test_numpy_and_torch_agree(case):
    _, t, g = case
    assert_agree(t, g)


def test_max_relative_err_is_msprobes_on_both():
    # The golden 1e-12 is not 0: msprobe adds no eps there, |0 - 1e-12| / 1e-12 = 1.
    # (onnx/metrics.py's |d| / (|g| + 1e-10) said 0.0099 in the same column.)
    t, g = np.array([1.0, 0.0, 2.0, 3.0]), np.array([1.0, 1e-12, 2.0, 3.0])
    assert numpy_metrics(t, g)["MaxRelativeErr"] == pytest.approx(1.0, rel=1e-12)
    assert measure(torch.from_numpy(t), torch.from_numpy(g)).metrics["MaxRelativeErr"] == \
        pytest.approx(1.0, rel=1e-12)


def test_shapes_must_match():
    with pytest.raises(ValueError):
        numpy_metrics(np.zeros(3), np.zeros(4))


def test_identical_values_are_the_tables():
    x = np.linspace(-1, 1, 33)
    m = numpy_measure(x, x.copy())
    assert {**m.metrics, **m.extra} == {m.name: m.identical for m in METRIC_TABLE}
    # ... and what the formulas give for two equal tensors of different dtypes
    f = numpy_measure(x.astype(np.float32), x.astype(np.float32).astype(np.float64))
    formula = {**f.metrics, **f.extra}
    for metric in METRIC_TABLE:
        assert formula[metric.name] == pytest.approx(metric.identical, abs=1e-12), metric.name


def test_table_names_and_digits():
    assert METRICS == tuple(m.name for m in METRIC_TABLE if m.column)
    assert len(set(METRICS)) == len(METRICS)
    assert all(DIGITS[name] > 0 for name in METRICS + STAT_METRICS)
    assert DIGITS["Cosine"] > DIGITS["RMSE"]     # a cosine near 1 carries its news far out


def test_the_table_and_the_numpy_path_do_not_import_torch():
    code = ("import sys, opdiff.comparison.metric_table, opdiff.comparison.metrics_numpy, "
            "opdiff.comparison.result; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_0d_numpy_array_stays_a_scalar_in_the_torch_path():
    m = measure(np.array(2.0), np.array(2.5)).metrics
    assert m["Cosine"] is None and m["One Thousandth Err Ratio"] is None


def test_mean_abs_err_and_shared_nonfinite_counts():
    t = np.array([1.0, np.inf, np.nan, 4.0])
    g = np.array([1.5, np.inf, np.nan, 3.0])
    for m in (numpy_measure(t, g), measure(torch.from_numpy(t), torch.from_numpy(g))):
        assert m.extra["MeanAbsErr"] == pytest.approx((0.5 + 1.0) / 4)
        assert m.nonfinite_shared == 2 and not m.nonfinite_mismatch
        assert "MeanAbsErr" not in m.metrics           # not a column of the compare CSV
    same = np.array([1.0, np.inf, -np.inf])
    assert numpy_measure(same, same.copy()).nonfinite_shared == 2
    assert measure(torch.from_numpy(same), torch.from_numpy(same.copy())).nonfinite_shared == 2
