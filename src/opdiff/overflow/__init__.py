"""Overflow analysis: where was inf/NaN born, where did it spread, and does it matter?

Offline, on any statistics or tensor dump (opdiff's, msprobe's, ptdbg_ascend's)::

    import opdiff.overflow
    result = opdiff.overflow.analyze("./dump/npu")
    result.status        # "overflow" | "inherited" | "skipped_by_loss_scaler" | "clean"
    result.origin        # the first op with finite inputs and non-finite outputs, or None
    result.origin.location   # the user's file, line and code
    result.headroom      # ops whose fp32/bf16 outputs would overflow in fp16
    result.write_json("./out")   # ./out/overflow.json

Command line: `opdiff overflow DUMP [-o OUT]`. Online, during training, the same question is
answered by `PrecisionDebugger(task="overflow_check", overflow_nums=1)` (see opdiff.capture).
"""
from .analysis import analyze, analyze_dump
from .result import (CLEAN, DISCARDED, INHERITED, OVERFLOW, SKIPPED, ChainLink, HeadroomWarning, Origin,
                     OverflowResult, StepFinding)

__all__ = ["analyze", "analyze_dump", "OverflowResult", "StepFinding", "Origin", "ChainLink",
           "HeadroomWarning", "OVERFLOW", "INHERITED", "SKIPPED", "DISCARDED", "CLEAN"]
