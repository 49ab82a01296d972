"""The engine on hand-built dumps of a small residual CNN (real tensors, real DumpWriter files)."""
import json
from pathlib import Path

import pytest
import torch

import opdiff
from opdiff.api import compare
from opdiff.comparison.pair import compare_pair
from opdiff.errors import DumpError
from opdiff.store.adapters import discover
from opdiff.store.schema import complete

from dumpkit import Recorder, cnn_run

DUMPKIT = str(Path(__file__).with_name("dumpkit.py"))


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    path = tmp_path_factory.mktemp("golden") / "step0" / "rank0"
    cnn_run(path, environment={"torch": "2.13", "device": "cpu", "threads": 2})
    return path


def test_healthy_bf16_run_names_nothing(golden, tmp_path):
    cnn_run(tmp_path / "t", bf16=True)
    result = compare(tmp_path / "t", golden)
    assert result.first_divergence is None
    assert result.counts["error"] == 0
    # bf16 differences are there, and explained: warnings, not errors
    assert result.counts["warning"] > 0
    assert "no op is to blame" in result.verdict


@pytest.mark.parametrize("op,call,bf16,scale", [
    ("Functional.conv2d", 1, True, 1 + 1e-2),
    ("Tensor.__iadd__", 0, True, 1 + 1e-2),
    ("Functional.linear", 0, True, 1 + 1e-2),
    ("Functional.relu", 1, False, 1 + 1e-4),
    ("Tensor.__iadd__", 0, False, 1 + 1e-4),
])
def test_planted_fault_is_the_first_divergence(golden, tmp_path, op, call, bf16, scale):
    cnn_run(tmp_path / "t", bf16=bf16, faults=[(op, call, scale)])
    result = compare(tmp_path / "t", golden)
    fd = result.first_divergence
    assert fd is not None and fd.name == f"{op}.{call}.forward"
    assert fd.phase == "forward" and "local error" in fd.reason
    assert fd.location.file == DUMPKIT and op.split(".")[-1].strip("_") in fd.location.code
    assert any(n == fd.location.line for n, _ in fd.context)
    culprit_rows = [r for r in result.rows if r.result == "error"]
    assert [r.op_name for r in culprit_rows] == [fd.name]


def test_iadd_reason_reads_like_the_seed(golden, tmp_path):
    cnn_run(tmp_path / "t", faults=[("Tensor.__iadd__", 0, 1.3)])
    result = compare(tmp_path / "t", golden)
    assert result.verdict.startswith("Tensor.__iadd__.0.forward")
    assert "inputs agree (cosine 1.000000" in result.verdict
    assert "`h = rec.call(\"Tensor.__iadd__\"" in result.verdict and "out += residual" in result.verdict


def test_extra_op_mid_sequence_keeps_later_ops_paired(golden, tmp_path):
    # relu(relu(x)) == relu(x): with correct pairing every paired tensor is bit-identical.
    cnn_run(tmp_path / "t", extra_relu=True)
    result = compare(tmp_path / "t", golden)
    unmatched = [r for r in result.rows if r.result == "unmatched"]
    assert len(unmatched) == 2 and {r.role for r in unmatched} == {"input", "output"}
    paired = [r for r in result.rows if r.result != "unmatched"]
    assert len(paired) == 25
    assert all(r.error == 0.0 for r in paired)
    # counters shifted after the extra relu: later relus pair with a differently-numbered twin
    shifted = [r for r in paired if r.target_name != r.golden_name]
    assert shifted and all(r.target_name.split(".")[1] == r.golden_name.split(".")[1] == "relu"
                           for r in shifted)
    assert result.first_divergence is None


def test_extra_op_and_fault_after_it(golden, tmp_path):
    cnn_run(tmp_path / "t", bf16=True, extra_relu=True, faults=[("Functional.conv2d", 2, 1.01)])
    fd = compare(tmp_path / "t", golden).first_divergence
    assert fd is not None and fd.name == "Functional.conv2d.2.forward"


def test_statistics_only_dumps_find_the_fault(tmp_path):
    cnn_run(tmp_path / "g", save_tensors=False)
    cnn_run(tmp_path / "t", bf16=True, save_tensors=False, faults=[("Functional.conv2d", 2, 1.01)])
    result = compare(tmp_path / "t", tmp_path / "g")
    assert {r.mode for r in result.rows if r.result != "unmatched"} == {"statistics"}
    assert result.first_divergence.name == "Functional.conv2d.2.forward"
    cnn_run(tmp_path / "h", bf16=True, save_tensors=False)
    assert compare(tmp_path / "h", tmp_path / "g").first_divergence is None


def test_nan_born_in_one_op_is_named(golden, tmp_path):
    rec_path = tmp_path / "t"
    cnn_run(rec_path, faults=[("Functional.max_pool2d", 0, float("nan"))])
    fd = compare(rec_path, golden).first_divergence
    assert fd.name == "Functional.max_pool2d.0.forward" and "inf/NaN" in fd.reason


def test_shape_flag(golden, tmp_path):
    cnn_run(tmp_path / "t", batch=2)
    loose = compare(tmp_path / "t", golden)
    assert any("shapes differ" in r.reason for r in loose.rows)
    with pytest.raises(DumpError, match="different models"):
        compare(tmp_path / "t", golden, shape_flag=True)


def test_environment_differences_are_listed(golden, tmp_path):
    cnn_run(tmp_path / "t", environment={"torch": "2.13", "device": "npu", "threads": 2})
    result = compare(tmp_path / "t", golden)
    assert result.environment_diff == [{"key": "device", "target": "npu", "golden": "cpu"}]


def test_compare_pair_takes_opened_dumps(golden, tmp_path):
    cnn_run(tmp_path / "t", faults=[("Functional.relu", 2, 1.001)])
    result = compare_pair(discover(tmp_path / "t")[0], discover(golden)[0])
    assert result.first_divergence.name == "Functional.relu.2.forward"


def test_opdiff_compare_is_the_public_entry(golden, tmp_path):
    cnn_run(tmp_path / "t")
    result = opdiff.compare(tmp_path / "t", golden, output_path=tmp_path / "out")
    assert result.first_divergence is None and result.counts["error"] == 0
    assert Path(result.files["csv"]).name.startswith("compare_result_")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["first_divergence"] is None and summary["counts"] == result.counts


def test_bad_inputs_raise_dump_errors(golden, tmp_path):
    with pytest.raises(DumpError, match="no such file"):
        compare(tmp_path / "missing", golden)
    empty = tmp_path / "empty" / "step0" / "rank0"
    empty.mkdir(parents=True)
    (empty / "records.jsonl").write_text("")
    with pytest.raises(DumpError, match="no op records"):
        compare(empty, golden)
    corrupt = tmp_path / "corrupt" / "step0" / "rank0"
    corrupt.mkdir(parents=True)
    (corrupt / "records.jsonl").write_text("{not json\n{\"name\": 1}\n")
    with pytest.raises(DumpError):
        compare(corrupt, golden)


def test_different_models_are_refused(golden, tmp_path):
    rec = Recorder(tmp_path / "t")
    x = torch.randn(3, 5)
    for _ in range(8):
        x = rec.call("Torch.tanh", torch.tanh, x)
    rec.close()
    with pytest.raises(DumpError, match="different models"):
        compare(tmp_path / "t", golden)


def test_fail_on(golden, tmp_path):
    cnn_run(tmp_path / "t", faults=[("Functional.relu", 2, 1.001)])
    assert compare(tmp_path / "t", golden, fail_on="divergence").failed
    assert not compare(tmp_path / "t", golden).failed
    cnn_run(tmp_path / "h")
    assert not compare(tmp_path / "h", golden, fail_on="divergence").failed


def test_several_ranks_compare_in_parallel_and_name_the_rank(tmp_path):
    for rank in (0, 1):
        cnn_run(tmp_path / "g" / "step0" / f"rank{rank}", seed=rank)
        faults = [("Functional.conv2d", 2, 1.001)] if rank == 1 else []
        cnn_run(tmp_path / "t" / "step0" / f"rank{rank}", seed=rank, faults=faults)
    result = compare(tmp_path / "t", tmp_path / "g")
    fd = result.first_divergence
    assert fd.name == "Functional.conv2d.2.forward" and (fd.step, fd.rank) == (0, 1)
    assert [(p["rank"], p["first_divergence"] and p["first_divergence"].name)
            for p in result.pairs] == [(0, None), (1, "Functional.conv2d.2.forward")]
    assert {r.rank for r in result.rows} == {0, 1}


def _setitem_run(path, value: float, task: str, extra_call: bool = False):
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    with opdiff.dump(lin, path, level="L1", task=task):
        if extra_call:          # one more __setitem__ first: the counters differ between runs
            torch.zeros(3)[0] = 1.0
        h = lin(x).clone()
        h[0] = value            # the only difference between the two runs
        torch.relu(h).sum().backward()


@pytest.mark.parametrize("task", ["statistics", "tensor"])
@pytest.mark.parametrize("value,shown", [(2.0, "2 vs 1"), (float("inf"), "inf vs 1"),
                                         (float("nan"), "nan vs 1")])
def test_differing_number_argument_is_named_as_the_cause(tmp_path, task, value, shown):
    # Replay re-runs __setitem__ on the target's own arguments and finds no error of its own:
    # that must not clear the op, whose inputs differ through a Python number.
    _setitem_run(tmp_path / "t", value, task)
    _setitem_run(tmp_path / "g", 1.0, task)
    fd = compare(tmp_path / "t", tmp_path / "g").first_divergence
    assert fd is not None and fd.name == "Tensor.__setitem__.0.forward"
    assert f"number arguments differ (input.2: {shown})" in fd.reason
    assert "local error in this op" not in fd.reason


def test_number_arguments_are_matched_when_the_call_counters_differ(tmp_path):
    _setitem_run(tmp_path / "t", 2.0, "tensor", extra_call=True)
    _setitem_run(tmp_path / "g", 1.0, "tensor")
    fd = compare(tmp_path / "t", tmp_path / "g").first_divergence
    assert fd is not None and fd.name == "Tensor.__setitem__.1.forward"
    assert "number arguments differ (input.2: 2 vs 1)" in fd.reason


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_dtype_limits_as_arguments_are_no_difference(tmp_path, task):
    # The attention mask fills with torch.finfo(dtype).min: -65504 in fp16, -3.4e38 in fp32, on
    # purpose and with the same effect after softmax. masked_fill's output differs by 1e38 where
    # it wrote them: it is not named, with or without replay.
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x):
            scores = self.q(x) @ self.k(x).transpose(-1, -2)
            mask = torch.ones(8, 8, dtype=torch.bool).triu(1)
            return scores.masked_fill(mask, torch.finfo(scores.dtype).min).softmax(-1)

    def run(path, dtype):
        torch.manual_seed(0)
        model, x, w = Attention().to(dtype), torch.randn(2, 8, 16).to(dtype), torch.randn(8, 8)
        with opdiff.dump(model, path, level="mix", task=task):
            (model(x) * w.to(dtype)).sum().backward()

    run(tmp_path / "t", torch.float16)
    run(tmp_path / "g", torch.float32)
    result = compare(tmp_path / "t", tmp_path / "g")
    fd = result.first_divergence
    assert fd is None or "masked_fill" not in fd.name, fd.reason
    if task == "tensor":    # (statistics alone cannot clear the fp16 noise of tiny gradients)
        assert fd is None, fd.reason
    fill = next(r for r in result.rows if r.target_name == "Tensor.masked_fill.0.forward.output.0")
    assert "dtype limits it was given (input.2: -65504 vs -3.4028235e+38)" in fill.reason


def test_differing_epsilons_are_reported_and_dtype_limits_set_apart():
    from opdiff.comparison.blame import differing_numbers

    def rec(*values, **kwargs):
        return complete({"name": "Torch.op.0.forward", "inputs": [{"type": "float", "value": v} for v in values],
                         "kwargs": {k: {"type": "float", "value": v} for k, v in kwargs.items()}})
    f16, f32 = torch.finfo(torch.float16), torch.finfo(torch.float32)
    differ, limits = differing_numbers(rec(f16.eps, f16.min, 0.5, eps=f16.eps),
                                       rec(f32.eps, f32.min, 0.5 + 1e-8, eps=f32.eps))
    assert differ == ["input.0: 0.0009765625 vs 1.1920929e-07",
                      "input.eps: 0.0009765625 vs 1.1920929e-07"]
    assert limits == ["input.1: -65504 vs -3.4028235e+38"]
    assert differing_numbers(rec(float("inf")), rec(float("-inf")))[0] == ["input.0: inf vs -inf"]


def test_equal_number_arguments_say_nothing(tmp_path):
    _setitem_run(tmp_path / "t", 1.0, "tensor")
    _setitem_run(tmp_path / "g", 1.0, "tensor")
    result = compare(tmp_path / "t", tmp_path / "g")
    assert result.first_divergence is None and result.counts["error"] == 0


def _hand_dump(path, empty_desc: dict):
    from opdiff.store import DumpWriter

    w = DumpWriter(path, {"environment": {}})
    t = {"type": "tensor", "dtype": "float32", "shape": [2],
         "stats": {"max": 1.0, "min": 0.0, "mean": 0.5, "norm": 1.0, "nan": 0, "inf": 0}}
    w.write({"seq": 0, "name": "Torch.relu.0.forward", "op": "Torch.relu", "kind": "api",
             "phase": "forward", "inputs": [t], "outputs": [t]})
    w.write({"seq": 1, "name": "Torch.nonzero.0.forward", "op": "Torch.nonzero", "kind": "api",
             "phase": "forward", "inputs": [t], "outputs": [empty_desc]})
    w.close()


@pytest.mark.parametrize("empty", [
    {"type": "tensor", "dtype": "int64", "shape": [0, 1]},              # as capture writes it
    {"type": "tensor", "dtype": "float32", "shape": [0], "stats": {}},
])
def test_empty_tensors_pass_and_say_there_is_nothing_to_compare(tmp_path, empty):
    _hand_dump(tmp_path / "t", empty)
    _hand_dump(tmp_path / "g", empty)
    result = compare_pair(discover(tmp_path / "t")[0], discover(tmp_path / "g")[0])
    (row,) = [r for r in result.rows if r.op_name == "Torch.nonzero.0.forward" and r.role == "output"]
    assert row.result == "pass" and "nothing to compare" in row.reason
    assert result.counts["warning"] == 0 and result.first_divergence is None
