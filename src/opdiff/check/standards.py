"""The accuracy standards of `opdiff check`: is one output of one op good enough?

Every output is judged against the golden, the op re-run in float64 on the CPU, with the
reference beside it: the op re-run on the CPU in the target's dtypes (what a correct kernel of
that dtype gives). The standard depends on the output and the op:

- **bitwise** (integer, bool and index outputs: argmax, topk indices, comparisons, gather of
  integers): the target must equal the golden, or the reference kernel (two correct kernels may
  break ties differently). Any other difference fails.
- **ulp** (elementwise forward ops, `ELEMENTWISE`): the error of each element in units in the
  last place of the target's dtype, `|t - g| / ulp(g)`; where `|g|` is below the dtype's
  small-value bound (`SMALL_VALUE`: fp32 2^-14, fp16 2^-11, bf16 2^-8, after msprobe's
  acc_check) an absolute threshold replaces it (`SMALL_ATOL`: 2^-30, 2^-16, 2^-16).
  fp16/bf16 pass when under 0.1% of the elements exceed 1 ULP (or the small-value bound);
  fp32/fp64 when the mean ULP error is under 64 or under 5% exceed 32 ULP. Either way an
  output no worse than the reference kernel's passes.
- **ratio** (everything else: matmul, conv, reductions, norms, attention, backward records):
  the target's relative L2 error against float64 must stay within `RATIO` (3) times the
  reference kernel's, plus a floor of a tenth of the dtype's tolerance
  (`opdiff.comparison.verdicts`): `err_t > 3 * err_ref + tol / 10` fails. A scale rule beside
  it (`|s_t| > |s_ref| + max(scale_tol, 4 * err_ref / sqrt(n))`, s = <t,g>/<g,g> - 1) finds a
  kernel off by a constant factor below its rounding noise (a bf16 BatchNorm backward). These
  are the rules of the compare's replay (`opdiff.comparison.replay.local`); the factor 3 is
  `torch._dynamo.utils.same`'s for reduced precision (msprobe's RMSE ratios are 2/1.5/1.2 but
  against a one-dtype-up golden and a second device).
- **nonfinite** (all standards, first): inf/NaN at positions where the golden has none, or the
  other way round, fail, unless the reference kernel has exactly the same ones (the dtype's
  range overflows there, not the kernel).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..comparison.metrics import measure
from ..comparison.replay.local import judge_measured
from ..numbers import human

BITWISE, ULP, RATIO_STANDARD = "bitwise", "ulp", "ratio"
PASS, FAIL = "pass", "fail"
RATIO = 3.0

# Elementwise ops (the name after the namespace: `Functional.gelu`, `Tensor.__iadd__`, `Torch.exp`).
ELEMENTWISE = frozenset("""
relu relu_ relu6 gelu silu mish sigmoid tanh hardtanh hardswish hardsigmoid leaky_relu elu selu
celu softplus softsign logsigmoid threshold exp exp2 expm1 log log2 log10 log1p sqrt rsqrt
reciprocal square neg abs sign sin cos tan erf erfc clamp clamp_ clip maximum minimum where
add sub mul div true_divide pow add_ sub_ mul_ div_ pow_ lerp addcmul addcdiv
__add__ __radd__ __iadd__ __sub__ __rsub__ __isub__ __mul__ __rmul__ __imul__ __truediv__
__rtruediv__ __itruediv__ __neg__ __abs__ __pow__ __rpow__ __ipow__
to float half bfloat16 double type_as contiguous clone
""".split())

_HALF = (torch.float16, torch.bfloat16)
SMALL_VALUE = {torch.float32: 2.0 ** -14, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8,
               torch.float64: 2.0 ** -14}
SMALL_ATOL = {torch.float32: 2.0 ** -30, torch.float16: 2.0 ** -16, torch.bfloat16: 2.0 ** -16,
              torch.float64: 2.0 ** -50}


@dataclass(frozen=True)
class OutputCheck:
    """The verdict on one output tensor of one op."""
    name: str                       # the tensor's name in the dump
    dtype: str
    numel: int
    standard: str                   # BITWISE | ULP | RATIO_STANDARD
    status: str                     # PASS | FAIL
    error: float                    # target vs float64, relative L2 (bitwise: share of elements)
    reference_error: float          # reference kernel vs float64, same measure
    reason: str = ""                # why it failed, in words ("" when it passed)
    metrics: dict[str, Any] = field(default_factory=dict)   # compare metrics + standard's own

    @property
    def ratio(self) -> Optional[float]:
        """err_target / err_reference (None when the reference is exact)."""
        if self.reference_error > 0 and math.isfinite(self.reference_error):
            return self.error / self.reference_error
        return None


def standard_for(op: str, phase: str, dtype: torch.dtype) -> str:
    """Which standard judges an output of dtype `dtype` of `op` in `phase`."""
    if not (dtype.is_floating_point or dtype.is_complex):
        return BITWISE
    short = op.rsplit(".", 1)[-1]
    if phase == "forward" and short in ELEMENTWISE and dtype in SMALL_VALUE:
        return ULP
    return RATIO_STANDARD


def judge_output(op: str, phase: str, name: str, target: torch.Tensor, exact: torch.Tensor,
                 reference: torch.Tensor, policy: Any, reference_name: str = "CPU kernel"
                 ) -> OutputCheck:
    """Judge one output (see the module docstring); `policy` gives the dtype tolerances."""
    standard = standard_for(op, phase, target.dtype)
    dtype = str(target.dtype).replace("torch.", "")
    if standard == BITWISE:
        return _bitwise(name, dtype, target, exact, reference)
    m_t, m_r = measure(target, exact), measure(reference, exact)
    metrics = {k: v for k, v in m_t.metrics.items() if v is not None}
    what = "gradient" if phase == "backward" else "output"
    if m_t.nonfinite_mismatch:
        if _same_nonfinite(target, reference):
            return OutputCheck(name, dtype, target.numel(), standard, PASS, m_t.error, m_r.error,
                               metrics=metrics)
        return OutputCheck(name, dtype, target.numel(), standard, FAIL, m_t.error, m_r.error,
                           f"inf/NaN in other places than in float64: {m_t.nonfinite_mismatch} "
                           f"element(s); a {reference_name} has "
                           f"{'the same' if m_r.nonfinite_mismatch else 'none'}", metrics)
    if standard == ULP:
        return _ulp(name, dtype, target, exact, reference, m_t.error, m_r.error, metrics,
                    what, reference_name)
    local = judge_measured(name, dtype, target.numel(), m_t, m_r, policy)
    metrics.update(scale_error=local.scale_error, reference_scale_error=local.reference_scale_error)
    if not local.culprit:
        return OutputCheck(name, dtype, target.numel(), standard, PASS, local.error,
                           local.reference_error, metrics=metrics)
    ratio = local.error / local.reference_error if local.reference_error > 0 else math.inf
    worse = f": {ratio:.0f}x worse" if math.isfinite(ratio) and ratio >= 2 else ""
    reason = (f"{what} error {human(local.error)} against float64, a correct {reference_name}'s "
              f"is {human(local.reference_error)}{worse}")
    if local.culprit == "scale":
        reason += (f"; scaled by {1 + local.scale_error:.6g} (the {reference_name}: "
                   f"{1 + local.reference_scale_error:.6g})")
    return OutputCheck(name, dtype, target.numel(), standard, FAIL, local.error,
                       local.reference_error, reason, metrics)


def _same_nonfinite(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.double(), b.double()
    return bool(torch.equal(torch.isnan(a), torch.isnan(b))
                and torch.equal(torch.isposinf(a), torch.isposinf(b))
                and torch.equal(torch.isneginf(a), torch.isneginf(b)))


def _bitwise(name: str, dtype: str, target: torch.Tensor, exact: torch.Tensor,
             reference: torch.Tensor) -> OutputCheck:
    n = max(target.numel(), 1)
    golden = exact.to(target.dtype)
    diff = int((target != golden).sum())
    ref_diff = int((reference.to(target.dtype) != golden).sum())
    metrics = {"mismatched": diff, "reference_mismatched": ref_diff}
    if diff == 0 or torch.equal(target, reference.to(target.dtype)):
        return OutputCheck(name, dtype, target.numel(), BITWISE, PASS, diff / n, ref_diff / n,
                           metrics=metrics)
    return OutputCheck(name, dtype, target.numel(), BITWISE, FAIL, diff / n, ref_diff / n,
                       f"{diff} of {target.numel()} {dtype} element(s) differ from float64 "
                       f"(a CPU kernel's: {ref_diff}); integer outputs must match exactly",
                       metrics)


def ulp_errors(values: torch.Tensor, exact: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ULP error per normal element, mask of elements over the small-value absolute
    threshold) of `values` (a float tensor) against the float64 `exact`."""
    dtype = values.dtype
    info = torch.finfo(dtype)
    g = exact.double().reshape(-1)
    t = values.double().reshape(-1)
    finite = torch.isfinite(g) & torch.isfinite(t)
    g, t = torch.where(finite, g, 0.0), torch.where(finite, t, 0.0)
    small = g.abs() < SMALL_VALUE[dtype]
    exponent = torch.floor(torch.log2(g.abs().clamp_min(info.tiny))).clamp_min(
        math.log2(info.tiny))
    ulp = torch.exp2(exponent - (_mantissa_bits(dtype)))
    err = (t - g).abs()
    return (err / ulp)[~small], err[small] > SMALL_ATOL[dtype]


def _mantissa_bits(dtype: torch.dtype) -> int:
    return {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7, torch.float64: 52}[dtype]


def _ulp_stats(values: torch.Tensor, exact: torch.Tensor) -> tuple[float, float, float]:
    """(share of elements over the threshold, mean ULP error, max ULP error)."""
    u, small_bad = ulp_errors(values, exact)
    threshold = 1.0 if values.dtype in _HALF else 32.0
    n = max(values.numel(), 1)
    share = (int((u > threshold).sum()) + int(small_bad.sum())) / n
    mean = float(u.mean()) if u.numel() else 0.0
    top = float(u.max()) if u.numel() else 0.0
    return share, mean, top


def _ulp(name: str, dtype: str, target: torch.Tensor, exact: torch.Tensor,
         reference: torch.Tensor, err: float, ref_err: float, metrics: dict[str, Any],
         what: str, reference_name: str) -> OutputCheck:
    share, mean, top = _ulp_stats(target, exact)
    r_share, r_mean, _ = _ulp_stats(reference, exact)
    metrics.update(ulp_share=share, ulp_mean=mean, ulp_max=top, reference_ulp_share=r_share,
                   reference_ulp_mean=r_mean)
    half = target.dtype in _HALF
    ok = share <= r_share or (share < 0.001 if half else (mean < 64 or share < 0.05))
    if ok:
        return OutputCheck(name, dtype, target.numel(), ULP, PASS, err, ref_err, metrics=metrics)
    limit = "1 ULP" if half else "32 ULP"
    return OutputCheck(name, dtype, target.numel(), ULP, FAIL, err, ref_err,
                       f"{what} error {human(err)} against float64, a correct {reference_name}'s "
                       f"is {human(ref_err)}; {share:.1%} of the elements are off by more than "
                       f"{limit} (the {reference_name}: {r_share:.1%}), mean {mean:.3g} ULP, "
                       f"max {top:.3g}", metrics)
