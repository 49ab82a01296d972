"""How far a target tensor is from its golden: msprobe's metrics, computed in float64, streamed.

    from opdiff.compare.metrics import tensor_metrics
    tensor_metrics(torch.randn(4, 4), torch.randn(4, 4))["Cosine"]

Definitions (t = target, g = golden, d = t - g, all flattened and widened to float64):

- Cosine: <t,g> / (|t| |g|). Both norms <= eps: 1.0; one of them <= eps: NaN. Rounded to 6
  decimals above 0.9999. Not defined for 0-d or one-element tensors (None). (msprobe)
- RMSE: sqrt(mean(d^2)).
- MAPE: 100 * mean(|d| / |g|) over the elements where g != 0 (percent).
- MaxAbsErr: max |d|. (msprobe)
- MaxRelativeErr: max |d| / |g|, where positions with g == 0 get eps added to both t and g
  first, exactly as msprobe's `get_relative_err` does. (msprobe)
- MeanRelativeErr: mean over all elements of |d| / |g|, counting 0 where |g| <= eps (msaccucmp MRE).
- RelEuclideanDistance: sqrt(sum d^2 / sum g^2); 0 when |g| <= eps (msaccucmp RED).
- KLD: both tensors min-max scaled to [0, 1], clamped to >= 1e-8, normalised to sum 1;
  sum p log(p / q) with p = target, q = golden (msaccucmp's definition: shift- and scale-invariant).
- One / Five Thousandth(s) Err Ratio: fraction of elements whose relative error (as in
  MaxRelativeErr) is below 0.001 / 0.005; 1.0 means identical. Not defined for 0-d tensors. (msprobe)

NaN and Inf at identical positions (same kind, same sign) are set to 0 on both sides before
measuring; if they sit at different positions every metric is NaN and the message says so.

Besides the CSV metrics, `measure` returns the two numbers verdicts use, both immune to
near-zero elements: `error` = |d| / max(|t|, |g|) (relative L2 error; 0 for two zero tensors,
1 when only one side is zero) and `scale_error` = <t,g>/<g,g> - 1 (the systematic part of the
error: a wrong scale shows here fully while independent rounding noise averages out).

Throughput: tensors are processed in chunks that stay in cache, every metric in one pass, so a
compare reads a dump at a few hundred MB/s per side and holds at most one pair of tensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .result import METRICS

EPS = float(np.finfo(np.float64).eps)
KL_FLOOR = 1e-8
_CHUNK = 1 << 16

# Statistics-only dumps (no tensors saved): msprobe's statistics-mode columns.
STAT_METRICS = ("Max diff", "Min diff", "Mean diff", "L2norm diff",
                "MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr")


@dataclass
class Measurement:
    """Metrics of one tensor pair plus the two error measures verdicts use."""
    metrics: dict
    error: float = 0.0                  # relative L2 error, see module docstring
    scale_error: float = 0.0            # <t,g>/<g,g> - 1
    numel: int = 0
    mode: str = "tensor"                # "tensor" | "statistics"
    nonfinite_mismatch: int = 0         # positions where inf/NaN differ
    message: str = ""
    extra: dict = field(default_factory=dict)


def _as_torch(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    return torch.from_numpy(np.ascontiguousarray(x))


def _widen(x: torch.Tensor) -> torch.Tensor:
    if x.is_complex():
        x = x.abs()
    return x.reshape(-1)


def tensor_metrics(target, golden) -> dict:
    """The METRICS of one tensor pair (torch tensors or numpy arrays of the same shape)."""
    return measure(target, golden).metrics


def _empty_metrics(value=None) -> dict:
    return {k: value for k in METRICS}


def measure(target, golden) -> Measurement:
    """Compare two tensors of the same shape. See the module docstring for every definition."""
    t, g = _as_torch(target), _as_torch(golden)
    if tuple(t.shape) != tuple(g.shape):
        raise ValueError(f"shapes differ: {tuple(t.shape)} vs {tuple(g.shape)}")
    scalar = t.dim() == 0
    n = t.numel()
    if n == 0:
        return Measurement(_empty_metrics(), numel=0, message="empty tensor")
    t, g = _widen(t), _widen(g)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    if g.dtype == torch.bool:
        g = g.to(torch.uint8)

    # Fast path: bitwise-equal tensors (common in fp32-vs-fp32 runs). NaN != NaN, so a tensor
    # holding NaN never takes it.
    if t.dtype == g.dtype and torch.equal(t, g):
        return _identical(t, scalar)

    # Stream first; only when a sum comes out non-finite look for inf/NaN (saves two passes).
    m = _stream(t, g, scalar)
    if m is not None:
        return m
    t, g, mismatch = _neutralise_nonfinite(t, g)
    if mismatch:
        return Measurement(_empty_metrics(math.nan), error=math.inf, scale_error=math.inf,
                           numel=n, nonfinite_mismatch=mismatch,
                           message=f"inf/NaN at {mismatch} position(s) where the other side "
                                   f"differs")
    return _stream(t, g, scalar, check=False)


def _identical(t: torch.Tensor, scalar: bool) -> Measurement:
    n = t.numel()
    cos = None if scalar or n == 1 else 1.0
    metrics = {"Cosine": cos, "RMSE": 0.0, "MAPE": 0.0, "MaxAbsErr": 0.0, "MaxRelativeErr": 0.0,
               "MeanRelativeErr": 0.0, "RelEuclideanDistance": 0.0, "KLD": 0.0,
               "One Thousandth Err Ratio": None if scalar else 1.0,
               "Five Thousandths Err Ratio": None if scalar else 1.0}
    return Measurement(metrics, numel=n)


def _neutralise_nonfinite(t: torch.Tensor, g: torch.Tensor):
    """Zero inf/NaN that sit at the same positions on both sides; count the ones that do not."""
    t = t.double().clone()
    g = g.double().clone()
    tn, gn = torch.isnan(t), torch.isnan(g)
    tp, gp = torch.isposinf(t), torch.isposinf(g)
    tm, gm = torch.isneginf(t), torch.isneginf(g)
    mismatch = int(((tn != gn) | (tp != gp) | (tm != gm)).sum())
    if mismatch:
        return t, g, mismatch
    bad = tn | tp | tm
    t[bad] = 0.0
    g[bad] = 0.0
    return t, g, 0


def _stream(t: torch.Tensor, g: torch.Tensor, scalar: bool, check: bool = True):
    """All metrics in one chunked pass; None when check is on and the data hold inf/NaN."""
    n = t.numel()
    tmin, tmax = (float(v) for v in torch.aminmax(t))
    gmin, gmax = (float(v) for v in torch.aminmax(g))
    t_span = (tmax - tmin) or 1.0
    g_span = (gmax - gmin) or 1.0
    sd2 = stt = sgg = stg = 0.0
    max_abs = max_rel = 0.0
    sum_rel = sum_ape = 0.0
    n_ape = c1 = c5 = 0
    kl_s = kl_p = kl_q = 0.0
    for i in range(0, n, _CHUNK):
        a = t[i:i + _CHUNK].double()
        b = g[i:i + _CHUNK].double()
        d = a - b
        sd2 += float(torch.dot(d, d))
        stt += float(torch.dot(a, a))
        sgg += float(torch.dot(b, b))
        stg += float(torch.dot(a, b))
        ad = d.abs()
        max_abs = max(max_abs, float(ad.max()))
        gz = b == 0
        if bool(gz.any()):
            # msprobe: where golden is 0, add eps to both sides before dividing.
            b_rel = torch.where(gz, EPS, b)
            a_rel = torch.where(gz, a + EPS, a)
            rel = (a_rel - b_rel).abs_().div_(b_rel.abs())
            nz = ~gz
            ape = ad[nz].div(b[nz].abs())
            sum_ape += float(ape.sum())
            n_ape += int(nz.sum())
            sum_rel += float(rel.masked_fill(b.abs() <= EPS, 0.0).sum())
        else:
            rel = ad.div_(b.abs())
            s = float(rel.sum())
            sum_ape += s
            n_ape += rel.numel()
            sum_rel += s
        max_rel = max(max_rel, float(rel.max()))
        c1 += int(torch.count_nonzero(rel < 0.001))
        c5 += int(torch.count_nonzero(rel < 0.005))
        p = (a - tmin).mul_(1.0 / t_span).clamp_(min=KL_FLOOR)
        q = (b - gmin).mul_(1.0 / g_span).clamp_(min=KL_FLOOR)
        kl_p += float(p.sum())
        kl_q += float(q.sum())
        kl_s += float(torch.dot(p, torch.log(p / q)))

    if check and not (math.isfinite(stt) and math.isfinite(sgg) and math.isfinite(sd2)):
        return None
    norm_t, norm_g = math.sqrt(stt), math.sqrt(sgg)
    if scalar or n == 1:
        cosine = None
    elif norm_t <= EPS and norm_g <= EPS:
        cosine = 1.0
    elif norm_t <= EPS or norm_g <= EPS:
        cosine = math.nan
    else:
        cosine = min(1.0, max(-1.0, stg / (norm_t * norm_g)))
        if cosine > 0.9999:
            cosine = round(cosine, 6)
    kld = kl_s / kl_p + math.log(kl_q / kl_p)
    metrics = {
        "Cosine": cosine,
        "RMSE": math.sqrt(sd2 / n),
        "MAPE": 100.0 * sum_ape / n_ape if n_ape else 0.0,
        "MaxAbsErr": max_abs,
        "MaxRelativeErr": max_rel,
        "MeanRelativeErr": sum_rel / n,
        "RelEuclideanDistance": math.sqrt(sd2 / sgg) if norm_g > EPS else 0.0,
        "KLD": max(kld, 0.0),
        "One Thousandth Err Ratio": None if scalar else c1 / n,
        "Five Thousandths Err Ratio": None if scalar else c5 / n,
    }
    denom = max(norm_t, norm_g)
    error = math.sqrt(sd2) / denom if denom > 0 else 0.0
    if sgg > 0:
        scale = (stg - sgg) / sgg
    else:
        scale = 0.0 if stt == 0 else 1.0
    return Measurement(metrics, error=error, scale_error=scale, numel=n)


def _f(x) -> float | None:
    if x is None:
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def stats_measure(target_stats: dict, golden_stats: dict, numel: int) -> Measurement:
    """Compare two tensors known only by their statistics (max, min, mean, norm, nan, inf).

    Columns follow msprobe's statistics mode: `X diff = X(target) - X(golden)` and
    `XRelativeErr = |X diff / X(golden)|` (a fraction, not a percent string). The verdict's error
    measures every difference against the tensor's magnitude (max |value|, or the RMS for the
    mean) rather than against the statistic itself, so a mean near 0 is not a false alarm.
    """
    metrics: dict = {}
    names = (("max", "Max"), ("min", "Min"), ("mean", "Mean"), ("norm", "L2norm"))
    diffs = {}
    for key, label in names:
        a, b = _f(target_stats.get(key)), _f(golden_stats.get(key))
        if a is None or b is None:
            metrics[f"{label} diff"] = None
            metrics[f"{label.replace('L2norm', 'Norm')}RelativeErr"] = None
            continue
        diff = a - b if not (math.isinf(a) and a == b) else 0.0
        diffs[key] = diff
        metrics[f"{label} diff"] = diff
        rel = abs(diff / b) if b not in (0.0,) and math.isfinite(b) else (0.0 if diff == 0 else math.inf)
        metrics[f"{label.replace('L2norm', 'Norm')}RelativeErr"] = rel
    mismatch = 0
    for key in ("nan", "inf"):
        a, b = target_stats.get(key), golden_stats.get(key)
        if a is not None and b is not None and a != b:
            mismatch += abs(int(a) - int(b))
    nonfinite = any(isinstance(v, float) and not math.isfinite(v) for v in diffs.values())
    if mismatch or nonfinite:
        return Measurement(metrics, error=math.inf, scale_error=math.inf, numel=numel,
                           mode="statistics", nonfinite_mismatch=max(mismatch, 1),
                           message="inf/NaN counts differ")
    g_max, g_min = _f(golden_stats.get("max")) or 0.0, _f(golden_stats.get("min")) or 0.0
    t_norm, g_norm = _f(target_stats.get("norm")), _f(golden_stats.get("norm"))
    magnitude = max(abs(g_max), abs(g_min))
    errors = []
    if magnitude > 0:
        errors += [abs(diffs[k]) / magnitude for k in ("max", "min") if k in diffs]
    if t_norm is not None and g_norm is not None and max(t_norm, g_norm) > 0:
        errors.append(abs(t_norm - g_norm) / max(t_norm, g_norm))
        rms = max(t_norm, g_norm) / math.sqrt(max(numel, 1))
        if "mean" in diffs and rms > 0:
            errors.append(abs(diffs["mean"]) / rms)
    scale = (t_norm - g_norm) / g_norm if t_norm is not None and g_norm else 0.0
    return Measurement(metrics, error=max(errors, default=0.0), scale_error=scale, numel=numel,
                       mode="statistics")
