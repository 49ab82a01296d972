"""msit's five thresholds as a shared-compare `Policy`, for when ONNX dumps go through the engine.

    from opdiff.onnx.policy import MsitPolicy
    result = compare_pair(target_dump, golden_dump, policy=MsitPolicy())

It judges the engine's Measurement (metric names from `opdiff.comparison.result.METRICS`) by the
same rule as `MsitThresholds` judges opdiff onnx's own rows.
"""
from __future__ import annotations

import math

from ..comparison.result import ERROR, PASS
from ..comparison.verdicts import Policy, Verdict
from .metrics import MsitThresholds


class MsitPolicy(Policy):
    """Any one of cosine, RED, KL, RMSE, MRE past msit's threshold is an error; inf/NaN too."""

    def __init__(self, thresholds: MsitThresholds | None = None):
        super().__init__()
        self.msit = thresholds or MsitThresholds()

    def _broken(self, m: dict) -> list:
        t, out = self.msit, []
        cos = m.get("Cosine")
        if cos is not None and (math.isnan(cos) or cos <= t.cosine):
            out.append(f"cosine {cos:.6g} <= {t.cosine}" if not math.isnan(cos)
                       else "cosine undefined: one side is all zeros")
        for key, short, limit in (("RelEuclideanDistance", "RED", t.red), ("KLD", "KL", t.kl),
                                  ("RMSE", "RMSE", t.rmse), ("MeanRelativeErr", "MRE", t.mre)):
            v = m.get(key)
            if v is not None and not math.isnan(v) and v >= limit:
                out.append(f"{short} {v:.4g} >= {limit}")
        return out

    def agrees(self, measurement, target_dtype, golden_dtype) -> bool:
        return not measurement.nonfinite_mismatch and not self._broken(measurement.metrics)

    def judge(self, measurement, target_dtype, golden_dtype) -> Verdict:
        if measurement.nonfinite_mismatch:
            return Verdict(ERROR, "No", measurement.message or "inf/NaN positions differ")
        broken = self._broken(measurement.metrics)
        if broken:
            return Verdict(ERROR, "No", "; ".join(broken))
        return Verdict(PASS, "Yes", "")
