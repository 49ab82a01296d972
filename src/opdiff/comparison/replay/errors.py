"""The error measures a replayed op is judged by, without the rest of the compare's metrics.

    from opdiff.comparison.replay.errors import errors_against
    e = errors_against(target, float64_result)       # e.error, e.scale_error
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Errors:
    """The two error measures of `opdiff.comparison.metrics.measure` (same definitions) and its
    inf/NaN mismatch count: all that the replay's rules read."""
    error: float                # |t - g| / max(|t|, |g|), L2
    scale_error: float          # <t,g>/<g,g> - 1
    nonfinite_mismatch: int = 0


_CHUNK = 1 << 17     # 1 MB of float64: cache-sized (1 << 20 measured 5x slower here)


def errors_against(target: torch.Tensor, exact: torch.Tensor) -> Errors:
    """`Errors` of a tensor against the float64 result, in float64 chunks of 128K elements: four
    dot products per chunk where `measure` computes every msprobe metric (a replayed op's
    judgement needs only these; the measure was 85% of a replayed ReLU's time). inf/NaN at the
    same positions on both sides are left out, at different positions the error is infinite,
    as `measure` has it."""
    t, g = target.detach().reshape(-1), exact.detach().reshape(-1)
    if t.is_complex():
        t = t.abs()
    if g.is_complex():
        g = g.abs()
    sums = _sums(t, g)
    if not all(math.isfinite(v) for v in sums):
        t, g = t.double(), g.double()
        bad_t, bad_g = ~torch.isfinite(t), ~torch.isfinite(g)
        differ = int(((bad_t != bad_g) | (bad_t & bad_g & ~((t == g) | (t.isnan() & g.isnan())))
                      ).sum())
        if differ:
            return Errors(math.inf, math.inf, differ)
        keep = ~bad_t
        sums = _sums(t[keep], g[keep])
    sd2, stt, sgg, stg = sums
    denom = max(math.sqrt(stt), math.sqrt(sgg))
    error = math.sqrt(sd2) / denom if denom > 0 else 0.0
    scale = (stg - sgg) / sgg if sgg > 0 else (0.0 if stt == 0 else 1.0)
    return Errors(error, scale)


def _sums(t: torch.Tensor, g: torch.Tensor) -> list[float]:
    """[sum (t-g)^2, sum t^2, sum g^2, sum t*g] in float64, chunk by chunk, folded in order."""
    out = [0.0, 0.0, 0.0, 0.0]
    for start in range(0, t.numel(), _CHUNK):
        a = t[start:start + _CHUNK].to(torch.float64)
        b = g[start:start + _CHUNK].to(torch.float64)
        d = a - b
        part = torch.stack([d.dot(d), a.dot(a), b.dot(b), a.dot(b)]).tolist()
        out = [x + y for x, y in zip(out, part)]
    return out


def errors_and_floor(target: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype
                     ) -> tuple[Errors, float] | None:
    """`errors_against(target, exact)` and `rounding_floor(exact, dtype)`, the same numbers, in
    one sweep (each chunk of `exact` widened once; ||exact||^2 is both's): what `rules.settle`
    reads, at about 60% of the two sweeps' cost. None where either would take its slow way
    (inf/NaN, complex, a non-floating dtype, a value beyond `dtype`): call them then."""
    t, g = target.detach().reshape(-1), exact.detach().reshape(-1)
    if t.is_complex() or g.is_complex() or not (dtype.is_floating_point and g.is_floating_point()):
        return None
    total = [0.0] * 5
    for start in range(0, t.numel(), _CHUNK):
        a = t[start:start + _CHUNK].to(torch.float64)
        b = g[start:start + _CHUNK].to(torch.float64)
        d = a - b
        q = b.to(dtype).to(torch.float64) - b
        part = torch.stack([d.dot(d), a.dot(a), b.dot(b), a.dot(b), q.dot(q)]).tolist()
        total = [x + y for x, y in zip(total, part)]
    if not all(math.isfinite(v) for v in total):
        return None
    sd2, stt, sgg, stg, qq = total
    denom = max(math.sqrt(stt), math.sqrt(sgg))
    error = math.sqrt(sd2) / denom if denom > 0 else 0.0
    scale = (stg - sgg) / sgg if sgg > 0 else (0.0 if stt == 0 else 1.0)
    q_norm, e_norm = math.sqrt(qq), math.sqrt(sgg)
    floor = FLOOR_SAFETY * q_norm / (e_norm + q_norm) if e_norm + q_norm > 0 else 0.0
    return Errors(error, scale), floor


def error_interval(target: torch.Tensor, approx: torch.Tensor, slack: float
                   ) -> tuple[Errors, Errors, Errors] | None:
    """(lower bounds, values against `approx`, upper bounds) of `errors_against(target,
    exact)`'s error and |scale_error| for every `exact` within L2 distance `slack` of `approx`
    (a float32 result with a proven error bound, `replay.direct`). With t - exact = (t - a) - D
    and ||D|| <= slack:

        (||t - a|| - slack) / max(||t||, ||a|| + slack) <= error
                                                       <= (||t - a|| + slack) / max(||t||, ||a|| - slack)
        |scale| = |<t - e, e>| / ||e||^2, and |<t - e, e> - <t - a, a>| <= slack (||t - a|| + ||a||) + slack^2

    None when nothing is bounded: inf/NaN on either side, or ||a|| <= slack."""
    t, a = target.detach().reshape(-1), approx.detach().reshape(-1)
    if t.is_complex() or a.is_complex():
        return None
    sd2, stt, sgg, stg = _sums(t, a)
    if not all(math.isfinite(v) for v in (sd2, stt, sgg, stg)):
        return None
    d, tn, an = math.sqrt(sd2), math.sqrt(stt), math.sqrt(sgg)
    if an <= slack:
        return None
    moved = slack * (d + an) + slack * slack
    low = Errors(max(0.0, d - slack) / max(tn, an + slack),
                 max(0.0, abs(stg - sgg) - moved) / (an + slack) ** 2)
    mid = Errors(d / max(tn, an) if max(tn, an) > 0 else 0.0, (stg - sgg) / sgg)
    high = Errors((d + slack) / max(tn, an - slack), (abs(stg - sgg) + moved) / (an - slack) ** 2)
    return low, mid, high


def bounds_against(target: torch.Tensor, approx: torch.Tensor, slack: float) -> Errors | None:
    """The upper bounds of `error_interval`."""
    got = error_interval(target, approx, slack)
    return got[2] if got is not None else None


def scale_gap(target: torch.Tensor, reference: torch.Tensor, approx: torch.Tensor,
              slack: float) -> float | None:
    """An upper bound of |scale(target) - scale(reference)| against every exact result within
    `slack` of `approx`: the difference is <t - r, e> / ||e||^2, bounded by
    (|<t - r, a>| + ||t - r|| slack) / (||a|| - slack)^2. None when not finite or ||a|| <= slack."""
    got = gap_to_reference(target, reference, approx, slack)
    return got[0] if got is not None else None


def gap_to_reference(target: torch.Tensor, reference: torch.Tensor, approx: torch.Tensor,
                     slack: float) -> tuple[float, float, float, float] | None:
    """(`scale_gap`'s bound, ||t - r||, ||r||, ||a||) in one sweep (`rules.judge_bounded` reads the
    middle two: a target this close to the reference kernel's result passes whatever the exact
    result is). None as `scale_gap`, or when t or r is not finite."""
    t, r, a = (x.detach().reshape(-1) for x in (target, reference, approx))
    if t.is_complex() or r.is_complex() or a.is_complex():
        return None
    uu = ua = aa = rr = 0.0
    for start in range(0, t.numel(), _CHUNK):
        rc = r[start:start + _CHUNK].to(torch.float64)
        u = t[start:start + _CHUNK].to(torch.float64) - rc
        b = a[start:start + _CHUNK].to(torch.float64)
        p_uu, p_ua, p_aa, p_rr = torch.stack([u.dot(u), u.dot(b), b.dot(b), rc.dot(rc)]).tolist()
        uu, ua, aa, rr = uu + p_uu, ua + p_ua, aa + p_aa, rr + p_rr
    if not all(math.isfinite(v) for v in (uu, ua, aa, rr)) or math.sqrt(aa) <= slack:
        return None
    gap = (abs(ua) + math.sqrt(uu) * slack) / (math.sqrt(aa) - slack) ** 2
    return gap, math.sqrt(uu), math.sqrt(rr), math.sqrt(aa)


def rounding_floor(exact: torch.Tensor, dtype: torch.dtype, slack: float = 0.0) -> float | None:
    """A lower bound on the error (`errors_against`'s `error`) of ANY tensor of `dtype` against
    the float64 result `exact`, a correct reference kernel's included: Q / (E + Q), where
    Q = ||round(exact) - exact|| (round to nearest, the closest `dtype` tensor there is) and
    E = ||exact||. Why it bounds: a tensor r of `dtype` has D = ||r - exact|| >= Q, and its
    error D / max(||r||, E) >= D / (E + D) >= Q / (E + Q). Scaled by `FLOOR_SAFETY` for torch's
    float64 -> float32 -> dtype double rounding and the summation order.

    slack: `exact` is only known within this L2 distance (`bounds_against`); the distance to
    the nearest `dtype` tensor moves by at most as much, so Q >= Q(exact) - slack and
    E <= E(exact) + slack bound it.

    None when no bound is known: a non-floating or complex dtype, inf/NaN in `exact`, or a
    value that overflows `dtype`."""
    if not dtype.is_floating_point or exact.is_complex() or not exact.is_floating_point():
        return None
    e = exact.detach().reshape(-1)
    qq = ee = 0.0
    for start in range(0, e.numel(), _CHUNK):
        b = e[start:start + _CHUNK].to(torch.float64)
        d = b.to(dtype).to(torch.float64) - b
        q2, e2 = torch.stack([d.dot(d), b.dot(b)]).tolist()
        qq, ee = qq + q2, ee + e2
    if not (math.isfinite(qq) and math.isfinite(ee)):
        return None
    q = max(0.0, math.sqrt(qq) - slack)
    e_norm = math.sqrt(ee) + slack
    return FLOOR_SAFETY * q / (e_norm + q) if e_norm + q > 0 else 0.0


FLOOR_SAFETY = 0.99
