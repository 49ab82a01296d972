"""The dtype facts overflow uses come from opdiff.dtypes: fp16 headroom limits, exact dtypes."""
from __future__ import annotations

import pytest

from opdiff.overflow.classify import tensor_health
from opdiff.overflow.headroom import limit_for


@pytest.mark.parametrize("dtype,limit", [
    ("float32", (65504.0, "float16")), ("torch.bfloat16", (65504.0, "float16")),
    ("float64", (65504.0, "float16")), ("float16", (65504.0, "float16")),
    ("torch.float8_e4m3fn", (448.0, "float8_e4m3fn")), ("float8_e5m2", (57344.0, "float8_e5m2")),
    ("int64", None), ("bool", None), ("", None),
])
def test_headroom_limit_per_dtype(dtype, limit):
    assert limit_for(dtype) == limit


@pytest.mark.parametrize("dtype", ["int64", "torch.int32", "uint8", "bool"])
def test_integer_tensors_are_finite_without_statistics(dtype):
    assert tensor_health({"type": "tensor", "dtype": dtype, "stats": None}).finite
    assert not tensor_health({"type": "tensor", "dtype": dtype, "stats": None}).unknown


def test_a_float_tensor_without_statistics_is_unknown():
    assert tensor_health({"type": "tensor", "dtype": "float16", "stats": None}).unknown
