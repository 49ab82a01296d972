"""Noise in, noise out: when an op's inputs already carry so much rounding noise that no size of
output error can be called the op's own.

The blame rule (`opdiff.comparison.blame`) names an op whose output error is an order of
magnitude above its inputs'. That reads relative errors as if they added up, which holds while
they are small. Two cases break it, both met by healthy bf16 runs at `opt.step()`:

- **An input that is noise through and through** (relative error of 1 or more: its values are
  not those of golden at all, as a gradient that is mathematically zero is bf16 rounding noise
  on one side and fp32 rounding noise on the other; `verdicts.Policy.within_input_noise` clears
  the backward op that makes it). Whatever is computed from it is noise too, and relative
  errors no longer add: AdamW's `exp_avg_sq.addcmul_(grad, grad)` squares a relative error of
  1e4 into one of 1e8. Once an input differs by half its own size (`NOISE_INPUT_ERROR`; a
  factor of 2, or mostly uncorrelated values: far past where relative errors add), the inputs
  do not agree, and the op is named for no output error (only for inf/NaN it makes). A tiny
  BERT's near-zero LayerNorm gradient, 88% apart between two fp32 runs whose weights differed by
  1e-7, made the LayerNorm backward's output norm 4.3x: at 1.0 that named it. The tensor
  that differed first was either blamed where it was made (the earlier op is the culprit) or
  cleared there as noise: either way this op is not where the difference starts.
- **A division by values within noise of zero, seen through statistics.** Statistics measure an
  input's error relative to its magnitude; a quotient measures each element against its own
  divisor. AdamW's first step divides a gradient by its own absolute value (`addcdiv_`: the
  update is lr * sign(grad)); an element of 2e-7 beside a maximum of 6e-4 is within bf16 noise of
  zero, its sign is noise, and the parameter moves by lr the other way: a 12% change of the
  output's mean from inputs whose statistics agree to 1%. A divisor whose elements all share a
  sign tells its smallest magnitude (its min, or -max); when that is within the run's tolerance
  of its magnitude, or the divisor crosses zero, the quotient's statistics cannot blame the op.
  Whole-tensor dumps are not judged by this rule (their inputs' error is measured in full, and
  replay re-runs the op).
- **A product of factors that both differ, seen through statistics.** Statistics bound an
  input's element-wise error from below only, and the norm of a product is not bounded by its
  factors' statistics: AdamW's `exp_avg_sq.addcmul_(grad, grad)` squares the gradient, and the
  norm of the square is the gradient's 4-norm, which the gradient's max, min, mean and 2-norm
  do not tell (where its difference sits decides it). A systematic error passes a product at
  about its own size, which is what the scale rule looks for; with two or more factors that
  differ (or one factor twice), a moved norm is also what noise redistributed among the
  elements makes, so the scale rule does not name such an op from statistics
  (`product_of_differing`); the random rule (an order of magnitude above the inputs) still
  does. Healthy bf16 runs met it at `opt.step()` (a ResNet-18's gradients, squared by
  `addcmul_`: the output's norm 1.4-1.6 times golden's while the gradient's was 1.09-1.16) and
  in a Mamba block's selective scan (`ssm_state @ C[:, i]`). A tensor times a number, or a
  weight that agrees times an activation, has one differing factor and is judged as before.
- **A part of a tensor.** A slice or a selection (`discrete_A[:, :, i]`, `index_select`)
  differs from golden by at most what the whole does, so its relative error is at most the
  input's times norm(input) / norm(part) (`selects_part`): a Mamba scan's slice of a tensor
  1.8% apart moved by 1.1% in norm and was named.
- **A mean that cancels.** Each element of a mean over its input moves by at most the RMS of
  the input's change, so its relative error is at most the input's times RMS(input) / RMS(output)
  (`cancels`). LayerNorm's row mean (the second output of `aten.native_layer_norm`, recorded at
  L2) of activations around 1 that sum to 1e-3 carries 750 times its input's relative error: a
  tiny BERT whose fp32 weights differed by 1e-7 moved it by 1.1e-5, beyond fp32's scale
  tolerance, and named the LayerNorm. Cleared only when every other output of the op agrees.

With a measured noise floor (`opdiff compare --noise`, `noise_floor.py`), `measured_floors`
finds each row's floor for the blame rules, and `say_multiples` / `with_multiple` put each
measured error as a multiple of its floor into the rows and the culprit's sentence.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Optional

from ..store.schema import Kind, Role, split_tensor_name
from .noise_floor import multiple_words
from .result import LOCAL, SCALE, TensorRow

if TYPE_CHECKING:
    from .blame import OpScore
    from .noise_floor import MeasuredFloor
    from .result import Divergence
    from .verdicts import Policy

# An input that differs from golden by this much of its own size carries no information
# an op's own error could be told from.
NOISE_INPUT_ERROR = 0.5

# Ops that divide, and which of their inputs is the divisor (the input's position).
_DIVISORS = {
    "div": (1,), "div_": (1,), "true_divide": (1,), "divide": (1,), "__truediv__": (1,),
    "__itruediv__": (1,), "__rtruediv__": (0,), "reciprocal": (0,), "reciprocal_": (0,),
    "rsqrt": (0,), "rsqrt_": (0,), "sign": (0,), "sgn": (0,),
    "addcdiv": (2,), "addcdiv_": (2,),
    "_foreach_div": (1,), "_foreach_div_": (1,), "_foreach_addcdiv": (2,),
    "_foreach_addcdiv_": (2,), "_foreach_reciprocal": (0,), "_foreach_reciprocal_": (0,),
    "_foreach_rsqrt": (0,), "_foreach_rsqrt_": (0,), "_foreach_sign": (0,),
}


# Ops that multiply tensors, and the input positions of their factors.
_FACTORS: dict[str, tuple[int, ...]] = {
    "mul": (0, 1), "mul_": (0, 1), "multiply": (0, 1), "__mul__": (0, 1), "__rmul__": (0, 1),
    "__imul__": (0, 1), "matmul": (0, 1), "__matmul__": (0, 1), "mm": (0, 1), "bmm": (0, 1),
    "einsum": (1, 2, 3), "addcmul": (1, 2), "addcmul_": (1, 2), "addmm": (1, 2),
    "addmm_": (1, 2), "baddbmm": (1, 2), "baddbmm_": (1, 2), "addbmm": (1, 2),
    "_foreach_mul": (0, 1), "_foreach_mul_": (0, 1), "_foreach_addcmul": (1, 2),
    "_foreach_addcmul_": (1, 2),
}


# Ops whose outputs are parts of their first input (slices, selections by index or mask).
_SELECTIONS = frozenset({
    "__getitem__", "getitem", "select", "slice", "narrow", "index_select", "gather", "take",
    "masked_select", "split", "split_with_sizes", "tensor_split", "chunk", "unbind",
    "diagonal"})


# Ops whose outputs (by position; None: every output) are means over their first input.
_MEANS: dict[str, Optional[tuple[int, ...]]] = {
    "mean": None, "nanmean": None, "native_layer_norm": (1,), "native_group_norm": (1,),
    "native_batch_norm": (1,), "_native_batch_norm_legit": (1,),
    "_native_batch_norm_legit_functional": (1,), "_native_batch_norm_legit_no_training": (1,),
}


def clear(op_scores: list["OpScore"], rows: list[TensorRow], policy: "Policy",
          run_dtype: Optional[str]) -> None:
    """Unblame every op whose inputs' noise explains its output error (see module docstring).
    Only the random and scale rules yield to this; inf/NaN an op makes are still its own."""
    for op in op_scores:
        if op.kind != Kind.LEAF and op.local and op.blame in (LOCAL, SCALE) and (
                explains_any_error(op, rows, policy, run_dtype) or cancels(op, rows, policy)
                or op.blame == SCALE and product_of_differing(op, rows)
                or selects_part(op, rows)):
            op.local, op.blame, op.worst_out = False, "", None


def cancels(op: "OpScore", rows: list[TensorRow], policy: "Policy") -> bool:
    """Is the op's worst output a mean whose error its input's, amplified by cancellation,
    explains, with every other output within its tolerances (see module docstring)?"""
    if op.phase != "forward" or _method(op.op) not in _MEANS or op.worst_out is None:
        return False
    slots = _MEANS[_method(op.op)]
    data = next((m for i, m, _, _ in op.inputs if _slot(rows[i]) == 0), None)
    worst = next((m for i, m, _, _ in op.outputs if i == op.worst_out), None)
    if data is None or worst is None or worst.nonfinite_mismatch or data.nonfinite_mismatch:
        return False
    if slots is not None and _output_slot(rows[op.worst_out]) not in slots:
        return False
    rms_in, rms_out = _rms(data), _rms(worst)
    if not (rms_in > 0 and rms_out > 0):
        return False
    allowed = data.error * rms_in / rms_out
    if max(worst.error, abs(worst.scale_error)) > allowed:
        return False
    return all(m.error <= policy.tolerance_for(t, g) and
               abs(m.scale_error) <= policy.scale_tolerance_for(t, g)
               for i, m, t, g in op.outputs if i != op.worst_out)


def _method(op: str) -> str:
    """`Aten.native_layer_norm.default` and `Torch.mean` -> the method name."""
    parts = op.split(".")
    return parts[1] if parts[0] == "Aten" and len(parts) > 1 else parts[-1]


def _rms(m: Any) -> float:
    return m.norm / math.sqrt(m.numel) if m.numel and math.isfinite(m.norm) else 0.0


def _output_slot(row: TensorRow) -> Optional[int]:
    _, role, slot = split_tensor_name(row.target_name or row.golden_name or "")
    head = (slot or "").split(".", 1)[0]
    return int(head) if role == Role.OUTPUT and head.isdigit() else None


def explains_any_error(op: "OpScore", rows: list[TensorRow], policy: "Policy",
                       run_dtype: Optional[str]) -> bool:
    """Do the op's inputs carry noise that explains any output error (see module docstring)?"""
    if math.isfinite(op.error_in) and op.error_in >= NOISE_INPUT_ERROR:
        return True
    return divides_by_noise(op, rows, policy, run_dtype) is not None


def product_of_differing(op: "OpScore", rows: list[TensorRow]) -> bool:
    """Is the op, judged from statistics only, a product of two or more tensor factors that
    both differ from golden (see module docstring)?"""
    slots = _FACTORS.get(_method(op.op))
    worst = next((m for i, m, _, _ in op.outputs if i == op.worst_out), None)
    if not slots or worst is None or worst.mode != "statistics":
        return False
    differing = {_slot(rows[i]) for i, m, _, _ in op.inputs
                 if m.mode == "statistics" and _slot(rows[i]) in slots and m.error > 0}
    return len(differing) >= 2 or _squares(op, rows, slots)


def selects_part(op: "OpScore", rows: list[TensorRow]) -> bool:
    """Is the op's worst output a part of its first input (a slice, an index) whose error the
    input's explains: the part's difference is at most the whole's, so its relative error is
    at most the input's times norm(input) / norm(part) (see module docstring)?"""
    if _method(op.op) not in _SELECTIONS or op.worst_out is None:
        return False
    data = next(((i, m) for i, m, _, _ in op.inputs if _slot(rows[i]) == 0), None)
    worst = next((m for i, m, _, _ in op.outputs if i == op.worst_out), None)
    if data is None or worst is None or worst.nonfinite_mismatch or data[1].nonfinite_mismatch:
        return False
    norm_in, norm_out = _norm(rows[data[0]]), _norm(rows[op.worst_out])
    if not (norm_in > 0 and norm_out > 0):
        return False
    return max(worst.error, abs(worst.scale_error)) <= data[1].error * norm_in / norm_out


def _norm(row: TensorRow) -> float:
    """The larger L2 norm of a row's two sides, from their statistics (0 when unknown)."""
    found = [stats.get("norm") for stats in (row.target_stats, row.golden_stats)
             if isinstance(stats, dict)]
    norms = [float(n) for n in found if isinstance(n, (int, float)) and math.isfinite(n)]
    return max(norms, default=0.0)


def _squares(op: "OpScore", rows: list[TensorRow], slots: tuple[int, ...]) -> bool:
    """Do two factor slots read one and the same differing tensor (`addcmul_(g, g)`)?"""
    read = [rows[i] for i, m, _, _ in op.inputs if _slot(rows[i]) in slots and m.error > 0]
    return any(a.target_stats == b.target_stats and a.golden_stats == b.golden_stats
               for k, a in enumerate(read) for b in read[k + 1:])


def divides_by_noise(op: "OpScore", rows: list[TensorRow], policy: "Policy",
                     run_dtype: Optional[str]) -> Optional[str]:
    """The name of a statistics-only divisor input of `op` with elements within noise of zero
    (see module docstring), or None."""
    slots = _DIVISORS.get(op.op.rsplit(".", 1)[-1])
    if not slots:
        return None
    for row_index, m, tdt, gdt in op.inputs:
        if m.mode != "statistics":
            continue
        row = rows[row_index]
        if _slot(row) not in slots:
            continue
        tol = policy.run_tolerance_for(tdt, gdt, run_dtype)
        if any(_near_zero(stats, tol) for stats in (row.target_stats, row.golden_stats)):
            return str(row.target_name or row.golden_name)
    return None


def _slot(row: TensorRow) -> Optional[int]:
    """The input position a row stands for (`input.2` and the elements `input.2.k` of a list)."""
    _, role, slot = split_tensor_name(row.target_name or row.golden_name or "")
    head = (slot or "").split(".", 1)[0]
    return int(head) if role == Role.INPUT and head.isdigit() else None


def _near_zero(stats: dict[str, Any], tolerance: float) -> bool:
    """Has a tensor of these statistics elements within `tolerance` of its magnitude from zero?"""
    lo, hi = stats.get("min"), stats.get("max")
    if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)):
        return False
    magnitude = max(abs(lo), abs(hi))
    if magnitude == 0 or not math.isfinite(magnitude):
        return False            # all zeros (exact) or inf (the inf rules say it)
    if lo < 0 < hi:
        return True             # crosses zero: its smallest magnitude may be 0
    smallest = lo if lo >= 0 else -hi
    return smallest <= tolerance * magnitude


def measured_floors(rows: list[TensorRow], policy: "Policy",
                    judged: bool = True) -> dict[int, "MeasuredFloor"]:
    """Row index -> the measured noise floor of its tensor (`opdiff compare --noise`); empty
    without one. judged: only the floors the blame rules judge by, those above 0 (healthy runs
    that agreed exactly on a tensor measured no noise there: it keeps its dtype's fixed
    tolerances rather than a few units of roundoff that another device would exceed). A floor
    measured from statistics does not judge a tensor compared in full, nor the other way round:
    statistics' errors are lower bounds of the errors of whole tensors."""
    if getattr(policy, "noise", None) is None:
        return {}
    found = ((i, policy.measured_floor(row)) for i, row in enumerate(rows))
    return {i: floor for i, floor in found
            if floor is not None and floor.mode == rows[i].mode
            and (floor.error > 0 or not judged)}


def say_multiples(rows: list[TensorRow], floors: dict[int, "MeasuredFloor"]) -> None:
    """Each measured row's reason says its error as a multiple of its floor (in place)."""
    for i, floor in floors.items():
        row = rows[i]
        words = multiple_words(row.error, floor)
        if words and row.error:
            rows[i] = replace(row, reason=f"{row.reason}; {words}" if row.reason else words)


def with_multiple(divergence: Optional["Divergence"], rows: list[TensorRow],
                  floors: dict[int, "MeasuredFloor"]) -> Optional["Divergence"]:
    """The first divergence whose reason also says its worst tensor's error as a multiple of
    its measured floor."""
    if divergence is None or not floors or divergence.tensor is None:
        return divergence
    at = next((i for i in floors if divergence.tensor in (rows[i].target_name,
                                                          rows[i].golden_name)), None)
    words = multiple_words(rows[at].error, floors[at]) if at is not None else ""
    return replace(divergence, reason=f"{divergence.reason} ({words})") if words else divergence


__all__ = ["NOISE_INPUT_ERROR", "clear", "cancels", "explains_any_error", "divides_by_noise",
           "product_of_differing", "selects_part", "measured_floors", "say_multiples",
           "with_multiple"]
