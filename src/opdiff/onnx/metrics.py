"""msit's five metrics, with its formulas and thresholds, and a verdict that treats inf/NaN as errors.

    diff = compare_arrays(target, golden)
    diff.msit["CosineSimilarity"], diff.msit["RelativeEuclideanDistance"], ...
    result, reason = MsitThresholds().verdict(diff)     # ("error", "cosine 0.93 <= 0.99; ...")

Formulas follow msaccucmp (the engine behind `msit debug compare`) so numbers agree with what
Ascend users already read. One deliberate difference: msit calls a row whose cosine is NaN "no
error" and skips inf/NaN; here an inf/NaN that the golden does not have is always an error.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..comparison.result import ERROR, PASS, WARNING

EPS = 1e-10
MSIT_COLUMNS = ("CosineSimilarity", "RelativeEuclideanDistance", "KullbackLeiblerDivergence",
                "RootMeanSquareError", "MeanRelativeError", "MaxAbsoluteError", "MeanAbsoluteError")


@dataclass
class TensorDiff:
    """Distance between one target tensor and its golden tensor."""
    msit: dict = field(default_factory=dict)           # MSIT_COLUMNS -> float | None
    metrics: dict = field(default_factory=dict)        # opdiff METRICS names -> float | None
    target_nonfinite: int = 0
    golden_nonfinite: int = 0
    mismatched_nonfinite: int = 0     # positions where exactly one side, or different inf/NaN
    integer_mismatch: Optional[int] = None             # integer tensors: elements that differ
    problem: str = ""                 # a reason no metric can be computed (shape mismatch)
    error: Optional[float] = None     # relative L2 error |d| / max(|t|, |g|), as the shared compare


def compare_arrays(target: np.ndarray, golden: np.ndarray) -> TensorDiff:
    """All metrics for one pair. Arrays may differ in dtype (fp16 vs fp32, int8 vs float)."""
    diff = TensorDiff()
    if target.size != golden.size:
        diff.problem = f"shape {list(target.shape)} vs golden {list(golden.shape)}"
        return diff
    x = np.asarray(target).reshape(-1)
    y = np.asarray(golden).reshape(-1)
    if x.dtype.kind in "iub" and y.dtype.kind in "iub":
        diff.integer_mismatch = int((x.astype(np.int64) != y.astype(np.int64)).sum())
    x = x.astype(np.float64)
    y = y.astype(np.float64)
    fx, fy = np.isfinite(x), np.isfinite(y)
    diff.target_nonfinite = int((~fx).sum())
    diff.golden_nonfinite = int((~fy).sum())
    if diff.target_nonfinite or diff.golden_nonfinite:
        same = (~fx & ~fy) & ((x == y) | (np.isnan(x) & np.isnan(y)))
        diff.mismatched_nonfinite = int(((~fx | ~fy) & ~same).sum())
        if diff.mismatched_nonfinite:
            # as the shared compare does: no metric means anything once inf/NaN positions differ
            diff.msit = {k: float("nan") for k in MSIT_COLUMNS}
            diff.metrics = {k: float("nan") for k in _OPDIFF_KEYS}
            diff.error = float("inf")
            return diff
        keep = fx & fy
        x, y = x[keep], y[keep]
    diff.msit = _msit(x, y)
    diff.metrics = _opdiff_metrics(x, y, diff.msit)
    if x.size:
        scale = max(np.linalg.norm(x), np.linalg.norm(y))
        diff.error = float(np.linalg.norm(x - y) / scale) if scale > 0 else 0.0
    return diff


_OPDIFF_KEYS = ("Cosine", "RMSE", "MAPE", "MaxAbsErr", "MaxRelativeErr", "MeanRelativeErr",
                "RelEuclideanDistance", "KLD", "One Thousandth Err Ratio", "Five Thousandths Err Ratio")


def _msit(x: np.ndarray, y: np.ndarray) -> dict:
    if x.size == 0:
        return {k: None for k in MSIT_COLUMNS}
    d = x - y
    nx, ny = np.linalg.norm(x), np.linalg.norm(y)
    if nx < EPS and ny < EPS:
        cosine = 1.0
    elif nx < EPS or ny < EPS:
        cosine = float("nan")
    else:
        cosine = min(float(np.dot(x / nx, y / ny)), 1.0)
    red = 0.0 if ny < EPS else float(np.sqrt(np.sum(d * d) / np.sum(y * y)))
    nonzero = np.abs(y) > EPS
    rel = np.zeros_like(y)
    rel[nonzero] = np.abs(x[nonzero] / y[nonzero] - 1.0)
    return {"CosineSimilarity": cosine,
            "RelativeEuclideanDistance": red,
            "KullbackLeiblerDivergence": _kl(x, y),
            "RootMeanSquareError": float(np.sqrt(np.mean(d * d))),
            "MeanRelativeError": float(rel.mean()),
            "MaxAbsoluteError": float(np.abs(d).max()),
            "MeanAbsoluteError": float(np.abs(d).mean())}


def _kl(x: np.ndarray, y: np.ndarray) -> float:
    """msaccucmp's KL: each side min-max scaled to [0,1], floored at EPS, normalised; p=target."""
    def dist(v):
        span = v.max() - v.min()
        v = (v - v.min()) / span if span > 0 else np.zeros_like(v)
        v = np.maximum(v, EPS)
        return v / v.sum()
    p, q = dist(x), dist(y)
    return float(np.sum(p * np.log(p / q)))


def _opdiff_metrics(x: np.ndarray, y: np.ndarray, m: dict) -> dict:
    if x.size == 0:
        return {}
    ad = np.abs(x - y)
    rel = ad / (np.abs(y) + EPS)
    return {"Cosine": m["CosineSimilarity"], "RMSE": m["RootMeanSquareError"], "MAPE": None,
            "MaxAbsErr": m["MaxAbsoluteError"], "MaxRelativeErr": float(rel.max()),
            "MeanRelativeErr": m["MeanRelativeError"],
            "RelEuclideanDistance": m["RelativeEuclideanDistance"],
            "KLD": m["KullbackLeiblerDivergence"],
            "One Thousandth Err Ratio": float((rel <= 1e-3).mean()),
            "Five Thousandths Err Ratio": float((rel <= 5e-3).mean())}


@dataclass(frozen=True)
class MsitThresholds:
    """msit's IsPrecisionError rule: any one metric past its threshold is an error.

    Differences from msit, on purpose: inf/NaN that the golden does not have is an error; a NaN
    cosine (one side all zeros, the other not) is an error; integer tensors must match exactly.
    """
    cosine: float = 0.99
    red: float = 0.05
    kl: float = 0.005
    rmse: float = 1.0
    mre: float = 1.0

    def verdict(self, diff: TensorDiff) -> tuple:
        """(PASS | WARNING | ERROR, reason in words)."""
        if diff.problem:
            return ERROR, diff.problem
        if diff.mismatched_nonfinite:
            side = "target" if diff.target_nonfinite >= diff.golden_nonfinite else "golden"
            return ERROR, (f"{diff.mismatched_nonfinite} inf/NaN value(s) not matched by the other side "
                           f"({side} has {max(diff.target_nonfinite, diff.golden_nonfinite)})")
        if diff.integer_mismatch:
            return ERROR, f"{diff.integer_mismatch} integer value(s) differ"
        m = diff.msit
        if m.get("CosineSimilarity") is None:
            return WARNING, "no finite values to compare"
        broken = []
        cos = m["CosineSimilarity"]
        if np.isnan(cos):
            broken.append("cosine undefined: one side is all zeros")
        elif cos <= self.cosine:
            broken.append(f"cosine {cos:.6g} <= {self.cosine}")
        checks = (("RelativeEuclideanDistance", "RED", self.red),
                  ("KullbackLeiblerDivergence", "KL", self.kl),
                  ("RootMeanSquareError", "RMSE", self.rmse),
                  ("MeanRelativeError", "MRE", self.mre))
        for key, short, limit in checks:
            if m[key] >= limit:
                broken.append(f"{short} {m[key]:.4g} >= {limit}")
        if broken:
            return ERROR, "; ".join(broken)
        if diff.target_nonfinite:
            return WARNING, f"both sides have the same {diff.target_nonfinite} inf/NaN value(s)"
        return PASS, ""
