"""CSV, summary.json and the terminal summary, from real compares of hand-built dumps."""
import csv
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "comparison"))
from dumpkit import cnn_run  # noqa: E402

from opdiff.api import compare  # noqa: E402
from opdiff.comparison.result import METRICS  # noqa: E402
from opdiff.report import write_outputs  # noqa: E402
from opdiff.report.console import print_result  # noqa: E402

SEED_COLUMNS = ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape",
                "Bench Tensor Shape"]


@pytest.fixture(scope="module")
def nan_result(tmp_path_factory):
    root = tmp_path_factory.mktemp("rep")
    cnn_run(root / "g")
    cnn_run(root / "t", bf16=True, faults=[("Functional.max_pool2d", 0, float("nan"))])
    return compare(root / "t", root / "g")


@pytest.fixture(scope="module")
def fault_result(tmp_path_factory):
    root = tmp_path_factory.mktemp("rep2")
    cnn_run(root / "g")
    cnn_run(root / "t", bf16=True, faults=[("Functional.conv2d", 1, 1.01)])
    return compare(root / "t", root / "g")


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_csv_has_the_seed_columns_and_one_line_per_tensor(fault_result, tmp_path):
    files = write_outputs(fault_result, tmp_path)
    rows = read_csv(files["csv"])
    header = rows[0]
    assert header[:6] == SEED_COLUMNS
    assert header[6:6 + len(METRICS)] == list(METRICS)
    for col in ("NPU max", "Bench l2norm", "Accuracy Reached or Not", "Result", "Err_message",
                "NPU_Stack_Info"):
        assert col in header
    assert len(rows) - 1 == len(fault_result.rows)
    col = {name: i for i, name in enumerate(header)}
    culprit = [r for r in rows[1:] if r[col["Result"]] == "error"]
    assert len(culprit) == 1 and culprit[0][col["NPU Name"]] == "Functional.conv2d.1.forward.output.0"
    assert culprit[0][col["Accuracy Reached or Not"]] == "No"
    assert "dumpkit.py, line" in culprit[0][col["NPU_Stack_Info"]]
    # numbers round-trip exactly
    row = next(r for r in fault_result.rows if r.target_name == culprit[0][col["NPU Name"]])
    assert float(culprit[0][col["MaxAbsErr"]]) == row.metrics["MaxAbsErr"]
    assert culprit[0][col["NPU Dtype"]] == "bfloat16" and culprit[0][col["Bench Dtype"]] == "float32"


def test_csv_is_never_overwritten(fault_result, tmp_path):
    a = write_outputs(fault_result, tmp_path)["csv"]
    b = write_outputs(fault_result, tmp_path)["csv"]
    assert a != b and Path(a).exists() and Path(b).exists()


def test_summary_is_strict_json_even_with_nan(nan_result, tmp_path):
    files = write_outputs(nan_result, tmp_path)
    text = Path(files["summary"]).read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in summary.json"))
    fd = data["first_divergence"]
    assert fd["name"] == "Functional.max_pool2d.0.forward" and fd["phase"] == "forward"
    assert set(fd["location"]) >= {"file", "line", "code"}
    assert fd["metrics"]["Cosine"] == "NaN"
    assert set(data["counts"]) == {"pass", "warning", "error", "unmatched"}
    assert data["target"] and data["golden"] and data["environment_diff"] == []
    assert data["files"]["csv"] == files["csv"]
    assert data["worst"][0]["result"] in ("error", "warning")


def test_html_report_is_written_when_available(fault_result, tmp_path):
    files = write_outputs(fault_result, tmp_path)
    assert Path(files["html"]).stat().st_size > 1000


def test_statistics_only_csv_uses_statistics_columns(tmp_path):
    cnn_run(tmp_path / "g", save_tensors=False)
    cnn_run(tmp_path / "t", save_tensors=False, bf16=True)
    result = compare(tmp_path / "t", tmp_path / "g", output_path=tmp_path / "out")
    header = read_csv(result.files["csv"])[0]
    assert "Max diff" in header and "NormRelativeErr" in header and "Cosine" not in header


def test_console_colours_errors_red_and_names_the_culprit(fault_result):
    console = Console(record=True, force_terminal=True, color_system="standard", width=120)
    print_result(fault_result, console=console)
    plain = console.export_text(clear=False)
    assert "First divergence: Functional.conv2d.1.forward" in plain
    assert f"{fault_result.counts['error']} error" in plain
    assert "dumpkit.py:" in plain
    styled = console.export_text(styles=True)
    assert "\x1b[1;31m" in styled       # bold red for errors


def test_console_says_when_nothing_diverges(tmp_path):
    cnn_run(tmp_path / "g")
    cnn_run(tmp_path / "t", bf16=True)
    console = Console(record=True, width=120)
    print_result(compare(tmp_path / "t", tmp_path / "g"), console=console)
    text = console.export_text()
    assert "no op is to blame" in text and "First divergence" not in text
