"""msit's absolute RMSE < 1.0 is judged against the dtype: healthy fp16 rounding of large
activations (cosine 1.000000) is no error, a real fault on the same values still is."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opdiff.comparison.result import ERROR, PASS, UNMATCHED, WARNING
from opdiff.onnx import compare_models
from opdiff.onnx.policy import MsitPolicy, MsitThresholds

BIG = np.random.default_rng(0).normal(0.0, 5000.0, 4096).astype(np.float32)


def test_fp16_rounding_of_large_values_warns_instead_of_failing():
    m, verdict = MsitPolicy().judge_arrays(BIG.astype(np.float16), BIG)
    assert m.metrics["RMSE"] > 1.0 and m.metrics["Cosine"] == 1.0     # msit's columns unchanged
    assert verdict.result == WARNING and "rounding of large values" in verdict.reason


def test_msit_exact_rule_on_request():
    _, verdict = MsitPolicy(MsitThresholds(dtype_aware=False)).judge_arrays(
        BIG.astype(np.float16), BIG)
    assert verdict.result == ERROR and verdict.reason.startswith("RMSE")


@pytest.mark.parametrize("fault", [1.01, -1.0])
def test_a_real_error_on_large_values_is_still_an_error(fault):
    _, verdict = MsitPolicy().judge_arrays((BIG * fault).astype(np.float16), BIG)
    assert verdict.result == ERROR


def test_small_values_still_pass():
    small = BIG / 5000
    assert MsitPolicy().judge_arrays(small.astype(np.float16), small)[1].result == PASS


def _scaling_model(path, scale=16000.0):
    """y = relu(x * scale) @ W: large activations, built here (no export)."""
    w = np.random.default_rng(1).normal(0, 0.05, (64, 64)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["big"], name="scale"),
         helper.make_node("Relu", ["big"], ["act"], name="relu"),
         helper.make_node("MatMul", ["act", "w"], ["y"], name="proj")],
        "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(np.array(scale, np.float32), "s"), numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_fp16_model_of_large_activations_has_no_false_error(tmp_path):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    fp32 = _scaling_model(tmp_path / "big.onnx")
    onnx.save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True),
              str(tmp_path / "big16.onnx"))
    cmp = compare_models(fp32, tmp_path / "big16.onnx")
    rows = [r for r in cmp.result.rows if r.result != UNMATCHED]
    assert any(r.metrics.get("RMSE") and r.metrics["RMSE"] > 1.0 for r in rows), \
        [(r.golden_name, r.metrics.get("RMSE")) for r in rows]
    assert cmp.result.counts["error"] == 0 and cmp.first_divergence is None, \
        [(r.golden_name, r.reason) for r in rows if r.result == ERROR]


def _two_layers(path, w2):
    """y = relu(x @ w1) @ w2, built here."""
    w1 = np.random.default_rng(2).normal(0, 0.3, (16, 16)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
         helper.make_node("Relu", ["h"], ["a"], name="act"),
         helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2")],
        "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_differing_initializer_is_the_origin_not_the_node_reading_it(tmp_path):
    w2 = np.random.default_rng(3).normal(0, 0.3, (16, 16)).astype(np.float32)
    reinit = np.random.default_rng(4).normal(0, 0.3, (16, 16)).astype(np.float32)
    cmp = compare_models(_two_layers(tmp_path / "g.onnx", w2), _two_layers(tmp_path / "t.onnx", reinit))
    d = cmp.first_divergence
    assert d is not None and d.tensor == "w2" and d.name == "fc2", d
    assert "initializer w2 differs before any node reads it" in d.reason
    assert getattr(d, "origin", "parameter") == "parameter"
    assert cmp.local_check is None        # the node is not run alone: it is not to blame


def test_a_node_without_golden_inputs_is_not_called_its_own_culprit(tmp_path):
    from opdiff.onnx.graph import GraphIndex
    from opdiff.onnx.locate import check_node_locally
    from opdiff.onnx.runner import RuntimeOptions, load_model, run_model

    w2 = np.random.default_rng(3).normal(0, 0.3, (16, 16)).astype(np.float32)
    path = _two_layers(tmp_path / "t.onnx", w2)
    model = load_model(path)
    feeds = {"x": np.random.default_rng(0).normal(size=(1, 16)).astype(np.float32)}
    run = run_model(model, path, feeds, RuntimeOptions())
    wrong_golden = run.tensors["y"] * 1.5 + 1.0       # the golden's y: differs from the target's
    check = check_node_locally(model, GraphIndex(model), "y", {}, wrong_golden, run.tensors,
                               RuntimeOptions(), MsitPolicy())
    assert check.local_error is None and check.fed_from_target == ["a"]
    assert "could not be checked alone" in check.sentence
    assert "made by this node itself" not in check.sentence
