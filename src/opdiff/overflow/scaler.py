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

from ..ops import method_of
from ..store.records import decoded_stats, iter_descriptors
from ..store.schema import RecordName
from .classify import health, sides, tensor_health
from .rules import is_loss_scaler

CHECK_OP = "_amp_foreach_non_finite_check_and_unscale_"
UPDATE_OP = "_amp_update_scale_"
MARK = "skipped_by_loss_scaler"      # what the online monitor writes on a scaler record


def _op(record: dict) -> str:
    if record.get("op"):
        return str(record["op"])
    parsed = RecordName.parse(str(record.get("name") or ""))
    return parsed.op if parsed is not None else str(record.get("name") or "")


def is_scaler_op(record: dict) -> bool:
    """True for the GradScaler's own bookkeeping ops (they handle inf on purpose; the op
    registry's `loss_scaler` trait)."""
    return is_loss_scaler(_op(record))


def scaler_found_inf(record: dict, dump=None) -> bool | None:
    """Did this scaler op see inf/NaN gradients? None when the record cannot tell."""
    if record.get("overflow") == MARK:
        return True
    method = method_of(_op(record))
    inputs = record.get("inputs") or []
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
