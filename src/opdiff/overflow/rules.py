"""Where is inf/NaN born? The rule for one op, as a pure function of what is known about it.

Used by the offline walk over a dump (`opdiff.overflow.analysis`) and by the online monitor of
`task="overflow_check"` (`opdiff.capture.overflow`), so both name the same op:

    from opdiff.overflow.rules import Health, judge, ORIGIN
    verdict = judge(inputs=Health(), outputs=Health(inf=True))
    verdict.kind            # "origin"
    verdict.why             # "its inputs are finite, its outputs are not"

An op is the *origin* when its inputs are finite and its outputs are not. It only *inherits*
inf/NaN when its inputs hold some already, when it is a module call around an origin, when it is
the backward of a forward op that saw inf/NaN (it reads the saved non-finite activations), or
when it is a parameter gradient accumulated after one. An op given inf or NaN as a plain number
(`masked_fill(mask, -inf)`) makes it on purpose (*intentional*). GradScaler's own bookkeeping
handles inf on purpose and is judged by the loss-scaler rules instead (*loss_scaler*).

When the outputs are finite the verdict is `clean` or `absorbed` whatever else is true, so a
caller may measure the inputs only once the outputs are found non-finite.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import ops

CLEAN = "clean"                 # finite in, finite out
ABSORBED = "absorbed"           # non-finite in, finite out (a mask, a where)
ORIGIN = "origin"               # finite in, non-finite out: inf/NaN is born here
INHERITED = "inherited"         # non-finite out because of what came in
INTENTIONAL = "intentional"     # made from an inf/NaN number the op was given
LOSS_SCALER = "loss_scaler"     # GradScaler's bookkeeping: see opdiff.overflow.scaler

# How an inherited op got its inf/NaN (the chain's relations).
PROPAGATES = "propagates"
CONTAINS_ORIGIN = "contains origin"
USES_FORWARD = "uses non-finite forward values"


@dataclass(frozen=True)
class Health:
    """What the tensors on one side of an op (its inputs, or its outputs) hold."""

    nan: bool = False           # some tensor holds NaN
    inf: bool = False           # some tensor holds +-inf
    unknown: bool = False       # some floating tensor could not be checked

    @property
    def finite(self) -> bool:
        """No tensor was seen to hold inf or NaN (unknown ones count as finite)."""
        return not (self.nan or self.inf)

    def __or__(self, other: "Health") -> "Health":
        return Health(self.nan or other.nan, self.inf or other.inf, self.unknown or other.unknown)


FINITE = Health()
# What an online check that tells only "finite or not" knows of a non-finite side.
NONFINITE = Health(nan=True, inf=True)


@dataclass(frozen=True)
class Verdict:
    """The rule's answer for one op."""

    kind: str                   # CLEAN | ABSORBED | ORIGIN | INHERITED | INTENTIONAL | LOSS_SCALER
    why: str = ""               # ORIGIN: one sentence; INHERITED: the relation (PROPAGATES, ...)

    @property
    def nonfinite_out(self) -> bool:
        """The op's outputs hold inf/NaN (every kind but clean and absorbed)."""
        return self.kind not in (CLEAN, ABSORBED, LOSS_SCALER)


def is_loss_scaler(op: str) -> bool:
    """GradScaler's own bookkeeping ops (`_amp_foreach_non_finite_check_and_unscale_`,
    `_amp_update_scale_`, in any namespace), from the op registry."""
    return ops.traits(op).loss_scaler


def judge(inputs: Health, outputs: Health, *, given_nonfinite_number: bool = False,
          loss_scaler: bool = False, inside_origin: bool = False,
          forward_nonfinite: bool = False, accumulated_after_nonfinite: bool = False,
          origin_seen: bool = False) -> Verdict:
    """The verdict for one op.

    inputs, outputs: health of the op's input and output tensors (a module's parameters are
        inputs, a parameter-gradient record's gradients outputs).
    given_nonfinite_number: the op was given inf/NaN as a plain number
        (`opdiff.store.records.has_nonfinite_number`).
    loss_scaler: GradScaler bookkeeping (`is_loss_scaler(op)`).
    inside_origin: a module call around an op already judged the origin.
    forward_nonfinite: a backward op whose forward op saw inf/NaN.
    accumulated_after_nonfinite: a parameter gradient, after an origin or inherited inf/NaN.
    origin_seen: an origin was found earlier in the same step; then an op whose inputs were not
        recorded, or that turns +-inf into NaN, is not taken for a new one.
    """
    if loss_scaler:
        return Verdict(LOSS_SCALER)
    if outputs.finite:
        return Verdict(CLEAN if inputs.finite else ABSORBED)
    if inside_origin:
        return Verdict(INHERITED, CONTAINS_ORIGIN)
    if forward_nonfinite:
        return Verdict(INHERITED, USES_FORWARD)
    if accumulated_after_nonfinite:
        return Verdict(INHERITED, PROPAGATES)
    if inputs.finite and (not inputs.unknown or not origin_seen):
        if given_nonfinite_number:
            return Verdict(INTENTIONAL)
        return Verdict(ORIGIN, "its inputs are finite, its outputs are not" if not inputs.unknown
                       else "its outputs are not finite (its inputs were not recorded)")
    if outputs.nan and not inputs.nan and not origin_seen:
        return Verdict(ORIGIN, "it turned +-inf inputs into NaN")
    return Verdict(INHERITED, PROPAGATES)


def matters(phase: str | None, kind: str | None, module: str | None) -> bool:
    """Does inf/NaN in a record's outputs matter whatever comes later? Gradients do (any
    backward record, a parameter gradient), and so does a forward value outside every module
    (the root module's output, the loss). A forward origin whose inf/NaN reaches none of these
    by the end of the step was *created and discarded* (T5's `torch.log(0)` in its position
    bucketing, made integer by `.to(long)` or dropped by `torch.where`): not an overflow.
    Without module records (level="L1") every op is outside every module: all matter. Only an
    origin `at_singularity` may be discarded: an overflow matters wherever its inf goes."""
    return phase == "backward" or kind == "param_grad" or not module


# Ops at whose poles or domain edges inf/NaN is the right answer (log(0), 1/0, sqrt(-1)):
# code may make it there on purpose and handle it (T5's log(0) clamped or dropped by where).
# Any other op makes inf from finite inputs only when a finite result exceeds its dtype's
# range: an overflow, whose value is wrong whatever absorbs it afterwards (rsqrt(inf) = 0
# zeroes a norm's output), so it is never "created and discarded".
_SINGULAR = frozenset({
    "log", "log2", "log10", "log1p", "xlogy", "special_xlogy", "logit", "sqrt", "rsqrt",
    "reciprocal", "acos", "arccos", "asin", "arcsin", "acosh", "arccosh", "atanh", "arctanh",
    "tan", "erfinv", "lgamma", "digamma", "polygamma", "mvlgamma", "std", "var", "std_mean",
    "var_mean", "fmod", "remainder", "mod", "rmod"})
_DIVISIONS = frozenset({"div", "divide", "true_divide", "truediv", "floor_divide", "floordiv",
                        "itruediv", "ifloordiv"})
_REVERSED_DIVISIONS = frozenset({"rtruediv", "rdiv", "rfloordiv"})


def _base(op: str) -> str:
    """"Tensor.__truediv__" -> "truediv", "Torch.log_" -> "log", "Aten.div.Tensor" -> "div"."""
    parts = str(op).split(".")
    return (parts[1] if len(parts) > 1 else parts[0]).strip("_")


def _number(desc) -> float | None:
    if isinstance(desc, dict) and desc.get("type") in ("int", "float") \
            and isinstance(desc.get("value"), (int, float)):
        return float(desc["value"])
    return None


def _never_zero(desc) -> bool:
    """The divisor is known to hold no zero: a non-zero number, or a tensor whose recorded
    minimum is above 0 or maximum below 0."""
    value = _number(desc)
    if value is not None:
        return value != 0
    stats = desc.get("stats") if isinstance(desc, dict) else None
    if not isinstance(stats, dict):
        return False
    low, high = stats.get("min"), stats.get("max")
    return (isinstance(low, (int, float)) and low > 0) or \
        (isinstance(high, (int, float)) and high < 0)


def at_singularity(op: str, inputs: list) -> bool:
    """Could the op's inf/NaN from finite inputs be the right answer (a pole or domain edge)
    rather than an overflow? `inputs`: the record's input descriptors (numbers carry
    "value", tensors "stats"). Only such an origin may be created and discarded; pow is one
    only for a negative or fractional exponent, a division only where the divisor may be 0."""
    name = _base(op)
    if name in _SINGULAR:
        return True
    if name == "pow":
        exponent = _number(inputs[1]) if len(inputs) > 1 else None
        return exponent is not None and (exponent < 0 or not exponent.is_integer())
    if name in _DIVISIONS:
        return not (len(inputs) > 1 and _never_zero(inputs[1]))
    if name in _REVERSED_DIVISIONS:
        return not (inputs and _never_zero(inputs[0]))
    return False


__all__ = ["judge", "matters", "at_singularity", "is_loss_scaler", "Health", "Verdict", "FINITE", "NONFINITE", "CLEAN",
           "ABSORBED", "ORIGIN", "INHERITED", "INTENTIONAL", "LOSS_SCALER", "PROPAGATES",
           "CONTAINS_ORIGIN", "USES_FORWARD"]
