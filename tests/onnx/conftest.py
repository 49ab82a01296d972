"""Small real models exported in the test session: fp32, fp16, QDQ and an fp16 overflow variant."""
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import tiny_models  # noqa: E402
from tiny_models import FP16_MAX, export_ts  # noqa: E402,F401

@pytest.fixture(scope="session")
def models(tmp_path_factory):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.transformers.float16 import convert_float_to_float16

    d = tmp_path_factory.mktemp("models")
    fp32 = export_ts(tiny_models.build_model(), d / "cnn.onnx")
    model = onnx.load(str(fp32))
    onnx.save(convert_float_to_float16(model, keep_io_types=True), str(d / "cnn_fp16.onnx"))

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.data = iter([{"input": rng.uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)}
                              for _ in range(8)])

        def get_next(self):
            return next(self.data, None)

    quantize_static(str(fp32), str(d / "cnn_qdq.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True)

    # fc1 scaled so its weights still fit fp16 but its output does not.
    big = onnx.load(str(fp32))
    for init in big.graph.initializer:
        if init.name in ("fc1.weight", "fc1.bias"):
            w = onnx.numpy_helper.to_array(init)
            w = w * (30000.0 / np.abs(w).max()) if init.name == "fc1.weight" else np.sign(w) * 60000.0
            init.CopyFrom(onnx.numpy_helper.from_array(w.astype(np.float32), init.name))
    onnx.save(big, str(d / "cnn_big.onnx"))
    onnx.save(convert_float_to_float16(big, keep_io_types=True), str(d / "cnn_big_fp16.onnx"))
    return {k: d / f"{k}.onnx" for k in ("cnn", "cnn_fp16", "cnn_qdq", "cnn_big", "cnn_big_fp16")}


@pytest.fixture
def image(tmp_path):
    """A real input file in its own folder (the tests check nothing is written next to it)."""
    folder = tmp_path / "inputs"
    folder.mkdir()
    x = np.random.default_rng(3).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)
    np.save(folder / "input_0.npy", x)
    return folder / "input_0.npy"
