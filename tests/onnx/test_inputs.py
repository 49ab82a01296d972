"""Input files and random inputs: formats, dynamic dims, batch fitting, errors, integer ranges."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from opdiff.errors import OpdiffError
from opdiff.onnx.inputs import parse_input_shapes, prepare_inputs


def two_input_model(batch="N"):
    """y = x * 2 (float, dims [batch, 4]) and ids -> Gather from a 10-row table."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [batch, 3])
    table = onnx.numpy_helper.from_array(np.arange(20, dtype=np.float32).reshape(10, 2), "table")
    two = onnx.numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    nodes = [helper.make_node("Mul", ["x", "two"], ["y"], name="mul"),
             helper.make_node("Gather", ["table", "ids"], ["emb"], name="gather")]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("emb", TensorProto.FLOAT, None)]
    return helper.make_model(helper.make_graph(nodes, "g", [x, ids], outs, [table, two]),
                             opset_imports=[helper.make_opsetid("", 17)])


def test_npy_and_bin_with_dynamic_batch_taken_from_data(tmp_path):
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    ids = np.array([[1, 2, 3]] * 3, dtype=np.int64)
    np.save(tmp_path / "x.npy", x)
    ids.tofile(tmp_path / "ids.bin")          # raw: dtype and per-sample shape come from the model
    p = prepare_inputs(two_input_model(), f"{tmp_path / 'x.npy'},{tmp_path / 'ids.bin'}")
    assert np.array_equal(p.feeds["x"], x)
    assert np.array_equal(p.feeds["ids"], ids)
    assert p.sources["ids"].endswith("ids.bin")
    assert any("N=3 taken from" in n for n in p.notes)


def test_npz_by_input_name(tmp_path):
    x = np.ones((2, 4), np.float32)
    np.savez(tmp_path / "all.npz", ids=np.zeros((2, 3), np.int64), x=x)
    p = prepare_inputs(two_input_model(), str(tmp_path / "all.npz"))
    assert p.feeds["x"].shape == (2, 4) and p.feeds["ids"].dtype == np.int64


def test_fixed_batch_is_cut_or_repeated_and_said(tmp_path):
    model = two_input_model(batch=4)
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "ids.npy", np.zeros((1, 3), np.int64))
    p = prepare_inputs(model, [tmp_path / "x.npy", tmp_path / "ids.npy"])
    assert np.array_equal(p.feeds["x"], x[:4])
    assert p.feeds["ids"].shape == (4, 3)
    assert any("used the first 4" in n for n in p.notes)
    assert any("repeated" in n for n in p.notes)


def test_input_shape_option_gives_a_bin_its_shape(tmp_path):
    model = two_input_model(batch="N")
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "F"   # x: [N, F]
    np.arange(8, dtype=np.float32).tofile(tmp_path / "x.bin")
    np.zeros(6, np.int64).tofile(tmp_path / "ids.bin")
    with pytest.raises(OpdiffError, match="--input-shape"):
        prepare_inputs(model, f"{tmp_path / 'x.bin'},{tmp_path / 'ids.bin'}")
    p = prepare_inputs(model, f"{tmp_path / 'x.bin'},{tmp_path / 'ids.bin'}",
                       input_shapes=parse_input_shapes("x:2,4"))
    assert p.feeds["x"].shape == (2, 4) and p.feeds["ids"].shape == (2, 3)


def test_random_inputs_are_seeded_and_integers_stay_in_range():
    model = two_input_model()
    a = prepare_inputs(model, None, seed=5, input_shapes={"ids": (64, 3)})
    b = prepare_inputs(model, None, seed=5, input_shapes={"ids": (64, 3)})
    c = prepare_inputs(model, None, seed=6, input_shapes={"ids": (64, 3)})
    assert np.array_equal(a.feeds["x"], b.feeds["x"]) and not np.array_equal(a.feeds["x"], c.feeds["x"])
    ids = a.feeds["ids"]
    assert ids.min() >= 0 and ids.max() < 10 and ids.max() > 2    # the Gather table has 10 rows
    assert a.feeds["x"].shape == (1, 4)                            # dynamic dim set to 1, and said
    assert any("set to 1" in n for n in a.notes)


@pytest.mark.parametrize("problem, match", [
    ("count", "2 model input"), ("dtype", "save the data as"), ("binsize", "whole samples"),
    ("missing", "does not exist"), ("suffix", "use .npy"), ("shape", "expects")])
def test_bad_inputs_say_what_to_do(tmp_path, problem, match):
    model = two_input_model(batch=2)
    x, ids = tmp_path / "x.npy", tmp_path / "ids.npy"
    np.save(x, np.zeros((2, 4), np.float32))
    np.save(ids, np.zeros((2, 3), np.int64))
    files = [x, ids]
    if problem == "count":
        files = [x]
    elif problem == "dtype":
        np.save(ids, np.zeros((2, 3), np.float32))
    elif problem == "binsize":
        np.zeros(5, np.int64).tofile(tmp_path / "ids.bin")
        files = [x, tmp_path / "ids.bin"]
    elif problem == "missing":
        files = [x, tmp_path / "nope.npy"]
    elif problem == "suffix":
        (tmp_path / "ids.txt").write_text("1 2 3")
        files = [x, tmp_path / "ids.txt"]
    elif problem == "shape":
        np.save(x, np.zeros((2, 5), np.float32))
    with pytest.raises(OpdiffError, match=match) as info:
        prepare_inputs(model, files)
    assert "\n" not in str(info.value)


def test_bad_input_shape_text():
    with pytest.raises(OpdiffError, match="NAME:D0"):
        parse_input_shapes("x=1,2")
    assert parse_input_shapes("a:1,3;b:2") == {"a": (1, 3), "b": (2,)}
