"""The rules a replayed output is judged by (see `opdiff.comparison.replay.local`'s docstring).

    from opdiff.comparison.replay.rules import judge_tensor, settle
    judge_tensor(name, target, float64_result, reference_result, policy)
    settle(name, target, float64_result, policy)     # the same verdict, or None

`settle` gives `judge_tensor`'s verdict without the reference kernel's result whenever that
result cannot change it, which is most of the time for a healthy op: running the reference (a
bfloat16 convolution on a CPU without bf16 units, say) was most of the compare's replay time.

The reference's error against float64 only ever raises the bars (`judge_measured`):

    scale:   |s_t| > |s_ref| + max(scale_tolerance, SIGMAS * err_ref / sqrt(n))
    random:  err_t > RATIO * err_ref + tolerance / 10

and no tensor of the output's dtype, the reference's included, is closer to the float64 result
than that result rounded to the dtype: err_ref >= floor (`errors.rounding_floor`, a proven lower
bound). So a target with

    |s_t| <= max(scale_tolerance, SIGMAS * floor / sqrt(n))   and   err_t <= RATIO * floor + tolerance / 10

passes both rules whatever the reference gives: it is settled as passing. Anything else (a
borderline or bad target, inf/NaN anywhere, a complex output, a value beyond the dtype's range)
is left to the full rules with the reference run: a verdict never changes, only the reference's
errors of a settled output are not known (`reference_run` False; `reference_error` holds the
floor, a lower bound of it, and `reference_scale_error` 0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch

from .errors import (Errors, bounds_against, error_interval, errors_against, errors_and_floor,
                     gap_to_reference, rounding_floor)

if TYPE_CHECKING:
    from ..verdicts import Policy

RATIO = 3.0
SIGMAS = 4.0


@dataclass(frozen=True)
class TensorLocalError:
    """One output tensor of a replayed op: the target's and the reference kernel's error."""
    name: str                   # the target tensor's name in the dump (the compare row's name)
    dtype: str
    numel: int
    error: float                # target vs float64 replay, relative L2
    scale_error: float          # target vs float64 replay, <t,e>/<e,e> - 1
    reference_error: float      # CPU kernel in the target's dtype vs float64 replay
    reference_scale_error: float
    culprit: str = ""           # "" | "random" | "scale" | "nonfinite" | "integer"
    reference_run: bool = True  # False: settled without it (`settle`); reference_error is then
    #                             the rounding floor, a lower bound of the reference's error


def judge_tensor(name: str, target: torch.Tensor, exact: torch.Tensor, reference: torch.Tensor,
                 policy: "Policy", compute: Optional[str] = None) -> TensorLocalError:
    """Compare one target tensor and the reference kernel's with the float64 result.

    compute: the op's lowest-precision floating dtype (`local.compute_dtype`), when coarser than
    the output's. A correct kernel may keep its intermediate values in it (cuDNN's bf16 batch
    norm backward rounds what its float32 weight gradient is summed from): the tolerances are
    that dtype's, and the reference's error is taken as at least what rounding the exact result
    to that dtype makes. The reference kernel (a CPU one) upcasts, so it cannot set that bar."""
    dtype = str(target.dtype).replace("torch.", "")
    n = target.numel()
    if not (target.is_floating_point() or target.is_complex()):
        wrong = not torch.equal(target, exact.to(target.dtype)) and \
            torch.equal(reference, exact.to(reference.dtype))
        err = 0.0 if torch.equal(target, exact.to(target.dtype)) else 1.0
        return TensorLocalError(name, dtype, n, err, 0.0, 0.0, 0.0, "integer" if wrong else "")
    m_r = errors_against(reference, exact)
    floor = _compute_floor(exact, target.dtype, compute)
    if floor is not None and floor > m_r.error:
        m_r = Errors(floor, m_r.scale_error, m_r.nonfinite_mismatch)
    return judge_measured(name, dtype, n, errors_against(target, exact), m_r, policy, compute)


def _compute_floor(exact: torch.Tensor, dtype: torch.dtype, compute: Optional[str]
                   ) -> Optional[float]:
    """What rounding to `compute` alone makes of the exact result, when `compute` is coarser
    than the output's dtype: a kernel working in `compute` is not expected to be closer (the
    reference kernel's error is raised to it). None otherwise."""
    low = getattr(torch, compute, None) if compute else None
    if not isinstance(low, torch.dtype) or not low.is_floating_point or \
            not dtype.is_floating_point or torch.finfo(low).bits >= torch.finfo(dtype).bits:
        return None
    return rounding_floor(exact, low)


def judge_measured(name: str, dtype: str, n: int, m_t: Any, m_r: Any, policy: "Policy",
                   compute: Optional[str] = None) -> TensorLocalError:
    """`judge_tensor`'s rules on measurements already taken (`errors_against`, or
    `opdiff.comparison.metrics.measure`, of the target and of the reference against the
    float64 result: anything with error, scale_error and nonfinite_mismatch)."""
    culprit = ""
    if m_t.nonfinite_mismatch:
        # inf/NaN made here from inputs the float64 replay handles finitely: the op is the
        # origin, whether or not its dtype's range explains it (the reference then says so).
        return TensorLocalError(name, dtype, n, m_t.error, m_t.scale_error, m_r.error,
                                m_r.scale_error, "nonfinite")
    if m_r.nonfinite_mismatch:          # the dtype itself overflows here: nothing to calibrate
        return TensorLocalError(name, dtype, n, m_t.error, m_t.scale_error, m_r.error,
                                m_r.scale_error, "")
    tol = policy.tolerance_for(dtype, compute or dtype)
    stol = policy.scale_tolerance_for(dtype, compute or dtype)
    if abs(m_t.scale_error) > abs(m_r.scale_error) + max(
            stol, SIGMAS * m_r.error / math.sqrt(max(n, 1))):
        culprit = "scale"
    elif m_t.error > RATIO * m_r.error + tol / 10:
        culprit = "random"
    return TensorLocalError(name, dtype, n, m_t.error, m_t.scale_error, m_r.error,
                            m_r.scale_error, culprit)


def settle(name: str, target: torch.Tensor, exact: torch.Tensor, policy: "Policy",
           slack: float = 0.0, compute: Optional[str] = None) -> Optional[TensorLocalError]:
    """`judge_tensor`'s verdict when it holds whatever the reference kernel gives (a passing
    one: see the module docstring), else None (run the reference).

    slack > 0: `exact` is a float32 result within that L2 distance of the float64 one
    (`direct.forward_float32`); the rules are then applied to the worst case the bound allows
    (`errors.bounds_against`, `errors.rounding_floor(slack=)`), so what settles here settles
    against float64 too, and None sends the caller to the float64 run."""
    dtype = str(target.dtype).replace("torch.", "")
    n = target.numel()
    if not (target.is_floating_point() or target.is_complex()):
        if exact.dtype == target.dtype and torch.equal(target, exact):
            return TensorLocalError(name, dtype, n, 0.0, 0.0, 0.0, 0.0, "", reference_run=False)
        return None
    if target.is_complex() or exact.is_complex():
        return None
    if slack == 0.0 and exact.dtype == target.dtype and torch.equal(target, exact):
        # the exact result itself (an op exact in its dtype: `direct.exact_in_dtype`): no
        # error, no scale, and no rounding either (floor 0); any reference passes it
        return TensorLocalError(name, dtype, n, 0.0, 0.0, 0.0, 0.0, "", reference_run=False)
    fused = errors_and_floor(target, exact, target.dtype) if slack == 0.0 else None
    m_t: Optional[Errors]
    floor: Optional[float]
    if fused is not None:
        m_t, floor = fused
    else:
        m_t = errors_against(target, exact) if slack == 0.0 else bounds_against(target, exact,
                                                                                slack)
        if m_t is None or m_t.nonfinite_mismatch or not (
                math.isfinite(m_t.error) and math.isfinite(m_t.scale_error)):
            return None
        floor = rounding_floor(exact, target.dtype, slack)
    if floor is None:
        return None
    coarse = _compute_floor(exact, target.dtype, compute) if slack == 0.0 else None
    floor = max(floor, coarse or 0.0)
    tol = policy.tolerance_for(dtype, compute or dtype)
    stol = policy.scale_tolerance_for(dtype, compute or dtype)
    if abs(m_t.scale_error) <= max(stol, SIGMAS * floor / math.sqrt(max(n, 1))) and \
            m_t.error <= RATIO * floor + tol / 10:
        return TensorLocalError(name, dtype, n, m_t.error, m_t.scale_error, floor, 0.0, "",
                                reference_run=False)
    return None


def judge_bounded(name: str, target: torch.Tensor, approx: torch.Tensor, slack: float,
                  reference: torch.Tensor, policy: "Policy", compute: Optional[str] = None
                  ) -> Optional[TensorLocalError]:
    """`judge_tensor`'s passing verdict when it holds for every float64 result within `slack`
    of `approx` (a float32 result with a proven bound, `direct.backward_float32`), else None:
    the caller runs float64. The rules on the worst case:

        err_t <= max err_t <= RATIO * min err_ref + tolerance / 10
        |s_t| - |s_ref| <= |s_t - s_ref| <= max gap <= max(scale_tolerance, SIGMAS * min err_ref / sqrt(n))

    (the scale gap is bounded as one quantity, <t - ref, e> / ||e||^2: a target and a
    reference that agree stay together however e moves). The first line also holds, whatever
    the exact result e, for a target near the reference (`near_reference`: a CPU target is
    the reference kernel's result bit for bit, while the bound on e may be too loose for the
    first line: a bf16 weight gradient's). The errors kept are measured against `approx`,
    which is within `slack` of float64."""
    if not (target.is_floating_point() and reference.is_floating_point()) or \
            target.dtype != reference.dtype:
        return None
    t_int, r_int = error_interval(target, approx, slack), error_interval(reference, approx, slack)
    gaps = gap_to_reference(target, reference, approx, slack)
    if t_int is None or r_int is None or gaps is None:
        return None
    gap, distance, r_norm, a_norm = gaps
    dtype = str(target.dtype).replace("torch.", "")
    n = target.numel()
    tol = policy.tolerance_for(dtype, compute or dtype)
    stol = policy.scale_tolerance_for(dtype, compute or dtype)
    r_low = r_int[0].error
    e_low = max(r_norm, a_norm - slack)             # <= max(||r||, ||e||)
    if (t_int[2].error <= RATIO * r_low + tol / 10 or near_reference(distance, e_low, tol / 10)) \
            and gap <= max(stol, SIGMAS * r_low / math.sqrt(max(n, 1))):
        return TensorLocalError(name, dtype, n, t_int[1].error, t_int[1].scale_error,
                                r_int[1].error, r_int[1].scale_error, "")
    return None


def near_reference(distance: float, m_low: float, tau: float) -> bool:
    """Does err_t <= RATIO * err_r + tau hold for EVERY exact result e, given only
    u = ||t - r|| (`distance`) and a lower bound `m_low` of M = max(||r||, ||e||)?

    With D = ||r - e||, err_r = D / M: ||t - e|| <= D + u and max(||t||, ||e||) >= M - u, so
    err_t <= (D + u) / (M - u), which is at most RATIO D / M + tau when
    u (1 + RATIO err_r + tau) <= (RATIO - 1) D + tau M. Both sides are linear in err_r and the
    right one grows faster while RATIO u <= (RATIO - 1) M, so err_r = 0 is the worst case:
    u (1 + tau) <= tau M. A target equal to the reference (u = 0) always passes this rule."""
    return RATIO * distance <= (RATIO - 1) * m_low and distance * (1 + tau) <= tau * m_low
