"""Offline model compare: ONNX node by node, and a PyTorch model against its ONNX export.

    from opdiff.onnx import compare_models, compare_torch, RuntimeOptions
    cmp = compare_models("golden.onnx", "target.onnx", inputs="x.npy", output_path="./out")
    cmp = compare_models("m.onnx", "m.onnx", golden_options=RuntimeOptions(optimization="disable_all"))
    cmp = compare_torch("my_module.py:build_model", "m.onnx", output_path="./out")
    print(cmp.first_divergence)

Both sides are written as opdiff dumps and every tensor is judged by `MsitPolicy` (msit's five
thresholds) on the metrics `opdiff compare` computes, so `compare_pair(target_dump, golden_dump,
policy=MsitPolicy())` on the written dumps shows the same numbers.

Needs the `onnx` extra (`pip install 'opdiff[onnx]'`); without it every entry point raises an
OpdiffError that says so.
"""
from .deps import OnnxError
from .policy import MsitPolicy, MsitThresholds
from .runner import RuntimeOptions

__all__ = ["compare_models", "compare_torch", "RuntimeOptions", "MsitPolicy", "MsitThresholds",
           "OnnxError"]


def __getattr__(name):
    # numpy/onnx-heavy modules load on first use, so `opdiff --help` stays fast.
    if name == "compare_models":
        from .model_compare import compare_models
        return compare_models
    if name == "compare_torch":
        from .torch_side import compare_torch
        return compare_torch
    raise AttributeError(f"module 'opdiff.onnx' has no attribute {name!r}")
