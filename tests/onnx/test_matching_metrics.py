"""Matching rules on hand-built graphs, msit's metric formulas, and the shared engine reading our dumps."""
import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from opdiff.comparison.result import ERROR, PASS, WARNING
from opdiff.onnx import compare_models
from opdiff.onnx.matching import RULE_BATCHNORM
from opdiff.onnx.msit_csv import msit_values
from opdiff.onnx.policy import MsitPolicy


def msit(t, g) -> dict:
    """msit's columns of one pair, as the msit CSV shows them (the shared metrics' values)."""
    m, _ = MsitPolicy().judge_arrays(t, g)
    return msit_values({**m.metrics, **m.extra})


def verdict(t, g):
    return MsitPolicy().judge_arrays(t, g)[1]


def conv_bn_relu(tmp_path):
    """Golden: Conv -> BatchNormalization -> Relu. Target: BN folded into the Conv's weights,
    the Conv output keeping its old name, as graph optimisers do."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    scale, bias = rng.uniform(0.5, 2, 4).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    mean, var = rng.standard_normal(4).astype(np.float32), rng.uniform(0.5, 2, 4).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    init = lambda a, n: onnx.numpy_helper.from_array(a, n)   # noqa: E731
    golden = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["conv_out"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["conv_out", "s", "bb", "m", "v"], ["bn_out"], name="bn"),
         helper.make_node("Relu", ["bn_out"], ["y"], name="relu")],
        "g", [x], [y], [init(w, "w"), init(b, "b"), init(scale, "s"), init(bias, "bb"), init(mean, "m"),
                        init(var, "v")])
    k = scale / np.sqrt(var + 1e-5)
    wf, bf = (w * k[:, None, None, None]).astype(np.float32), ((b - mean) * k + bias).astype(np.float32)
    target = helper.make_graph(
        [helper.make_node("Conv", ["x", "wf", "bf"], ["conv_out"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["conv_out"], ["y"], name="relu")],
        "t", [x], [y], [init(wf, "wf"), init(bf, "bf")])
    paths = []
    for g, name in ((golden, "golden.onnx"), (target, "target.onnx")):
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / name))
        paths.append(tmp_path / name)
    return paths


def test_batchnorm_folded_into_conv_is_compared_after_the_batchnorm(tmp_path):
    golden, target = conv_bn_relu(tmp_path)
    cmp = compare_models(golden, target)
    pairs = {p.golden: p for p in cmp.matching.pairs}
    assert pairs["bn_out"].target == "conv_out" and pairs["bn_out"].rule == RULE_BATCHNORM
    assert "conv_out" not in pairs               # same name, different meaning: never paired
    assert "BatchNorm" in dict(cmp.matching.unmatched_golden)["conv_out"]
    assert cmp.first_divergence is None and cmp.result.counts["error"] == 0


def test_msit_formulas_on_known_values():
    g = np.array([1.0, 2.0, 3.0, 4.0])
    t = np.array([1.0, 2.0, 3.0, 5.0])
    m = msit(t, g)
    assert m["CosineSimilarity"] == pytest.approx(np.dot(t, g) / np.linalg.norm(t) / np.linalg.norm(g))
    assert m["RelativeEuclideanDistance"] == pytest.approx(1 / math.sqrt(30))
    assert m["RootMeanSquareError"] == pytest.approx(0.5)
    assert m["MeanRelativeError"] == pytest.approx(0.25 / 4)
    assert m["MaxAbsoluteError"] == 1.0 and m["MeanAbsoluteError"] == 0.25
    # KL is shift- and scale-invariant (min-max scaled), as in msaccucmp
    assert msit(g * 3 + 7, g)["KullbackLeiblerDivergence"] == pytest.approx(0, abs=1e-12)
    assert verdict(t, g).result == ERROR     # RED 0.18 >= 0.05


def test_inf_and_nan_are_hard_failures():
    g = np.linspace(1, 2, 100, dtype=np.float32)
    t = g.copy()
    t[7] = np.nan
    v = verdict(t, g)
    assert v.result == ERROR and "inf/NaN" in v.reason
    # msit would call this "not an error": cosine NaN because one side is all zeros
    assert verdict(np.zeros(10), np.ones(10)).result == ERROR
    # the same inf at the same place on both sides: inherited, a warning
    both = g.copy()
    both[3] = np.inf
    assert verdict(both, both).result == WARNING
    # integers must be equal
    assert verdict(np.array([1, 2, 3]), np.array([1, 2, 4])).result == ERROR
    assert verdict(np.array([1, 2, 3]), np.array([1, 2, 3])).result == PASS


def test_the_shared_engine_reads_onnx_dumps_and_agrees(models, tmp_path):
    from opdiff.comparison.pair import compare_pair
    from opdiff.onnx.policy import MsitPolicy
    from opdiff.store import open_dump

    cmp = compare_models(models["cnn_big"], models["cnn_big_fp16"], output_path=tmp_path / "out")
    shared = compare_pair(open_dump(cmp.dumps["target"]), open_dump(cmp.dumps["golden"]), policy=MsitPolicy())
    assert shared.first_divergence is not None
    assert shared.first_divergence.name == cmp.first_divergence.name == "/fc1/Gemm"
