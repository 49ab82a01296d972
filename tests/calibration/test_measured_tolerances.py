"""The rule a measured noise floor sets (`Policy.measured_tolerances`, `noise.measured_floors`)
and the file it lives in (`NoiseFloor`), without dumps."""
from __future__ import annotations

import json

import pytest

from opdiff.comparison import noise
from opdiff.comparison.noise_floor import MeasuredFloor, NoiseFloor, multiple_words
from opdiff.comparison.result import TensorRow
from opdiff.comparison.verdicts import Policy
from opdiff.errors import ConfigError

U32 = 2.0 ** -24


def _row(name, error, mode="statistics"):
    return TensorRow(target_name=name, golden_name=name, op_name=name.rsplit(".", 2)[0],
                     role="output", phase="forward", kind="api", index=0,
                     target_dtype="torch.float32", golden_dtype="torch.float32", error=error,
                     scale_error=error / 10, mode=mode)


def test_the_tolerance_is_the_larger_of_k_floors_and_four_roundings():
    policy = Policy()
    assert policy.measured_tolerances(MeasuredFloor(1e-7, 1e-8), "float32", "float32") == \
        pytest.approx((3e-7, U32))
    assert policy.measured_tolerances(MeasuredFloor(1e-9, 0.0), "float32", "float32")[0] == \
        pytest.approx(4 * U32)
    # bf16 against fp32 is judged by bf16's roundoff
    assert policy.measured_tolerances(MeasuredFloor(1e-9, 0.0), "bfloat16", "float32")[0] == \
        pytest.approx(4 * 2.0 ** -8)
    five = Policy({"noise_multiple": 5})
    assert five.measured_tolerances(MeasuredFloor(1e-6, 0.0), "float32", "float32")[0] == \
        pytest.approx(5e-6)


def test_only_floors_above_zero_of_the_same_mode_judge():
    floor = NoiseFloor()
    floor.add_rows([_row("A.op.0.forward.output.0", 2e-7), _row("A.op.1.forward.output.0", 0.0),
                    _row("A.op.2.forward.output.0", 3e-7)])
    floor.add_rows([_row("A.op.0.forward.output.0", 5e-7)])
    assert floor.floors["A.op.0.forward.output.0"].samples == 2
    assert floor.floors["A.op.0.forward.output.0"].error == 5e-7
    rows = [_row("A.op.0.forward.output.0", 1e-6), _row("A.op.1.forward.output.0", 1e-6),
            _row("A.op.2.forward.output.0", 1e-6, mode="tensor"), _row("B.op.0.forward.output.0", 1)]
    policy = Policy(None, floor)
    assert set(noise.measured_floors(rows, policy)) == {0}
    assert set(noise.measured_floors(rows, policy, judged=False)) == {0, 1}
    noise.say_multiples(rows, noise.measured_floors(rows, policy, judged=False))
    assert rows[0].reason == "error = 2\u00d7 its measured floor 5e-07"
    assert rows[1].reason == "error 1e-06 where healthy runs agreed exactly"
    assert rows[2].reason == "" and rows[3].reason == ""
    assert noise.measured_floors(rows, Policy()) == {}


def test_the_file_round_trips_and_a_bad_one_is_one_line(tmp_path):
    floor = NoiseFloor(runs=["a", "b"], pairs=1)
    floor.add_rows([_row("A.op.0.forward.output.0", 2e-7)])
    (tmp_path / "noise_floor.json").write_text(json.dumps(floor.to_document()))
    back = NoiseFloor.load(tmp_path)
    assert back.floors == floor.floors and back.runs == ["a", "b"]
    (tmp_path / "noise_floor.json").write_text('{"floors": {"x": {"error": -1, "scale_error": 0}}}')
    with pytest.raises(ConfigError, match="not a noise floor written by 'opdiff calibrate'"):
        NoiseFloor.load(tmp_path)
    with pytest.raises(ConfigError, match="no noise_floor.json there"):
        NoiseFloor.load(tmp_path / "nowhere")
    assert multiple_words(None, MeasuredFloor(1e-7, 0)) == ""
