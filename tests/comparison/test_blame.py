"""The blame rules on synthetic ops and measurements, table-driven: assert on the culprit's name
and `Divergence.kind`, never on the English of the reason."""
from dataclasses import dataclass, field

import pytest

from opdiff.comparison.blame import OpScore, analyse
from opdiff.comparison.metric_table import Measurement
from opdiff.comparison.replay.local import LocalError, TensorLocalError
from opdiff.comparison.result import (ERROR, INTEGER, LOCAL, NONFINITE, NUMBER, PASS, REPLAY,
                                      SCALE, WARNING, TensorRow)
from opdiff.comparison.verdicts import Policy


def m(error=0.0, scale=0.0, numel=10_000, mode="tensor", nonfinite=0) -> Measurement:
    return Measurement({}, error=error, scale_error=scale, numel=numel, mode=mode,
                       nonfinite_mismatch=nonfinite, message="inf/NaN differ" if nonfinite else "")


@dataclass
class Op:
    """One synthetic op: the measurements of its inputs and outputs."""
    name: str
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    dtype: str = "float32"
    kind: str = "api"
    module: str = None
    forward: str = None
    arg_diffs: list = field(default_factory=list)
    const_diffs: list = field(default_factory=list)


def build(spec: list[Op], policy: Policy):
    """(OpScores, rows) as `pair` makes them, rows judged on their own by `policy`."""
    scores, rows = [], []
    for seq, o in enumerate(spec):
        phase = "backward" if ".backward" in o.name or o.kind == "param_grad" else "forward"
        op_name = o.name.rsplit(".", 2)[0]
        score = OpScore(name=o.name, op=op_name, phase=phase, kind=o.kind, module=o.module,
                        forward=o.forward, seq=seq, location=None, arg_diffs=o.arg_diffs,
                        const_diffs=o.const_diffs)
        for role, measurements, entries in (("input", o.inputs, score.inputs),
                                            ("output", o.outputs, score.outputs)):
            for slot, meas in enumerate(measurements):
                v = policy.judge(meas, o.dtype, o.dtype)
                name = f"{o.name}.{role}.{slot}"
                entries.append((len(rows), meas, o.dtype, o.dtype))
                rows.append(TensorRow(target_name=name, golden_name=name, op_name=o.name,
                                      role=role, phase=phase, kind=o.kind, index=seq,
                                      target_dtype=o.dtype, golden_dtype=o.dtype,
                                      result=v.result, accuracy_reached=v.accuracy_reached,
                                      reason=v.reason, mode=meas.mode, error=meas.error,
                                      scale_error=meas.scale_error))
        scores.append(score)
    return scores, rows


F = "Functional"
CASES = [
    ("inputs agree, output does not: local",
     [Op(f"{F}.relu.0.forward", [m()], [m()]), Op(f"{F}.linear.0.forward", [m()], [m(1e-3)])],
     f"{F}.linear.0.forward", LOCAL),
    ("error inherited from the inputs: nobody",
     [Op(f"{F}.linear.0.forward", [m(1e-3)], [m(2e-3)])], None, None),
    ("healthy bf16 rounding within its tolerance: nobody",
     [Op(f"{F}.linear.0.forward", [m()], [m(5e-3)], dtype="bfloat16")], None, None),
    ("a wrong scale below the random tolerance: scale",
     [Op(f"{F}.linear.0.forward", [m()], [m(5e-3, scale=5e-3)], dtype="bfloat16")],
     f"{F}.linear.0.forward", SCALE),
    ("a scale error the inputs carry too: nobody",
     [Op(f"{F}.linear.0.forward", [m(5e-3, scale=5e-3)], [m(6e-3, scale=6e-3)],
         dtype="bfloat16")], None, None),
    ("inf/NaN appear from finite inputs: nonfinite",
     [Op(f"{F}.softmax.0.forward", [m(1e-7)], [m(nonfinite=3)])],
     f"{F}.softmax.0.forward", NONFINITE),
    ("inf/NaN carried in: nobody",
     [Op(f"{F}.softmax.0.forward", [m(nonfinite=1)], [m(nonfinite=3)])], None, None),
    ("an integer output differs, inputs exactly equal: integer",
     [Op("Torch.argmax.0.forward", [m()], [m(1.0)], dtype="int64")],
     "Torch.argmax.0.forward", INTEGER),
    ("an integer output differs, inputs carry noise: nobody",
     [Op("Torch.argmax.0.forward", [m(1e-7)], [m(1.0)], dtype="int64")], None, None),
    ("uninitialised memory is never blamed",
     [Op("Torch.empty_like.0.forward", [m()], [m(1.0)])], None, None),
    ("number arguments differ: number",
     [Op("Tensor.__mul__.0.forward", [m()], [m(1e-3)], arg_diffs=["input.1: 2 vs 1"])],
     "Tensor.__mul__.0.forward", NUMBER),
    ("only dtype limits differ: nobody",
     [Op("Tensor.masked_fill.0.forward", [m()], [m(1.0)], const_diffs=["input.2: -65504 vs -3.4e38"])],
     None, None),
    ("the first of two local ops in execution order",
     [Op(f"{F}.conv2d.0.forward", [m()], [m(1e-3)]), Op(f"{F}.relu.0.forward", [m(1e-3)], [m(1e-3)]),
      Op(f"{F}.linear.0.forward", [m(1e-3)], [m(1.0)])],
     f"{F}.conv2d.0.forward", LOCAL),
    ("a module is explained by the op inside it",
     [Op("Module.fc.Linear.forward.0", [m()], [m(1e-3)], kind="module"),
      Op(f"{F}.linear.0.forward", [m()], [m(1e-3)], module="Module.fc.Linear.forward.0")],
     f"{F}.linear.0.forward", LOCAL),
    ("a module is named when no op inside shows the error",
     [Op("Module.fc.Linear.forward.0", [m()], [m(1e-3)], kind="module"),
      Op(f"{F}.linear.0.forward", [m()], [m()], module="Module.fc.Linear.forward.0")],
     "Module.fc.Linear.forward.0", LOCAL),
    ("backward: the forward call's inputs count as inputs",
     [Op(f"{F}.linear.0.forward", [m(1e-3)], [m(1e-3)]),
      Op(f"{F}.linear.0.backward", [m()], [m(2e-3)], forward=f"{F}.linear.0.forward")],
     None, None),
    ("backward: local when the forward call's tensors agree too",
     [Op(f"{F}.linear.0.forward", [m()], [m()]),
      Op(f"{F}.linear.0.backward", [m()], [m(2e-3)], forward=f"{F}.linear.0.forward")],
     f"{F}.linear.0.backward", LOCAL),
    ("parameter gradients without their module calls cannot be judged",
     [Op("Module.fc.Linear.parameters_grad.0", [], [m(1.0)], kind="param_grad")], None, None),
    ("parameter gradients: named when their module calls agree and no op inside shows it",
     [Op("Module.fc.Linear.forward.0", [m()], [m()], kind="module"),
      Op("Module.fc.Linear.backward.0", [m()], [m()], kind="module"),
      Op("Module.fc.Linear.parameters_grad.0", [], [m(1e-3)], kind="param_grad")],
     "Module.fc.Linear.parameters_grad.0", LOCAL),
    ("parameter gradients are explained by a backward op inside the module",
     [Op("Module.fc.Linear.forward.0", [m()], [m()], kind="module"),
      Op(f"{F}.linear.0.forward", [m()], [m()], module="Module.fc.Linear.forward.0"),
      Op("Module.fc.Linear.parameters_grad.0", [], [m(1e-3)], kind="param_grad"),
      Op(f"{F}.linear.0.backward", [m()], [m(1e-3)], forward=f"{F}.linear.0.forward")],
     f"{F}.linear.0.backward", LOCAL),
    ("statistics: below the statistics floor nobody is named",
     [Op(f"{F}.linear.0.forward", [m(mode="statistics")], [m(1.8e-2, mode="statistics")],
         dtype="bfloat16")], None, None),
    ("statistics: above the floor the op is named",
     [Op(f"{F}.linear.0.forward", [m(mode="statistics")], [m(5e-2, mode="statistics")],
         dtype="bfloat16")], f"{F}.linear.0.forward", LOCAL),
]


@pytest.mark.parametrize("what, spec, culprit, kind", CASES, ids=[c[0] for c in CASES])
def test_blame_rules(what, spec, culprit, kind):
    policy = Policy()
    scores, rows = build(spec, policy)
    fd = analyse(scores, rows, policy)
    assert (fd and fd.name, fd and fd.kind) == (culprit, kind)
    errors = [r for r in rows if r.result == ERROR]
    if culprit is None:
        assert not errors                    # what exceeds a tolerance is a warning: inherited
    else:
        assert errors[0].op_name == culprit and fd.tensor == errors[0].target_name
        assert len(errors) == (2 if "two local" in what else 1)   # only ops that made errors


def test_rows_beyond_tolerance_that_are_not_the_culprits_become_warnings():
    policy = Policy()
    scores, rows = build([Op(f"{F}.conv2d.0.forward", [m()], [m(1e-3)]),
                          Op(f"{F}.relu.0.forward", [m(1e-3)], [m(1e-3)])], policy)
    analyse(scores, rows, policy)
    assert [r.result for r in rows] == [PASS, ERROR, WARNING, WARNING]


class FakeReplayer:
    """Replay's verdicts, given: {record name: culprit (True/False)}."""

    jobs = 1

    def __init__(self, verdicts: dict):
        self.verdicts, self.judged = verdicts, []

    def close(self) -> None:
        pass

    def can_replay(self, name: str) -> bool:
        return name in self.verdicts

    def judge(self, name: str) -> LocalError:
        self.judged.append(name)
        bad = "random" if self.verdicts[name] else ""
        return LocalError(name, True, reference="float32 CPU kernel", tensors=(
            TensorLocalError(f"{name}.output.0", "float32", 100, 1e-3, 0.0, 1e-7, 0.0, bad),))


REPLAY_CASES = [
    ("replay confirms the culprit", {f"{F}.linear.0.forward": True},
     [Op(f"{F}.linear.0.forward", [m()], [m(1e-3)])], f"{F}.linear.0.forward", LOCAL),
    ("replay clears the culprit: its error is its dtype's", {f"{F}.linear.0.forward": False},
     [Op(f"{F}.linear.0.forward", [m()], [m(1e-3)])], None, None),
    ("replay does not clear differing number arguments",
     {"Tensor.__mul__.0.forward": False},
     [Op("Tensor.__mul__.0.forward", [m()], [m(1e-3)], arg_diffs=["input.1: 2 vs 1"])],
     "Tensor.__mul__.0.forward", NUMBER),
    ("replay finds a backward kernel that accumulated error hides",
     {f"{F}.batch_norm.0.backward": True},
     [Op(f"{F}.batch_norm.0.forward", [m()], [m()]),
      Op(f"{F}.batch_norm.0.backward", [m(0.1)], [m(0.12)], forward=f"{F}.batch_norm.0.forward")],
     f"{F}.batch_norm.0.backward", REPLAY),
]


@pytest.mark.parametrize("what, verdicts, spec, culprit, kind", REPLAY_CASES,
                         ids=[c[0] for c in REPLAY_CASES])
def test_replay_second_opinion(what, verdicts, spec, culprit, kind):
    policy = Policy()
    scores, rows = build(spec, policy)
    fd = analyse(scores, rows, policy, replay=FakeReplayer(verdicts))
    assert (fd and fd.name, fd and fd.kind) == (culprit, kind)


def test_replay_clears_later_innocent_ops_and_keeps_later_culprits():
    # Three ops each blamed by the comparison: the first stays the first divergence (replay
    # confirms it); of the later two, replay clears one (a mask that follows its input's sign
    # flips) and confirms the other, which stays an error row.
    policy = Policy()
    first, innocent, guilty = (f"{F}.linear.0.forward", f"{F}.relu.0.backward",
                               f"{F}.linear.1.forward")
    scores, rows = build([Op(first, [m()], [m(1e-3)]),
                          Op(innocent, [m()], [m(5e-2)]),
                          Op(guilty, [m()], [m(1e-3)])], policy)
    fake = FakeReplayer({first: True, innocent: False, guilty: True})
    fd = analyse(scores, rows, policy, replay=fake)
    assert fd.name == first and fake.judged == [first, innocent, guilty]
    errors = [r.op_name for r in rows if r.result == ERROR]
    assert errors == [first, guilty]
    assert [r.result for r in rows if r.op_name == innocent and r.role == "output"] == [WARNING]
