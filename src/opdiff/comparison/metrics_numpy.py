"""The metrics of `opdiff.comparison.metric_table` on numpy arrays, without torch (the ONNX path).

    from opdiff.comparison.metrics_numpy import numpy_measure, numpy_metrics
    numpy_metrics(target, golden)["MaxRelativeErr"]      # the same names and values as the torch
    m = numpy_measure(target, golden)                   # ... plus m.error, m.scale_error,
                                                        #     m.nonfinite_mismatch, m.message

Same definitions as `opdiff.comparison.metrics.measure`, computed on whole arrays in float64 (an
ONNX node's output fits in memory); the partial sums are folded and finished by the shared table,
so only their per-element kernels are written twice. tests/comparison/test_metrics_numpy.py
holds the two implementations to each other.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .metric_table import (CLOSE_COARSE, CLOSE_FINE, EPS, KL_FLOOR, Measurement, empty, finish,
                           identical, nonfinite_mismatch)


def numpy_metrics(target: Any, golden: Any) -> dict[str, Any]:
    """The METRICS of one pair of arrays of the same shape (any numeric dtypes)."""
    return numpy_measure(target, golden).metrics


def numpy_measure(target: Any, golden: Any) -> Measurement:
    """Compare two arrays of the same shape; a Measurement as `metrics.measure` gives it."""
    t, g = np.asarray(target), np.asarray(golden)
    if t.shape != g.shape:
        raise ValueError(f"shapes differ: {tuple(t.shape)} vs {tuple(g.shape)}")
    scalar, n = t.ndim == 0, int(t.size)
    if n == 0:
        return empty()
    t, g = _widen(t), _widen(g)
    if t.dtype == g.dtype and np.array_equal(t, g):      # NaN != NaN: never taken with NaN
        shared = int((~np.isfinite(t)).sum()) if t.dtype.kind == "f" else 0
        return identical(n, scalar, shared)
    t, g = t.astype(np.float64), g.astype(np.float64)
    tf, gf = np.isfinite(t), np.isfinite(g)
    shared = 0
    if not (tf.all() and gf.all()):
        mismatch = int(((np.isnan(t) != np.isnan(g)) | (np.isposinf(t) != np.isposinf(g))
                        | (np.isneginf(t) != np.isneginf(g))).sum())
        if mismatch:
            return nonfinite_mismatch(n, mismatch)
        shared = int((~tf).sum())
        t, g = np.where(tf, t, 0.0), np.where(gf, g, 0.0)
    return finish(_partials(t, g), n, scalar, shared)


def _widen(x: np.ndarray) -> np.ndarray:
    if np.iscomplexobj(x):
        x = np.abs(x)
    if x.dtype == np.bool_:
        x = x.astype(np.uint8)
    return x.reshape(-1)


def _partials(t: np.ndarray, g: np.ndarray) -> tuple[float, ...]:
    """`metric_table.PARTIALS` of finite float64 arrays, in `PARTIAL_NAMES` order."""
    n = t.size
    d = t - g
    ag = np.abs(g)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rel = np.abs(d) / ag
    tiny = ag <= EPS
    if tiny.any():
        # 0/0 (both sides 0) is no error; a target value over a golden 0 takes msprobe's eps.
        rel = np.nan_to_num(rel, nan=0.0, posinf=np.inf)
        zero = g == 0
        fix = zero & np.isinf(rel)
        rel[fix] = 0.0
        sum_ape, n_ape = float(rel.sum()), n - int(zero.sum())
        sum_rel = float(np.where(tiny, 0.0, rel).sum())
        rel[fix] = np.abs((t[fix] + EPS) - EPS) / EPS
    else:
        sum_rel = sum_ape = float(rel.sum())
        n_ape = n
    kl_p, kl_q = _scaled(t), _scaled(g)
    ad = np.abs(d)
    with np.errstate(over="ignore", invalid="ignore"):    # huge values: inf, as torch says
        return (float(d @ d), float(t @ t), float(g @ g), float(t @ g), float(ad.max()),
                float(ad.sum()), float(rel.max()), sum_rel, sum_ape, n_ape,
                int((rel < CLOSE_FINE).sum()), int((rel < CLOSE_COARSE).sum()),
                float(kl_p @ np.log(kl_p / kl_q)), float(kl_p.sum()), float(kl_q.sum()))


def _scaled(x: np.ndarray) -> np.ndarray:
    """KLD's side: min-max scaled to [0, 1] and floored (normalised later, from its sum)."""
    lo, hi = float(x.min()), float(x.max())
    return np.maximum((x - lo) * (1.0 / ((hi - lo) or 1.0)), KL_FLOOR)


__all__ = ["numpy_metrics", "numpy_measure"]
