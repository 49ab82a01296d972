"""One metric specification: `opdiff onnx` shows the numbers a dump compare of the same tensors shows.

Issue 18's bug: MaxRelativeErr had two formulas under one name. On t=[1,0,2,3], g=[1,1e-12,2,3]
msprobe's definition (the dump compare's) gives 1.0 and opdiff onnx's private one
(|d| / (|g| + 1e-10)) gave 0.0099, in the same column of the same report.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from opdiff.cli import main
from opdiff.comparison.result import PASS

TARGET = np.array([1.0, 0.0, 2.0, 3.0], np.float32)
GOLDEN = np.array([1.0, 1e-12, 2.0, 3.0], np.float32)


def add_model(path, offset):
    """y = x + offset, offset an initializer: fed x = TARGET, y is TARGET or GOLDEN exactly."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    c = onnx.numpy_helper.from_array(np.asarray(offset, np.float32), "c")
    graph = helper.make_graph([helper.make_node("Add", ["x", "c"], ["y"], name="add")], "g", [x], [y], [c])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


@pytest.fixture
def pair(tmp_path):
    golden = add_model(tmp_path / "golden.onnx", GOLDEN - TARGET)
    target = add_model(tmp_path / "target.onnx", np.zeros(4))
    np.save(tmp_path / "x.npy", TARGET)
    return golden, target, tmp_path / "x.npy"


def test_max_relative_err_is_msprobe_s_in_opdiff_onnx(pair, tmp_path):
    from opdiff.onnx import compare_models

    golden, target, x = pair
    cmp = compare_models(golden, target, inputs=str(x), output_path=tmp_path / "api")
    y = next(r for r in cmp.result.rows if r.golden_name == "y")
    assert y.result == PASS                     # msit's five thresholds all hold
    assert y.metrics["MaxRelativeErr"] == pytest.approx(1.0)      # not 0.0099
    assert y.metrics["MeanRelativeErr"] == pytest.approx(0.25)


def test_opdiff_onnx_and_the_dump_compare_show_one_number(pair, tmp_path):
    """Through the CLI: the rows its shared writers wrote, against a dump compare of its dumps."""
    from opdiff.comparison.pair import compare_pair
    from opdiff.onnx.policy import MsitPolicy
    from opdiff.report.summary import load_summary
    from opdiff.store import open_dump

    golden, target, x = pair
    out = tmp_path / "out"
    assert main(["onnx", str(target), str(golden), "-i", str(x), "-o", str(out)]) == 0
    shown = {r.golden_name: r.metrics for r in load_summary(out).rows}
    assert shown["y"]["MaxRelativeErr"] == pytest.approx(1.0)
    dump = next(out.glob("onnx_dump_*"))
    shared = compare_pair(open_dump(dump / "target" / "step0" / "rank0"),
                          open_dump(dump / "golden" / "step0" / "rank0"), policy=MsitPolicy())
    dumped = next(r for r in shared.rows if r.target_name == "add.output.0")     # y, as dumped
    assert dumped.metrics["MaxRelativeErr"] == pytest.approx(1.0)
    for name, value in dumped.metrics.items():            # every metric, not only the one
        assert shown["y"][name] == pytest.approx(value, nan_ok=True), name
