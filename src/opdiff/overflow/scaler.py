"""Loss scaling: a step that GradScaler skips is expected overflow, not a model bug.

`torch.amp.GradScaler` (and `torch.cuda.amp.GradScaler`) multiplies the loss by a large scale so
fp16 gradients do not underflow; when that makes a gradient inf/NaN, `scaler.step()` skips the
optimizer step and `scaler.update()` lowers the scale. Two torch calls do this work, and they are
recorded like any other op (L1 as `Torch.*`, L2 as `Aten.*`):

- `_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)`: its input gradients
  hold inf/NaN exactly when the step will be skipped;
- `_amp_update_scale_(scale, growth_tracker, found_inf, ...)`: its `found_inf` input is 1.0 when
  the step was skipped.
"""
from __future__ import annotations

import dataclasses
import math

from ..store.schema import Record
from ..ops import method_of
from ..store.records import decoded_stats, iter_descriptors, iter_tensors
from .classify import health, sides, tensor_health
from .rules import is_loss_scaler

CHECK_OP = "_amp_foreach_non_finite_check_and_unscale_"
UPDATE_OP = "_amp_update_scale_"
MARK = "skipped_by_loss_scaler"      # what the online monitor writes on a scaler record


def _op(record: Record) -> str:
    return str(record["op"])


def is_scaler_op(record: Record) -> bool:
    """True for the GradScaler's own bookkeeping ops (they handle inf on purpose; the op
    registry's `loss_scaler` trait)."""
    return is_loss_scaler(_op(record))


def scaler_found_inf(record: Record, dump=None) -> bool | None:
    """Did this scaler op see inf/NaN gradients? None when the record cannot tell."""
    if record.get("overflow") == MARK:
        return True
    method = method_of(_op(record))
    inputs = record["inputs"]
    if method == UPDATE_OP and len(inputs) > 2:
        stats = decoded_stats(inputs[2])
        if isinstance(stats.get("max"), (int, float)):
            return stats["max"] > 0
    if method == CHECK_OP and inputs:
        grads = [leaf for _, leaf in iter_descriptors(inputs[0], "0") if leaf.get("type") == "tensor"]
        h = health(grads, dump)
        if not h.finite:
            return True
        if not h.unknown and grads:
            return False
    if method in (CHECK_OP, UPDATE_OP):
        ins, _ = sides(record)
        if any(not tensor_health(d, dump).finite for d in ins):
            return True
    return None


# -- the scaler's own large values, for the headroom warnings ------------------------------------
# GradScaler's scale (65536 by default) is far beyond fp16's range on purpose, and so is every
# copy of it (`torch.full` at first use, `.to(device)`, `.double()` for the inverse), the scaled
# loss `scale * loss` and its gradient: warning that they "would overflow in fp16" is noise.

_MULTIPLY = frozenset({"__mul__", "__rmul__", "mul", "mul_", "multiply"})


def scales_seen(record: Record) -> set[float]:
    """The loss scale(s) a scaler op shows: `_amp_update_scale_`'s scale before and after the
    update, and the inverse of `_amp_foreach_non_finite_check_and_unscale_`'s inv_scale."""
    method = method_of(_op(record))
    found: set[float] = set()
    if method == UPDATE_OP:
        for desc in record["inputs"][:1] + record["outputs"][:1]:
            value = _single_value(desc)
            if value:
                found.add(value)
    elif method == CHECK_OP:
        inputs = record["inputs"]
        inverse = _single_value(inputs[2]) if len(inputs) > 2 else None
        if inverse:
            found.add(1.0 / inverse)
    return found


class ScaledLoss:
    """Tells the headroom warnings of the loss scaler's own values from the model's.

    Fed every record (`see`) and then the loss scales the step's scaler ops showed, it drops a
    warning whose record is a copy of the scale (one element holding it), `scale * loss` (a
    multiplication with a one-element input holding it), or that product's backward.
    """

    def __init__(self) -> None:
        self._multiplies: dict[str, list[float]] = {}   # forward name -> its one-element inputs
        self.scales: set[float] = set()

    @property
    def used(self) -> float | None:
        """The scale the loss was multiplied by in this step (None: no scaled loss seen)."""
        return next((v for values in self._multiplies.values() for v in values
                     if self._is_scale(v)), None)

    def note(self, warning):
        """A backward warning under loss scaling says that its values carry the scale (what
        scaler.step() divides out), with the unscaled magnitude."""
        scale = self.used
        if scale is None or warning.phase != "backward":
            return warning
        return dataclasses.replace(warning, message=f"{warning.message}; it carries the loss scale "
                                   f"{scale:g} (unscaled {warning.max_abs / scale:.4g})")

    def see(self, record: Record) -> None:
        """Note what a record tells about the loss scale (call for every record, in order)."""
        if is_scaler_op(record):
            self.scales |= scales_seen(record)
        elif record["phase"] == "forward" and method_of(_op(record)) in _MULTIPLY:
            values = [v for v in map(_single_value, record["inputs"]) if v]
            if values:
                self._multiplies[str(record["name"])] = values

    def keep(self, record: Record, tensor: str) -> bool:
        """False when the warned `tensor` of `record` is the loss scaler's own value."""
        if not self.scales:
            return True
        for name, _, desc in iter_tensors(record):
            if name == tensor and self._is_scale(_single_value(desc)):
                return False
        forward = record["name"] if record["phase"] == "forward" \
            else record.get("forward")
        return not any(self._is_scale(v) for v in self._multiplies.get(str(forward), ()))

    def _is_scale(self, value: float | None) -> bool:
        return value is not None and any(abs(value - s) <= 1e-6 * s for s in self.scales)


def _single_value(desc) -> float | None:
    """The value of a one-element float tensor from its statistics (None otherwise)."""
    if not isinstance(desc, dict) or desc.get("type") != "tensor":
        return None
    shape = desc.get("shape") or []
    if any(int(n) != 1 for n in shape):
        return None
    stats = decoded_stats(desc)
    hi, lo = stats.get("max"), stats.get("min")
    if isinstance(hi, (int, float)) and hi == lo and math.isfinite(hi) and hi > 0:
        return float(hi)
    return None
