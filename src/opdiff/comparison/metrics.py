"""How far a target tensor is from its golden: msprobe's metrics, computed in float64, streamed.

    from opdiff.comparison.metrics import tensor_metrics
    tensor_metrics(torch.randn(4, 4), torch.randn(4, 4))["Cosine"]

The metrics and their definitions are `opdiff.comparison.metric_table`'s; this module computes
their partial sums on torch. `opdiff.comparison.metrics_numpy` is the same on numpy arrays.

NaN and Inf at identical positions (same kind, same sign) are set to 0 on both sides before
measuring; if they sit at different positions every metric is NaN and the message says so.

Throughput: each pair is swept once in chunks of 128K elements (a few MB of float64 buffers,
allocated once per thread). A chunk is widened to float64 once and every sum, maximum and count is
a reduction over those buffers written into a slot of one small tensor, so a chunk costs about 30
kernel calls and one host transfer (about 15 ns per element on one core here). Golden zeros cost
almost nothing extra: both-zero positions (ReLU outputs) fall out of |d| / |g| as NaN and are
zeroed in one pass; only target-nonzero positions over a golden zero are recomputed. The sweep
runs on one thread by default; OPDIFF_COMPARE_THREADS=2 lets a helper thread take chunks too,
which pays only when a core is idle (on this busy 2-core machine it measured no faster).
Results do not depend on it: chunks are folded in order.
"""
from __future__ import annotations

import logging
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Optional, cast

import numpy as np
import torch

from .metric_table import (CLOSE_COARSE, CLOSE_FINE, EPS, KL_FLOOR, PARTIAL_NAMES, STAT_METRICS,
                           Measurement, empty, finish, fold, identical, nonfinite_mismatch)

log = logging.getLogger("opdiff")

_CHUNK = 1 << 17
_PARALLEL_MIN = 4 * _CHUNK         # smaller pairs are not worth a thread hand-off


def _as_torch(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    x = np.asarray(x)
    # (np.ascontiguousarray would turn a 0-d array into a 1-d one)
    return torch.from_numpy(x if x.flags.c_contiguous else np.ascontiguousarray(x))


def _widen(x: torch.Tensor) -> torch.Tensor:
    if x.is_complex():
        x = x.abs()
    return x.reshape(-1)


def tensor_metrics(target: Any, golden: Any) -> dict[str, Any]:
    """The METRICS of one tensor pair (torch tensors or numpy arrays of the same shape)."""
    return measure(target, golden).metrics


def measure(target: Any, golden: Any) -> Measurement:
    """Compare two tensors of the same shape (definitions: `opdiff.comparison.metric_table`)."""
    t, g = _as_torch(target), _as_torch(golden)
    if tuple(t.shape) != tuple(g.shape):
        raise ValueError(f"shapes differ: {tuple(t.shape)} vs {tuple(g.shape)}")
    scalar = t.dim() == 0
    n = t.numel()
    if n == 0:
        return empty()
    t, g = _widen(t), _widen(g)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    if g.dtype == torch.bool:
        g = g.to(torch.uint8)

    # Fast path: bitwise-equal tensors (common in fp32-vs-fp32 runs). NaN != NaN, so a tensor
    # holding NaN never takes it.
    if t.dtype == g.dtype and torch.equal(t, g):
        return identical(n, scalar, _nonfinite(t))

    # Stream first; only when a sum comes out non-finite look for inf/NaN (saves two passes).
    m = _stream(t, g, scalar)
    if m is not None:
        return m
    t, g, mismatch, shared = _neutralise_nonfinite(t, g)
    if mismatch:
        return nonfinite_mismatch(n, mismatch)
    # (check=False always measures)
    return cast(Measurement, _stream(t, g, scalar, check=False, nonfinite_shared=shared))


def _nonfinite(t: torch.Tensor) -> int:
    """How many inf/NaN a tensor holds. A finite sum says none, at a fraction of the cost of
    counting (identical tensors take this path, and they are often most of a compare)."""
    if not t.is_floating_point() or math.isfinite(float(t.sum())):
        return 0
    return int((~torch.isfinite(t)).sum())


def _neutralise_nonfinite(t: torch.Tensor,
                          g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Zero inf/NaN that sit at the same positions on both sides; count the ones that do not
    and the ones that do: (t, g, mismatched, shared)."""
    t = t.double().clone()
    g = g.double().clone()
    tn, gn = torch.isnan(t), torch.isnan(g)
    tp, gp = torch.isposinf(t), torch.isposinf(g)
    tm, gm = torch.isneginf(t), torch.isneginf(g)
    mismatch = int(((tn != gn) | (tp != gp) | (tm != gm)).sum())
    if mismatch:
        return t, g, mismatch, 0
    bad = tn | tp | tm
    t[bad] = 0.0
    g[bad] = 0.0
    return t, g, 0, int(bad.sum())


class _Scratch(threading.local):
    """Per-thread float64 work buffers of one chunk, allocated once: no page faults per tensor.

    Reductions write into slots of `out` (out=...), so a chunk costs one host transfer
    instead of one `.item()` per sum.
    """

    def __init__(self) -> None:
        self.buffers = [torch.empty(_CHUNK, dtype=torch.float64) for _ in range(4)]
        self.out = torch.zeros(len(_SLOTS), dtype=torch.float64)
        self.slot = {name: self.out[i] for i, name in enumerate(_SLOTS)}


_SLOTS = ("sd2", "stt", "sgg", "stg", "max_abs", "sum_abs", "gmin_abs", "sum", "max_rel", "c5",
          "c1", "kl_p", "kl_q", "kl_s")
_scratch = _Scratch()
# Partials whose overflow to inf/NaN says the data hold inf/NaN (then they are looked for).
_FINITE_CHECK = tuple(PARTIAL_NAMES.index(k) for k in ("sd2", "stt", "sgg"))


def _chunks(t: torch.Tensor, g: torch.Tensor, starts: Iterator[int],
            kl: tuple[float, float, float, float]) -> list[tuple[int, tuple[Any, ...]]]:
    """[(start, partials)] for every chunk start taken from the (shared) iterator `starts`;
    partials in `metric_table.PARTIAL_NAMES` order.

    Per chunk: widen both sides into float64 buffers once, then run each reduction on them in
    place, reusing a buffer as soon as its quantity is no longer needed (|d| becomes the
    relative error, d becomes |g|, then the threshold flags and then log(p/q), t and g become
    p and q).
    """
    done = []
    scratch = _scratch
    buf, out, o = scratch.buffers, scratch.out, scratch.slot
    tmin, t_scale, gmin, g_scale = kl
    n = t.numel()
    for i in starts:
        m = min(_CHUNK, n - i)
        a, b, d, rel = (x[:m] for x in buf)
        a.copy_(t[i:i + m])
        b.copy_(g[i:i + m])
        torch.sub(a, b, out=d)
        torch.dot(d, d, out=o["sd2"])
        torch.dot(a, a, out=o["stt"])
        torch.dot(b, b, out=o["sgg"])
        torch.dot(a, b, out=o["stg"])
        torch.abs(d, out=rel)
        torch.sum(rel, 0, out=o["sum_abs"])
        torch.amax(rel, out=o["max_abs"])
        torch.abs(b, out=d)                             # d is not needed any more: |g|
        if float(torch.amin(d, out=o["gmin_abs"])) > EPS:
            rel.div_(d)                                 # |d| / |g|, bit for bit
            torch.sum(rel, 0, out=o["sum"])
            zeros = None
        else:
            zeros = _golden_zeros(a, b, d, rel)
        torch.amax(rel, out=o["max_rel"])
        # Threshold flags as 0.0/1.0 in a float64 buffer: cheaper to write and sum than bools.
        torch.sum(torch.lt(rel, CLOSE_COARSE, out=d), 0, out=o["c5"])
        torch.sum(torch.lt(rel, CLOSE_FINE, out=d), 0, out=o["c1"])
        p = a.sub_(tmin).mul_(t_scale).clamp_(min=KL_FLOOR)
        q = b.sub_(gmin).mul_(g_scale).clamp_(min=KL_FLOOR)
        torch.sum(p, 0, out=o["kl_p"])
        torch.sum(q, 0, out=o["kl_q"])
        torch.dot(p, torch.div(p, q, out=d).log_(), out=o["kl_s"])
        (sd2, stt, sgg, stg, max_abs, sum_abs, _, total, max_rel, c5, c1, kl_p, kl_q,
         kl_s) = out.tolist()
        mre, ape, n_ape = (total, total, m) if zeros is None else zeros
        done.append((i, (sd2, stt, sgg, stg, max_abs, sum_abs, max_rel, mre, ape, n_ape,
                         int(c1), int(c5), kl_s, kl_p, kl_q)))
    return done


def _golden_zeros(a: torch.Tensor, b: torch.Tensor, absg: torch.Tensor,
                  rel: torch.Tensor) -> tuple[float, float, int]:
    """Relative errors of a chunk whose golden holds values with |g| <= EPS (rel holds |d|).

    msprobe adds EPS to both sides where golden is exactly 0; MeanRelativeErr counts 0 wherever
    |g| <= EPS; MAPE skips the golden zeros. Positions where both sides are 0 (ReLU outputs:
    common) come out of |d| / |g| as NaN and mean 0; only target-nonzero positions over a
    golden zero need msprobe's formula, and they are few.
    Returns (MeanRelativeErr sum, MAPE sum, MAPE count); rel ends up holding msprobe's values.
    """
    tiny = absg <= EPS
    zero = b == 0
    n_zero = int(torch.count_nonzero(zero))
    n_tiny = int(torch.count_nonzero(tiny))
    rel.div_(absg)
    torch.nan_to_num_(rel, nan=0.0, posinf=math.inf)
    fixed = None
    if n_zero and math.isinf(float(rel.max())):
        where = (zero & torch.isinf(rel)).nonzero().squeeze(1)
        if where.numel():
            fixed = ((a[where] + EPS) - EPS).abs_().div_(EPS)
            rel[where] = 0.0
    ape = float(rel.sum())                        # golden zeros all hold 0 here
    mre = ape if n_tiny == n_zero else float(rel.masked_fill(tiny, 0.0).sum())
    if fixed is not None:
        rel[where] = fixed
    return mre, ape, rel.numel() - n_zero


def _stream(t: torch.Tensor, g: torch.Tensor, scalar: bool, check: bool = True,
            nonfinite_shared: int = 0) -> Optional[Measurement]:
    """All metrics from one sweep; None when check is on and the data hold inf/NaN."""
    n = t.numel()
    tmin, tmax = (float(v) for v in torch.aminmax(t))
    gmin, gmax = (float(v) for v in torch.aminmax(g))
    kl = (tmin, 1.0 / ((tmax - tmin) or 1.0), gmin, 1.0 / ((gmax - gmin) or 1.0))
    s = _sweep(t, g, n, kl)
    if check and not all(math.isfinite(s[i]) for i in _FINITE_CHECK):
        return None
    return finish(s, n, scalar, nonfinite_shared)


def _sweep(t: torch.Tensor, g: torch.Tensor, n: int,
           kl: tuple[float, float, float, float]) -> list[float]:
    """Run the chunks on this thread and, for large pairs, on helper threads too.

    Torch kernels release the GIL, so threads overlap their kernels. Each thread takes the next
    chunk when it is free (a helper the scheduler leaves waiting delays the result by at most
    one chunk), and chunks are folded in order, so the result is the same on any thread count.
    """
    starts = iter(range(0, n, _CHUNK))
    helpers = _threads() - 1 if n >= _PARALLEL_MIN else 0
    futures = [_pool().submit(_chunks, t, g, starts, kl) for _ in range(helpers)]
    done = _chunks(t, g, starts, kl)
    for f in futures:
        done += f.result()
    s: Optional[list[float]] = None
    for _, values in sorted(done, key=lambda item: item[0]):
        s = fold(s, values)
    return cast(list[float], s)      # (n >= 1: one chunk at least)


# -- threads -------------------------------------------------------------------------------------

_pool_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def _threads() -> int:
    """Threads per sweep: OPDIFF_COMPARE_THREADS, else 1.

    One by default: on a 2-core machine shared with other work, a second thread measured no
    faster (the other work already takes the cores), and the engine runs step/rank pairs in
    processes of their own.
    """
    value = os.environ.get("OPDIFF_COMPARE_THREADS")
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            log.warning("opdiff: OPDIFF_COMPARE_THREADS=%r is not a number; using 1", value)
            return 1
    return 1


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _pool_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=max(1, _threads() - 1),
                                           thread_name_prefix="opdiff-metrics")
        return _executor


def _f(x: Any) -> float | None:
    if x is None:
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def stats_measure(target_stats: dict[str, Any], golden_stats: dict[str, Any],
                  numel: int) -> Measurement:
    """Compare two tensors known only by their statistics (max, min, mean, norm, nan, inf).

    Columns follow msprobe's statistics mode: `X diff = X(target) - X(golden)` and
    `XRelativeErr = |X diff / X(golden)|` (a fraction, not a percent string). The verdict's error
    measures every difference against the tensor's magnitude (max |value|, or the RMS for the
    mean) rather than against the statistic itself, so a mean near 0 is not a false alarm.
    """
    metrics: dict[str, Optional[float]] = {}
    names = (("max", "Max"), ("min", "Min"), ("mean", "Mean"), ("norm", "L2norm"))
    diffs = {}
    for key, label in names:
        a, b = _f(target_stats.get(key)), _f(golden_stats.get(key))
        if a is None or b is None:
            metrics[f"{label} diff"] = None
            metrics[f"{label.replace('L2norm', 'Norm')}RelativeErr"] = None
            continue
        # the same inf, or NaN on both sides (their counts are compared below), is no difference
        diff = 0.0 if a == b or (math.isnan(a) and math.isnan(b)) else a - b
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
    if not math.isfinite(scale):   # NaN norms on both sides
        scale = 0.0
    norm = max(t_norm or 0.0, g_norm or 0.0)
    return Measurement(metrics, error=max(errors, default=0.0), scale_error=scale, numel=numel,
                       mode="statistics", norm=norm if math.isfinite(norm) else 0.0)


__all__ = ["measure", "tensor_metrics", "stats_measure", "Measurement", "STAT_METRICS"]
