"""Numbers for people: how a metric or a statistic is written in a reason, a terminal or a page.

    from opdiff.numbers import human
    human(0.99999873)   # '0.999999' (a cosine keeps its six decimals)
    human(3.1e-3)       # '0.0031'
    human(None)         # 'n/a'

CSV cells keep full precision (`opdiff.report.csv_report`); this is for sentences.
"""
from __future__ import annotations

import math
from typing import Any


def human(x: Any) -> str:
    """A number in three significant digits, a value near 1 (a cosine) in six decimals so that
    0.999999 and 1.000000 stay apart; None is 'n/a', NaN 'NaN'; non-numbers as str()."""
    if x is None:
        return "n/a"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, float) and 0.99 < abs(x) <= 1:
        return f"{x:.6f}"
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def ratio(x: float) -> str:
    """A factor in words' precision: 13.4 -> '13x', 1.5 -> '1.5x'."""
    if not math.isfinite(x):
        return "inf x"
    return f"{x:.0f}x" if abs(x) >= 10 else f"{x:.2g}x"


__all__ = ["human", "ratio"]
