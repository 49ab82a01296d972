"""ONNX vs ONNX on real exported models: fp16, fp16 overflow, QDQ, ORT optimisation levels."""
import csv
import json
import time

import numpy as np
import onnx

from tiny_models import FP16_MAX
from opdiff.comparison.result import ERROR, LOCAL, NONFINITE, PASS, UNMATCHED, WARNING
from opdiff.onnx import RuntimeOptions, compare_models
from opdiff.onnx.matching import RULE_DEQUANTIZED, RULE_FOLDED_ACTIVATION
from opdiff.store import open_dump


def rows_by_golden(cmp):
    return {r.golden_name: r for r in cmp.result.rows if r.result != UNMATCHED}


def test_fp32_vs_fp16_has_no_false_failure(models, image, tmp_path):
    cmp = compare_models(models["cnn"], models["cnn_fp16"], inputs=str(image), output_path=tmp_path / "out")
    assert cmp.first_divergence is None
    assert cmp.result.counts["error"] == 0
    rows = rows_by_golden(cmp)
    # fp16 really ran: the target's intermediates and weights are fp16, compared with fp32 ones
    assert rows["/fc1/Gemm_output_0"].target_dtype == "float16"
    assert rows["/fc1/Gemm_output_0"].golden_dtype == "float32"
    assert rows["fc1.weight"].target_dtype == "float16"       # initializers of every dtype
    assert 0 < rows["/fc2/Gemm_output_0"].metrics["MaxAbsErr"] < 1e-2
    # the converter's Casts have no golden counterpart and are reported, not silently dropped
    unmatched = dict(cmp.matching.unmatched_target)
    assert "graph_input_cast_0" in unmatched


def test_fp16_overflowing_gemm_is_the_first_failing_node(models, tmp_path):
    cmp = compare_models(models["cnn_big"], models["cnn_big_fp16"], output_path=tmp_path / "out")
    rows = rows_by_golden(cmp)
    golden_gemm = rows["/fc1/Gemm_output_0"]
    assert golden_gemm.golden_stats["max"] > FP16_MAX or golden_gemm.golden_stats["min"] < -FP16_MAX
    d = cmp.first_divergence
    assert d is not None and d.name == "/fc1/Gemm" and d.op == "Gemm"
    assert d.module == "fc1"                          # from the TorchScript exporter's scope
    assert "inf/NaN" in d.reason and d.kind == NONFINITE
    # everything before the Gemm agrees; NaN downstream is an error, not msit's "NO"
    assert rows["/Flatten_output_0"].result == PASS
    assert rows["/gelu/Mul_output_0"].result == ERROR
    # a finite row beside it is fp16 rounding of large values (RMSE > 1 at cosine 1.0): a warning
    assert rows["/gelu/Div_output_0"].result == WARNING
    assert "rounding of large values" in rows["/gelu/Div_output_0"].reason
    # run alone on the golden's inputs, the Gemm still overflows: a local error
    assert cmp.local_check is not None and cmp.local_check.local_error is True
    assert "made by this node itself" in d.reason
    # the msit CSV says the same
    csv_path = next((tmp_path / "out").glob("result_*.csv"))
    with open(csv_path) as f:
        table = list(csv.reader(f))
    header, body = table[0], table[1:]
    assert header[:8] == ["Index", "OpType", "NPUDump", "DataType", "GroundTruth", "DataType",
                          "TensorIndex", "Shape"]
    flag = header.index("IsPrecisionError")
    first = next(r for r in body if r[flag] == "YES" and r[header.index("OpType")] not in ("Initializer",))
    assert first[header.index("GroundTruth")] == "/fc1/Gemm"
    out_col = header.index("IsOutputNode")
    assert [r[header.index("TargetTensor")] for r in body if r[out_col] == "YES"] == ["probs"]


def test_local_check_tells_inherited_error_apart(models, tmp_path):
    """Target = golden with fc1's weight scaled by 1.5: the weight is the origin (not the Gemm that
    reads it); the GELU after it only inherits."""
    m = onnx.load(str(models["cnn"]))
    for init in m.graph.initializer:
        if init.name == "fc1.weight":
            w = onnx.numpy_helper.to_array(init) * 1.5
            init.CopyFrom(onnx.numpy_helper.from_array(w.astype(np.float32), init.name))
    path = tmp_path / "scaled.onnx"
    onnx.save(m, str(path))
    cmp = compare_models(models["cnn"], path)
    d = cmp.first_divergence
    assert d.name == "/fc1/Gemm" and d.tensor == "fc1.weight"
    assert "initializer fc1.weight differs before any node reads it" in d.reason
    assert getattr(d, "origin", "parameter") == "parameter" and d.kind != LOCAL
    assert cmp.local_check is None          # the Gemm is not run alone: it is not to blame
    from opdiff.onnx.graph import GraphIndex
    from opdiff.onnx.locate import check_node_locally
    from opdiff.onnx.policy import MsitPolicy
    from opdiff.onnx.runner import run_model, load_model

    feeds = {"input": np.random.default_rng(0).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)}
    golden = run_model(load_model(models["cnn"]), models["cnn"], feeds, RuntimeOptions())
    target_model = load_model(path)
    target = run_model(target_model, path, feeds, RuntimeOptions())
    t = GraphIndex(target_model)
    # GELU's Div reads fc1's (wrong) output; fed the golden's value it agrees: inherited error
    check = check_node_locally(target_model, t, "/gelu/Div_output_0",
                               {"/fc1/Gemm_output_0": golden.tensors["/fc1/Gemm_output_0"]},
                               golden.tensors["/gelu/Div_output_0"], target.tensors, RuntimeOptions(),
                               MsitPolicy())
    assert check.local_error is False and "inherits" in check.sentence
    assert not target.tensors["/gelu/Div_output_0"].tolist() == golden.tensors["/gelu/Div_output_0"].tolist()


def test_qdq_tensors_match_across_quantizer_renames(models, image):
    cmp = compare_models(models["cnn"], models["cnn_qdq"], inputs=str(image))
    assert cmp.first_divergence is None, cmp.first_divergence
    assert cmp.result.counts["error"] == 0
    pairs = {p.golden: p for p in cmp.matching.pairs}
    # the quantizer removed the ReLU and gave its name to the Conv output (pre-activation):
    relu = pairs["/stem/act/Relu_output_0"]
    assert relu.target == "/stem/act/Relu_output_0_DequantizeLinear_Output"
    assert relu.rule == RULE_FOLDED_ACTIVATION
    assert pairs["fc1.weight"].target == "fc1.weight_DequantizeLinear_Output"   # dequantized weights
    assert pairs["/fc2/Gemm_output_0"].rule == RULE_DEQUANTIZED
    unmatched_target = dict(cmp.matching.unmatched_target)
    assert "pre-activation" in unmatched_target["/stem/act/Relu_output_0"]
    assert "/stem/conv/Conv_output_0" in dict(cmp.matching.unmatched_golden)
    # the same-name tensor really is different: pairing by name alone would be a false failure
    from opdiff.onnx.policy import MsitPolicy
    from opdiff.onnx.runner import load_model, run_model

    feeds = {"input": np.load(image)}
    g = run_model(load_model(models["cnn"]), models["cnn"], feeds, RuntimeOptions())
    t = run_model(load_model(models["cnn_qdq"]), models["cnn_qdq"], feeds, RuntimeOptions())
    _, naive = MsitPolicy().judge_arrays(t.tensors["/stem/act/Relu_output_0"],
                                         g.tensors["/stem/act/Relu_output_0"])
    assert naive.result == ERROR
    rows = rows_by_golden(cmp)
    assert rows["/stem/act/Relu_output_0"].metrics["Cosine"] > 0.99


def test_same_model_two_optimization_levels(models, tmp_path):
    cmp = compare_models(models["cnn"], models["cnn"], output_path=tmp_path / "out",
                         golden_options=RuntimeOptions(optimization="disable_all"),
                         target_options=RuntimeOptions(optimization="all"))
    assert cmp.first_divergence is None
    assert cmp.result.counts["unmatched"] == 0
    assert len(cmp.matching.pairs) == cmp.result.counts["pass"] + cmp.result.counts["warning"]
    assert "optimization=disable_all" in cmp.result.golden
    details = json.loads((tmp_path / "out" / "onnx_details.json").read_text())
    assert details["observer"]["golden"]["changed"] is False


def test_observer_check_reports_a_changed_fp16_output(models):
    # On the CPU EP, exposing fp16 intermediates rounds values that stay fp32 inside fused casts.
    cmp = compare_models(models["cnn"], models["cnn_fp16"])
    obs = cmp.observer["target"]
    assert obs.changed and "probs" in obs.details[0]
    assert cmp.observer["golden"].changed is False


def test_dumps_are_in_the_store_format(models, tmp_path):
    cmp = compare_models(models["cnn"], models["cnn_fp16"], output_path=tmp_path / "out")
    dump = open_dump(cmp.dumps["target"])
    records = list(dump.records())
    assert records[0]["op"] == "Input" and [r["seq"] for r in records] == list(range(len(records)))
    assert all(r["kind"] == "node" for r in records)
    ops = [r["op"] for r in records]
    # topological order even though the converter appended its output Cast last in the file
    assert ops.index("Softmax") < ops.index("Cast", ops.index("Softmax")) or ops[-1] == "Cast"
    softmax = next(r for r in records if r["op"] == "Softmax")
    cast = next(r for r in records if r["outputs"][0]["tensor"] == "probs")
    assert softmax["seq"] < cast["seq"]
    conv = next(r for r in records if r["name"] == "/stem/conv/Conv")
    weight = conv["inputs"][1]
    assert weight["dtype"] == "float16" and dump.tensor(weight["key"]).dtype.itemsize == 2
    out = conv["outputs"][0]
    saved = dump.tensor(out["key"]).float().numpy()
    assert np.isclose(saved.max(), out["stats"]["max"], rtol=1e-3)
    assert conv["module"] == "stem.conv"
    # the summary from the shared writers names the same first divergence (none here)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["first_divergence"] is None


def test_wall_time_of_a_small_cnn_pair(models, image):
    compare_models(models["cnn"], models["cnn_fp16"], inputs=str(image))   # warm imports
    start = time.perf_counter()
    cmp = compare_models(models["cnn"], models["cnn_fp16"], inputs=str(image))
    wall = time.perf_counter() - start
    print(f"\nfp32 vs fp16 small CNN: {wall:.3f} s wall, {len(cmp.matching.pairs)} tensors")
    assert wall < 3.0          # Polygraphy needs 6-10 s per comparison on this machine


def test_user_input_folder_is_left_alone(models, image, tmp_path):
    before = {p.name: p.stat().st_mtime_ns for p in image.parent.iterdir()}
    compare_models(models["cnn"], models["cnn_fp16"], inputs=str(image), output_path=tmp_path / "out")
    after = {p.name: p.stat().st_mtime_ns for p in image.parent.iterdir()}
    assert before == after


def test_second_run_never_appends_to_the_first_dump(models, tmp_path):
    out = tmp_path / "out"
    a = compare_models(models["cnn"], models["cnn_fp16"], output_path=out)
    n = len(list(open_dump(a.dumps["golden"]).records()))
    (out / "notes.txt").write_text("the user's own file")
    b = compare_models(models["cnn"], models["cnn_fp16"], output_path=out)
    assert n == len(list(open_dump(b.dumps["golden"]).records()))
    # what the first run wrote is gone (a stale dump or CSV would read as part of this result);
    # the user's file stays
    assert len(list(out.glob("onnx_dump_*"))) == 1 and len(list(out.glob("result_*.csv"))) == 1
    assert (out / "notes.txt").read_text() == "the user's own file"


def test_fp16_model_with_fp16_inputs_gets_cast_inputs(models, image, tmp_path):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    path = tmp_path / "cnn_fp16_io.onnx"
    onnx.save(convert_float_to_float16(onnx.load(str(models["cnn"])), keep_io_types=False), str(path))
    cmp = compare_models(models["cnn"], path, inputs=str(image))
    assert any("cast from float32 to float16 for the target" in n for n in cmp.input_notes)
    assert cmp.first_divergence is None
    rows = rows_by_golden(cmp)
    assert rows["probs"].target_dtype == "float16" and rows["probs"].result == PASS


def test_msit_csv_is_never_overwritten(models, tmp_path):
    from opdiff.onnx.model_compare import fresh_path

    (tmp_path / "result_x.csv").write_text("user data")
    assert fresh_path(tmp_path / "result_x.csv").name == "result_x_1.csv"
    assert (tmp_path / "result_x.csv").read_text() == "user data"
