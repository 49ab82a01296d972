"""Thresholds: one row per dtype, loaded from files and overrides, looked up by dtype pair."""
import pytest

from opdiff.comparison.metric_table import Measurement
from opdiff.comparison.result import ERROR, PASS, WARNING
from opdiff.comparison.verdicts import DTYPE_COLUMNS, DTYPE_THRESHOLDS, Policy, Thresholds
from opdiff.errors import ConfigError


def test_every_row_sets_every_column_and_the_fields_come_from_it():
    t = Thresholds()
    for dtype, row in DTYPE_THRESHOLDS.items():
        assert len(row) == len(DTYPE_COLUMNS), dtype
        for column, value in zip(DTYPE_COLUMNS, row):
            assert getattr(t, column)[dtype] == value, (dtype, column)


@pytest.mark.parametrize("target, golden, row", [
    ("torch.bfloat16", "torch.float32", "bfloat16"),    # the coarser of the pair
    ("bf16", "fp16", "bfloat16"),
    ("torch.float16", "torch.float64", "float16"),
    ("torch.float32", "torch.float32", "float32"),
    ("torch.float8_e4m3fn", "torch.float32", "float8"),
    ("torch.int64", "torch.int64", "int"),
    ("torch.int64", "torch.float32", "float32"),        # one float side: judged as that float
    ("weird", "weird", "float32"),                     # unknown names: like float32
])
def test_a_dtype_pair_is_judged_by_its_coarser_row(target, golden, row):
    p = Policy()
    i = DTYPE_COLUMNS.index
    assert p.tolerance_for(target, golden) == DTYPE_THRESHOLDS[row][i("tolerance")]
    assert p.scale_tolerance_for(target, golden) == DTYPE_THRESHOLDS[row][i("scale_tolerance")]
    assert p.statistics_tolerance_for(target, golden, "backward") == \
        DTYPE_THRESHOLDS[row][i("statistics_backward_tolerance")]


def test_overrides_by_table_and_by_bare_dtype():
    t = Thresholds.load({"tolerance": {"bf16": 0.03}, "fp16": 0.004, "amplification": 5})
    assert t.tolerance["bfloat16"] == 0.03 and t.tolerance["float16"] == 0.004
    assert t.amplification == 5.0
    assert t.tolerance["float32"] == DTYPE_THRESHOLDS["float32"][0]      # the rest untouched
    with pytest.raises(ConfigError, match="unknown dtype"):
        Thresholds.load({"tolerance": {"bf17": 0.1}})
    with pytest.raises(ConfigError, match="unknown threshold"):
        Thresholds.load({"tolerence": 0.1})
    with pytest.raises(ConfigError, match="finite number"):
        Thresholds.load({"bf16": -1})


def test_judge_passes_warns_and_errs_by_the_tolerance():
    p = Policy()
    tol = p.tolerance_for("bf16", "fp32")
    assert p.judge(Measurement({}, error=0.1 * tol), "bf16", "fp32").result == PASS
    assert p.judge(Measurement({}, error=0.9 * tol), "bf16", "fp32").result == WARNING
    v = p.judge(Measurement({}, error=2 * tol), "bf16", "fp32")
    assert v.result == ERROR and v.accuracy_reached == "No"
    assert p.judge(Measurement({}, nonfinite_mismatch=1), "fp32", "fp32").result == ERROR
