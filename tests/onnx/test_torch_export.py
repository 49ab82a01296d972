"""A PyTorch module against its own ONNX export, layer by layer."""
from pathlib import Path

import onnx
import pytest
import torch

import tiny_models
from opdiff.comparison.result import ERROR, PASS
from opdiff.errors import OpdiffError
from opdiff.onnx import compare_torch
from opdiff.onnx.matching import RULE_BATCHNORM

BUILDER = f"{Path(tiny_models.__file__)}:build_model"
LAYERS = {"stem.bn", "stem.act", "stem", "layer1.0.bn", "layer1.0.act", "layer1.0", "layer1",
          "pool", "fc1", "gelu", "fc2", "(model)"}


def test_every_layer_is_reported_with_its_module(models, image, tmp_path):
    cmp = compare_torch(BUILDER, models["cnn"], inputs=str(image), output_path=tmp_path / "out")
    assert cmp.first_divergence is None
    by_module = {r.module: r for r in cmp.result.rows if r.result == PASS}
    assert set(by_module) == LAYERS
    assert by_module["fc1"].target_name == "/fc1/Gemm_output_0"
    assert by_module["gelu"].target_name == "/gelu/Mul_1_output_0"    # a module ends at its last node
    # the exporter folded BN into the Conv: the Conv's ONNX output is the BN module's output
    bn = next(p for p in cmp.matching.pairs if p.module == "stem.bn")
    assert bn.target == "/stem/conv/Conv_output_0" and bn.rule == RULE_BATCHNORM
    assert by_module["stem.bn"].metrics["Cosine"] > 0.9999
    unmatched = dict(cmp.matching.unmatched_golden)
    assert "folded" in unmatched["Module.stem.conv.Conv2d.forward.0.output.0"]
    # source line of the call that ran the module, in the user's file
    loc = by_module["fc1"].stack[0]
    assert loc.file == tiny_models.__file__ and "self.fc1" in loc.code


def test_naive_scope_pairing_would_be_wrong():
    """Why the BN rule exists: the hooked Conv output is not what the ONNX Conv computes."""
    model = tiny_models.build_model()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        conv = model.stem.conv(x)
        bn = model.stem.bn(conv)
    cos = torch.nn.functional.cosine_similarity(conv.flatten(), bn.flatten(), dim=0)
    assert cos < 0.99


def test_a_broken_export_names_the_module(models, tmp_path):
    m = onnx.load(str(models["cnn"]))
    for init in m.graph.initializer:
        if init.name == "fc2.weight":
            w = onnx.numpy_helper.to_array(init).copy()
            w[0] *= -1.0
            init.CopyFrom(onnx.numpy_helper.from_array(w, init.name))
    path = tmp_path / "broken.onnx"
    onnx.save(m, str(path))
    cmp = compare_torch(BUILDER, path, output_path=tmp_path / "out")
    d = cmp.first_divergence
    assert d is not None and d.module == "fc2" and d.op == "Linear"
    assert d.location is not None and "self.fc2" in d.location.code
    assert any(n == d.location.line and "self.fc2" in text for n, text in d.context)
    rows = {r.module: r for r in cmp.result.rows if r.module}
    assert rows["gelu"].result == PASS and rows["fc2"].result == ERROR
    # the ONNX Gemm fed the PyTorch GELU output still disagrees: the export itself is wrong there
    assert cmp.local_check.local_error is True and "/fc2/Gemm" in d.reason


def test_example_inputs_from_the_builder(models, tmp_path):
    cmp = compare_torch(f"{Path(tiny_models.__file__)}:build_with_example", models["cnn"])
    assert cmp.first_divergence is None
    assert next(r for r in cmp.result.rows if r.module == "fc1").target_shape == (2, 16)


@pytest.mark.parametrize("spec, match", [
    ("nofile.py:build", "does not exist"), ("{here}:missing", "no function"), ("{here}", "FILE.py:FUNCTION")])
def test_bad_builder_spec(models, spec, match):
    with pytest.raises(OpdiffError, match=match):
        compare_torch(spec.format(here=tiny_models.__file__), models["cnn"])


@pytest.mark.slow
def test_dynamo_export_maps_through_name_scopes(tmp_path, image):
    model = tiny_models.build_model()
    path = tmp_path / "dyn.onnx"
    torch.onnx.export(model, (torch.randn(1, 3, 16, 16),), str(path), dynamo=True,
                      input_names=["input"], output_names=["probs"])
    cmp = compare_torch(BUILDER, path, inputs=str(image))
    assert cmp.first_divergence is None
    pairs = {p.module: p for p in cmp.matching.pairs}
    assert set(pairs) == LAYERS
    assert pairs["fc1"].target == "linear"             # ONNX value names are the FX node names
    assert pairs["stem.bn"].target == "getitem"        # the BN-fused Conv carries the BN's scope
    unmatched = dict(cmp.matching.unmatched_golden)
    assert "stem.bn" in unmatched["Module.stem.conv.Conv2d.forward.0.output.0"]
    # ONNX vs ONNX on a dynamo export: rows carry the module and source line from the metadata
    from opdiff.onnx import RuntimeOptions, compare_models

    onnx_cmp = compare_models(path, path, inputs=str(image),
                              golden_options=RuntimeOptions(optimization="disable_all"))
    row = next(r for r in onnx_cmp.result.rows if r.golden_name == "linear")
    assert row.module == "fc1" and row.stack and row.stack[0].line > 0
