"""Must hold: a kernel fault planted below the recorder (fp32 x1.001, bf16 x1.02, forward and
backward, in a CNN, an LSTM and a transformer) is the first failure of `opdiff check` on that one
dump, at the right source line; healthy fp32, bf16 and fp16 dumps of the same models fail
nothing."""
from __future__ import annotations

import pytest
from checkmodels import MODELS, dump

from opdiff.check import check_dump

# (model, op, call, phase, the source text of the call's line in replay_models.py)
FAULTS = [
    ("cnn", "Functional.conv2d", 2, "forward", "self.conv2(out)"),
    ("cnn", "Functional.batch_norm", 1, "backward", "self.bn2(self.conv2(out))"),
    ("lstm", "VF.lstm", 0, "forward", "self.lstm(x)"),
    ("lstm", "Functional.linear", 0, "backward", "self.fc(out[:, -1])"),
    ("transformer", "Functional.layer_norm", 1, "forward", None),
    ("transformer", "Functional.linear", 0, "backward", "self.emb(x)"),
]
FAST = {("cnn", "forward"), ("lstm", "backward"), ("transformer", "forward")}


def _cases():
    for model, op, call, phase, code in FAULTS:
        for precision in ("fp32", "bf16"):
            marks = () if (model, phase) in FAST and precision == "bf16" or \
                (model, phase) == ("cnn", "backward") and precision == "fp32" else \
                (pytest.mark.slow,)
            yield pytest.param(model, op, call, phase, code, precision, marks=marks,
                               id=f"{model}-{op}-{phase}-{precision}")


@pytest.mark.parametrize("model,op,call,phase,code,precision", list(_cases()))
def test_planted_fault_is_the_first_failure(tmp_path, model, op, call, phase, code, precision):
    scale = 1.001 if precision == "fp32" else 1.02
    path = dump(model, tmp_path / "d", precision,
                fault=dict(op=op, call=call, phase=phase, scale=scale))
    result = check_dump(path)
    first = result.first_failure
    assert first is not None, [(o.name, o.status) for o in result.ops]
    assert first.op == op and first.phase == phase, (first.name, first.reason)
    assert f".{call}.{phase}" in first.name, first.name
    assert first.location is not None and first.location.file.endswith("replay_models.py")
    if code is not None:
        assert code in first.location.code, first.location
    assert "against float64" in first.reason
    assert len(result.checked) > 10


HEALTHY = [pytest.param(m, p, marks=() if (m, p) in {("cnn", "bf16"), ("transformer", "fp16"),
                                                       ("lstm", "fp32")} else (pytest.mark.slow,))
           for m in MODELS for p in ("fp32", "bf16", "fp16")]


@pytest.mark.parametrize("model,precision", HEALTHY)
def test_healthy_dumps_fail_nothing(tmp_path, model, precision):
    result = check_dump(dump(model, tmp_path / "d", precision))
    assert not result.failures, [(o.name, o.reason) for o in result.failures]
    assert len(result.checked) > 10
    assert len(result.checked) >= 3 * len(result.not_checked)
