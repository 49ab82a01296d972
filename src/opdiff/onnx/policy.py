"""msit's verdict as a shared-compare `Policy`: the one rule every ONNX tensor is judged by.

    from opdiff.onnx.policy import MsitPolicy, MsitThresholds
    verdict = MsitPolicy().judge(measurement, "float16", "float32")   # Verdict(ERROR, "No", "RED ...")
    measurement, verdict = MsitPolicy().judge_arrays(target_array, golden_array)   # numpy, no torch
    result = compare_pair(target_dump, golden_dump, policy=MsitPolicy())   # the same rule on dumps

msit's IsPrecisionError: any one of five metrics past its threshold is an error (CosineSimilarity
> 0.99, RelativeEuclideanDistance < 0.05, KullbackLeiblerDivergence < 0.005, RootMeanSquareError
< 1.0, MeanRelativeError < 1.0 must all hold). The metrics are the shared ones
(`opdiff.comparison.metric_table`: Cosine, RelEuclideanDistance, KLD, RMSE, MeanRelativeErr), so
`opdiff onnx` rows and a dump compare of the same tensors show the same numbers.

Dtype-aware like the dump compare: RMSE is msit's one absolute threshold, and healthy fp16
rounding of large activations (|x| ~ 1e3: RMSE ~ 1 at cosine 1.000000) breaks it. An RMSE past
1.0 is an error only when the tensor's relative L2 error also exceeds its dtype's tolerance
(`opdiff.comparison.verdicts`, float16: 2e-3); otherwise it is a warning that says so. The RMSE
column keeps msit's number. `MsitThresholds(dtype_aware=False)` is msit's rule exactly.

Differences from msit, on purpose: inf/NaN that the golden does not have is an error; a NaN
cosine (one side all zeros, the other not) is an error; integer tensors must match exactly; the
same inf/NaN at the same places on both sides is a warning (inherited), not a pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..comparison.result import ERROR, PASS, WARNING
from ..comparison.verdicts import Policy, Verdict
from ..dtypes import is_exact
from ..numbers import human


@dataclass(frozen=True)
class MsitThresholds:
    """msit's five thresholds (`msit debug compare`'s defaults)."""
    cosine: float = 0.99
    red: float = 0.05
    kl: float = 0.005
    rmse: float = 1.0
    mre: float = 1.0
    dtype_aware: bool = True    # an RMSE breach within the dtype's relative tolerance warns


# (shared metric, short name in reasons, MsitThresholds field): the "must stay below" four.
_BELOW = (("RelEuclideanDistance", "RED", "red"), ("KLD", "KL", "kl"), ("RMSE", "RMSE", "rmse"),
          ("MeanRelativeErr", "MRE", "mre"))


class MsitPolicy(Policy):
    """Any one of cosine, RED, KL, RMSE, MRE past msit's threshold is an error; inf/NaN too."""

    def __init__(self, thresholds: MsitThresholds | None = None):
        super().__init__()
        self.msit = thresholds or MsitThresholds()

    def broken(self, metrics: dict) -> list:
        """The thresholds `metrics` (shared names) break, each in words; [] when none."""
        t, out = self.msit, []
        cos = metrics.get("Cosine")
        if cos is not None and math.isnan(cos):
            out.append("cosine undefined: one side is all zeros")
        elif cos is not None and cos <= t.cosine:
            out.append(f"cosine {cos:.6g} <= {t.cosine}")
        for key, short, field in _BELOW:
            v, limit = metrics.get(key), getattr(t, field)
            if v is not None and not math.isnan(v) and v >= limit:
                out.append(f"{short} {v:.4g} >= {limit}")
        return out

    def judge(self, measurement, target_dtype, golden_dtype) -> Verdict:
        """Verdict for one tensor pair's `Measurement` (`opdiff.comparison.metric_table`)."""
        m = measurement
        if m.nonfinite_mismatch:
            return Verdict(ERROR, "No", m.message or "inf/NaN positions differ")
        biggest = m.metrics.get("MaxAbsErr")
        if is_exact(target_dtype) and is_exact(golden_dtype) and biggest:
            return Verdict(ERROR, "No", f"integer values differ (by up to {human(biggest)})")
        if m.mode == "tensor" and m.numel == 0:
            return Verdict(WARNING, "Yes", "no values to compare (empty tensor)")
        broken = self.broken(m.metrics)
        rounding = ""
        tol = self.tolerance_for(target_dtype, golden_dtype)
        if self.msit.dtype_aware and len(broken) == 1 and broken[0].startswith("RMSE") \
                and m.error <= tol:
            rounding = (f"{broken.pop()} (msit's absolute limit), but the relative error "
                        f"{human(m.error)} is within the tolerance of the dtype ({human(tol)}): "
                        f"rounding of large values")
        if broken:
            return Verdict(ERROR, "No", "; ".join(broken))
        if rounding:
            return Verdict(WARNING, "Yes", rounding)
        if m.nonfinite_shared:
            return Verdict(WARNING, "Yes",
                           f"both sides have the same {m.nonfinite_shared} inf/NaN value(s)")
        return Verdict(PASS, "Yes", "")

    def judge_arrays(self, target, golden) -> tuple:
        """(Measurement or None, Verdict) of two numpy arrays, measured by the shared metrics'
        numpy twin (`opdiff.comparison.metrics_numpy`: no torch import). No measurement when the
        element counts differ. A module output and its ONNX tensor may differ in shape only
        ([1, 8, 1, 1] against [1, 8]): the target is then read in the golden's shape."""
        import numpy as np

        from ..comparison.metrics_numpy import numpy_measure

        target, golden = np.asarray(target), np.asarray(golden)
        if target.size != golden.size:
            return None, Verdict(ERROR, "No",
                                 f"shape {list(target.shape)} vs golden {list(golden.shape)}")
        if target.shape != golden.shape:
            target = target.reshape(golden.shape)
        m = numpy_measure(target, golden)
        return m, self.judge(m, str(target.dtype), str(golden.dtype))


__all__ = ["MsitPolicy", "MsitThresholds"]
