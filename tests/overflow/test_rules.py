"""The overflow-origin rule for one op (overflow/rules.py), case by case."""
from __future__ import annotations

import pytest

from opdiff.overflow import rules
from opdiff.overflow.rules import (ABSORBED, CLEAN, CONTAINS_ORIGIN, FINITE, INHERITED,
                                   INTENTIONAL, LOSS_SCALER, NONFINITE, ORIGIN, PROPAGATES,
                                   USES_FORWARD, Health, judge)

INF, NAN = Health(inf=True), Health(nan=True)
UNKNOWN = Health(unknown=True)

CASES = [
    # (case, inputs, outputs, context, kind, why)
    ("all finite", FINITE, FINITE, {}, CLEAN, ""),
    ("a mask swallows inf", INF, FINITE, {}, ABSORBED, ""),
    ("finite outputs: nothing else matters", INF, FINITE,
     dict(forward_nonfinite=True, inside_origin=True, origin_seen=True), ABSORBED, ""),
    ("born here", FINITE, INF, {}, ORIGIN, "its inputs are finite, its outputs are not"),
    ("born here, NaN", FINITE, NAN, {}, ORIGIN, "its inputs are finite, its outputs are not"),
    ("born here, a later origin", FINITE, INF, dict(origin_seen=True), ORIGIN,
     "its inputs are finite, its outputs are not"),
    ("inputs not recorded, first", UNKNOWN, INF, {}, ORIGIN,
     "its outputs are not finite (its inputs were not recorded)"),
    ("inputs not recorded, after an origin", UNKNOWN, INF, dict(origin_seen=True), INHERITED,
     PROPAGATES),
    ("given -inf as a number", FINITE, INF, dict(given_nonfinite_number=True), INTENTIONAL, ""),
    ("passes inf on", INF, INF, {}, INHERITED, PROPAGATES),
    ("passes NaN on", NAN, NAN, {}, INHERITED, PROPAGATES),
    ("softmax of a masked row: inf in, NaN out", INF, NAN, {}, ORIGIN,
     "it turned +-inf inputs into NaN"),
    ("inf to NaN after an origin", INF, NAN, dict(origin_seen=True), INHERITED, PROPAGATES),
    ("a module around the origin", FINITE, INF, dict(inside_origin=True), INHERITED,
     CONTAINS_ORIGIN),
    ("backward of a forward that saw inf", FINITE, INF, dict(forward_nonfinite=True), INHERITED,
     USES_FORWARD),
    ("parameter gradient after inf/NaN", FINITE, NAN, dict(accumulated_after_nonfinite=True),
     INHERITED, PROPAGATES),
    ("loss-scaler bookkeeping", INF, INF, dict(loss_scaler=True), LOSS_SCALER, ""),
    ("loss-scaler bookkeeping, finite", FINITE, FINITE, dict(loss_scaler=True), LOSS_SCALER, ""),
    # What an online check that only knows "finite or not" passes: never the NaN rule.
    ("online: non-finite in and out", NONFINITE, NONFINITE, {}, INHERITED, PROPAGATES),
    ("online: finite in, non-finite out", FINITE, NONFINITE, {}, ORIGIN,
     "its inputs are finite, its outputs are not"),
]


@pytest.mark.parametrize("case,inputs,outputs,context,kind,why", CASES, ids=[c[0] for c in CASES])
def test_the_rule(case, inputs, outputs, context, kind, why):
    verdict = judge(inputs, outputs, **context)
    assert (verdict.kind, verdict.why) == (kind, why)
    assert verdict.nonfinite_out is (kind in (ORIGIN, INHERITED, INTENTIONAL))


def test_precedence_module_before_backward_before_param_grad():
    everything = dict(inside_origin=True, forward_nonfinite=True, accumulated_after_nonfinite=True,
                      given_nonfinite_number=True)
    assert judge(FINITE, INF, **everything).why == CONTAINS_ORIGIN
    del everything["inside_origin"]
    assert judge(FINITE, INF, **everything).why == USES_FORWARD
    del everything["forward_nonfinite"]
    assert judge(FINITE, INF, **everything).why == PROPAGATES


@pytest.mark.parametrize("op,scaler", [
    ("Torch._amp_foreach_non_finite_check_and_unscale_", True),
    ("Aten._amp_update_scale_.default", True),
    ("Tensor.add_", False),
    ("Torch.exp", False),
])
def test_loss_scaler_ops_come_from_the_op_registry(op, scaler):
    assert rules.is_loss_scaler(op) is scaler


def test_health_combines():
    assert (INF | NAN) == Health(nan=True, inf=True) and not (INF | NAN).finite
    assert (FINITE | UNKNOWN).finite and (FINITE | UNKNOWN).unknown
