"""`opdiff check` says once why the calls of one op were not checked, not once per call."""
from opdiff.check.engine import NOT_CHECKED, CheckResult, OpCheck
from opdiff.check.outputs import not_checked_notes

WHY = "argument 'memory_format' is torch.preserve_format"


def _op(name, op, reason=WHY):
    return OpCheck(name=name, op=op, phase="forward", index=0, status=NOT_CHECKED, reason=reason)


def test_calls_of_one_op_for_one_reason_are_one_line():
    ops = [_op(f"Torch.zeros_like.{i}.forward", "Torch.zeros_like") for i in range(42)]
    ops.append(_op("Functional.dropout.0.forward", "Functional.dropout", "random"))
    notes = not_checked_notes(CheckResult(dump="d", ops=ops))
    assert notes == [
        f"not checked: Torch.zeros_like, 42 calls (first Torch.zeros_like.0.forward): {WHY}",
        "not checked: Functional.dropout.0.forward: random"]


def test_the_limit_counts_groups_and_the_rest_says_how_many_ops():
    ops = [_op(f"Torch.op{i}.0.forward", f"Torch.op{i}") for i in range(4)]
    ops += [_op(f"Torch.op9.{i}.forward", "Torch.op9") for i in range(3)]
    notes = not_checked_notes(CheckResult(dump="d", ops=ops), limit=3)
    assert len(notes) == 4 and notes[-1].startswith("... and 4 more op(s)")
