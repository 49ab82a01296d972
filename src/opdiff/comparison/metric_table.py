"""The one metric specification: every metric's name, the partial sums it is built from and how
they fold, its final formula, its value for identical tensors and its display digits.

Torch-free on purpose: the CSV writer, the HTML report and the ONNX compare import it without
loading torch. Two implementations compute the partial sums, `opdiff.comparison.metrics` (torch,
streamed in chunks) and `opdiff.comparison.metrics_numpy` (numpy, whole arrays); both fold them
with `fold` and finish them with `finish`, so each formula is written once, here.

Definitions (t = target, g = golden, d = t - g, flattened and widened to float64):

- Cosine: <t,g> / (|t| |g|). Both norms <= eps: 1.0; one of them <= eps: NaN. Rounded to 6
  decimals above 0.9999. Not defined for 0-d or one-element tensors (None). (msprobe)
- RMSE: sqrt(mean(d^2)).
- MAPE: 100 * mean(|d| / |g|) over the elements where g != 0 (percent).
- MaxAbsErr: max |d|. (msprobe)
- MaxRelativeErr: max |d| / |g|, where positions with g == 0 get eps added to both t and g
  first, exactly as msprobe's `get_relative_err` does (so t=[1,0,2,3], g=[1,1e-12,2,3] gives 1.0).
- MeanRelativeErr: mean over all elements of |d| / |g|, counting 0 where |g| <= eps (msaccucmp MRE).
- RelEuclideanDistance: sqrt(sum d^2 / sum g^2); 0 when |g| <= eps (msaccucmp RED).
- KLD: both tensors min-max scaled to [0, 1], clamped to >= 1e-8, normalised to sum 1;
  sum p log(p / q) with p = target, q = golden (msaccucmp's definition: shift- and scale-invariant).
- One / Five Thousandth(s) Err Ratio: fraction of elements whose relative error (as in
  MaxRelativeErr) is below 0.001 / 0.005; 1.0 means identical. Not defined for 0-d tensors. (msprobe)

- MeanAbsErr: mean |d| (msit's MeanAbsoluteError; not a column of the compare CSV: it is in
  `Measurement.extra`).

Besides the metrics, two measures for the verdicts, both immune to near-zero elements:
`error` = |d| / max(|t|, |g|) (relative L2 error; 0 for two zero tensors, 1 when only one side is
zero) and `scale_error` = <t,g>/<g,g> - 1 (the systematic part of the error).

`Measurement.nonfinite_shared` counts the positions holding the same inf/NaN on both sides
(they are set to 0 on both before measuring).

Adding a metric: one `Metric` entry in `METRIC_TABLE` when the partial sums it needs exist; a new
partial sum is one `Partial` entry plus its per-chunk kernel in both implementations (their
agreement is tested in tests/comparison/test_metrics_numpy.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

EPS = 2.220446049250313e-16       # float64 machine epsilon (numpy.finfo(numpy.float64).eps)
KL_FLOOR = 1e-8                    # msaccucmp's floor of the scaled distributions
CLOSE_FINE, CLOSE_COARSE = 0.001, 0.005    # the One / Five Thousandth(s) Err Ratio limits

SUM, MAX = "sum", "max"


@dataclass(frozen=True)
class Partial:
    """One quantity reduced over a chunk of elements, then folded over chunks in order."""
    name: str
    fold: str                      # SUM | MAX
    doc: str


# Per element: rel = msprobe's relative error (see MaxRelativeErr), p, q = KLD's scaled sides.
PARTIALS = (
    Partial("sd2", SUM, "sum d^2"),
    Partial("stt", SUM, "<t,t>"),
    Partial("sgg", SUM, "<g,g>"),
    Partial("stg", SUM, "<t,g>"),
    Partial("max_abs", MAX, "max |d|"),
    Partial("sum_abs", SUM, "sum |d|"),
    Partial("max_rel", MAX, "max rel"),
    Partial("sum_rel", SUM, "sum rel, counting 0 where |g| <= eps"),
    Partial("sum_ape", SUM, "sum rel over g != 0"),
    Partial("n_ape", SUM, "count of g != 0"),
    Partial("c1", SUM, f"count of rel < {CLOSE_FINE}"),
    Partial("c5", SUM, f"count of rel < {CLOSE_COARSE}"),
    Partial("kl_s", SUM, "sum p log(p / q), p and q not yet normalised"),
    Partial("kl_p", SUM, "sum p"),
    Partial("kl_q", SUM, "sum q"),
)
PARTIAL_NAMES = tuple(p.name for p in PARTIALS)
_MAX_SLOTS = frozenset(i for i, p in enumerate(PARTIALS) if p.fold == MAX)

# Where a metric is defined: every tensor, tensors that are not 0-d, tensors of >= 2 elements.
ANY, NOT_SCALAR, MANY = "any", "not_scalar", "many"


@dataclass(frozen=True)
class Metric:
    """One metric column: `formula(partials, numel)` once the partial sums are folded."""
    name: str
    formula: Callable[[dict[str, float], int], float]
    identical: float               # its value for two identical tensors
    defined: str = ANY             # ANY | NOT_SCALAR | MANY; elsewhere the metric is None
    digits: int = 5                # significant digits a report shows
    doc: str = ""
    column: bool = True            # a column of the compare CSV; False: in Measurement.extra

    def applies(self, numel: int, scalar: bool) -> bool:
        """Whether the metric has a value for a tensor of `numel` elements (0-d: scalar)."""
        if self.defined == MANY:
            return not scalar and numel > 1
        if self.defined == NOT_SCALAR:
            return not scalar
        return True


def _cosine(s: dict[str, float], n: int) -> float:
    norm_t, norm_g = math.sqrt(s["stt"]), math.sqrt(s["sgg"])
    if norm_t <= EPS and norm_g <= EPS:
        return 1.0
    if norm_t <= EPS or norm_g <= EPS:
        return math.nan
    cosine = min(1.0, max(-1.0, s["stg"] / (norm_t * norm_g)))
    return round(cosine, 6) if cosine > 0.9999 else cosine


def _kld(s: dict[str, float], n: int) -> float:
    return max(s["kl_s"] / s["kl_p"] + math.log(s["kl_q"] / s["kl_p"]), 0.0)


METRIC_TABLE = (
    Metric("Cosine", _cosine, 1.0, MANY, digits=10, doc="<t,g> / (|t| |g|)"),
    Metric("RMSE", lambda s, n: math.sqrt(s["sd2"] / n), 0.0, doc="sqrt(mean(d^2))"),
    Metric("MAPE", lambda s, n: 100.0 * s["sum_ape"] / s["n_ape"] if s["n_ape"] else 0.0, 0.0,
           doc="100 * mean |d| / |g| where g != 0"),
    Metric("MaxAbsErr", lambda s, n: s["max_abs"], 0.0, doc="max |d|"),
    Metric("MaxRelativeErr", lambda s, n: s["max_rel"], 0.0, doc="max |d| / |g| (msprobe's eps)"),
    Metric("MeanRelativeErr", lambda s, n: s["sum_rel"] / n, 0.0, doc="mean |d| / |g|"),
    Metric("RelEuclideanDistance",
           lambda s, n: math.sqrt(s["sd2"] / s["sgg"]) if math.sqrt(s["sgg"]) > EPS else 0.0, 0.0,
           doc="|d| / |g|"),
    Metric("KLD", _kld, 0.0, doc="KL(target || golden) of the min-max scaled tensors"),
    Metric("One Thousandth Err Ratio", lambda s, n: s["c1"] / n, 1.0, NOT_SCALAR,
           doc=f"fraction with rel < {CLOSE_FINE}"),
    Metric("Five Thousandths Err Ratio", lambda s, n: s["c5"] / n, 1.0, NOT_SCALAR,
           doc=f"fraction with rel < {CLOSE_COARSE}"),
    # Not a column of the dump compare's CSV (msprobe has none); msit's MeanAbsoluteError.
    Metric("MeanAbsErr", lambda s, n: s["sum_abs"] / n, 0.0, doc="mean |d|", column=False),
)

# Metric column names, in CSV order. Values are float, or None where a metric does not apply.
METRICS = tuple(m.name for m in METRIC_TABLE if m.column)

# Statistics-only dumps (no tensors saved): msprobe's statistics-mode columns
# (`X diff = X(target) - X(golden)`, `XRelativeErr = |X diff / X(golden)|`).
STAT_METRICS = ("Max diff", "Min diff", "Mean diff", "L2norm diff",
                "MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr")

# Significant digits a report shows per metric (cosine near 1 carries its information far out).
DIGITS = {**{name: 5 for name in STAT_METRICS}, **{m.name: m.digits for m in METRIC_TABLE}}
# Every metric name, CSV columns and the others (Measurement.extra).
ALL_METRICS = tuple(m.name for m in METRIC_TABLE)


@dataclass
class Measurement:
    """Metrics of one tensor pair plus the two error measures verdicts use."""
    metrics: dict[str, Optional[float]]
    error: float = 0.0                  # relative L2 error, see module docstring
    scale_error: float = 0.0            # <t,g>/<g,g> - 1
    numel: int = 0
    mode: str = "tensor"                # "tensor" | "statistics"
    nonfinite_mismatch: int = 0         # positions where inf/NaN differ
    nonfinite_shared: int = 0           # positions holding the same inf/NaN on both sides
    message: str = ""
    extra: dict[str, Optional[float]] = field(default_factory=dict)   # the metrics that are not CSV columns
    norm: float = 0.0                   # max(|t|, |g|), L2; 0 where not measured (identical)

    @property
    def abs_error(self) -> float:
        """|t - g| (L2), or the lower bound statistics give (|d| >= every statistic's change)."""
        if self.mode == "statistics":
            diffs = [self.metrics.get(k) for k in ("Max diff", "Min diff", "L2norm diff")]
            return max((abs(d) for d in diffs if d is not None), default=0.0)
        rmse = self.metrics.get("RMSE")
        return float(rmse) * math.sqrt(self.numel) if rmse is not None else 0.0


def fold(acc: Optional[list[float]], chunk: Sequence[float]) -> list[float]:
    """Fold one chunk's partials (a sequence in `PARTIAL_NAMES` order) into `acc` (None: start)."""
    if acc is None:
        return list(chunk)
    for i, value in enumerate(chunk):
        acc[i] = max(acc[i], value) if i in _MAX_SLOTS else acc[i] + value
    return acc


def _split(values: dict[str, Optional[float]]) -> tuple[dict[str, Optional[float]], dict[str, Optional[float]]]:
    """(CSV column metrics, the others) of one name -> value dict."""
    return ({k: v for k, v in values.items() if k in _COLUMNS},
            {k: v for k, v in values.items() if k not in _COLUMNS})


_COLUMNS = frozenset(METRICS)


def finish(partials: Sequence[float], numel: int, scalar: bool, nonfinite_shared: int = 0) -> Measurement:
    """The Measurement from folded partials (`PARTIAL_NAMES` order) of `numel` >= 1 elements."""
    s = dict(zip(PARTIAL_NAMES, partials))
    metrics, extra = _split({m.name: m.formula(s, numel) if m.applies(numel, scalar) else None
                             for m in METRIC_TABLE})
    norm_t, norm_g = math.sqrt(s["stt"]), math.sqrt(s["sgg"])
    denom = max(norm_t, norm_g)
    error = math.sqrt(s["sd2"]) / denom if denom > 0 else 0.0
    if s["sgg"] > 0:
        scale = (s["stg"] - s["sgg"]) / s["sgg"]
    else:
        scale = 0.0 if s["stt"] == 0 else 1.0
    return Measurement(metrics, error=error, scale_error=scale, numel=numel,
                       nonfinite_shared=nonfinite_shared, extra=extra, norm=denom)


def identical(numel: int, scalar: bool, nonfinite_shared: int = 0) -> Measurement:
    """The Measurement of two identical tensors, without looking at them."""
    metrics, extra = _split({m.name: m.identical if m.applies(numel, scalar) else None
                             for m in METRIC_TABLE})
    return Measurement(metrics, numel=numel, nonfinite_shared=nonfinite_shared, extra=extra)


def empty_metrics(value: Optional[float] = None) -> dict[str, Optional[float]]:
    """Every CSV metric set to one value (None: nothing to compare; NaN: nothing means anything)."""
    return {name: value for name in METRICS}


def _extra(value: Optional[float] = None) -> dict[str, Optional[float]]:
    return {m.name: value for m in METRIC_TABLE if not m.column}


def nonfinite_mismatch(numel: int, mismatch: int) -> Measurement:
    """The Measurement of a pair whose inf/NaN sit at different positions: no metric means
    anything, and the verdict's error is infinite."""
    return Measurement(empty_metrics(math.nan), error=math.inf, scale_error=math.inf,
                       numel=numel, nonfinite_mismatch=mismatch, extra=_extra(math.nan),
                       message=f"inf/NaN at {mismatch} position(s) where the other side differs")


def empty(numel: int = 0) -> Measurement:
    """The Measurement of two empty tensors: nothing to compare."""
    return Measurement(empty_metrics(), numel=numel, message="empty tensor", extra=_extra())


__all__ = ["METRICS", "ALL_METRICS", "STAT_METRICS", "DIGITS", "METRIC_TABLE", "PARTIALS", "PARTIAL_NAMES",
           "Metric", "Partial", "Measurement", "fold", "finish", "identical", "empty",
           "empty_metrics", "nonfinite_mismatch", "EPS", "KL_FLOOR", "CLOSE_FINE", "CLOSE_COARSE"]
