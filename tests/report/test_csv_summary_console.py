"""CSV, summary.json and the terminal summary, from real compares of hand-built dumps."""
import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "comparison"))
from dumpkit import cnn_run  # noqa: E402

import opdiff.report  # noqa: E402
from opdiff.api import compare  # noqa: E402
from opdiff.comparison.metric_table import METRICS  # noqa: E402
from opdiff.report import write_outputs  # noqa: E402
from opdiff.report.console import print_result  # noqa: E402

SEED_COLUMNS = ["NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape",
                "Bench Tensor Shape"]
# The whole header of a tensor compare, as users' scripts read it (the column table must keep it).
TENSOR_HEADER = SEED_COLUMNS + [
    "Cosine", "RMSE", "MAPE", "MaxAbsErr", "MaxRelativeErr", "MeanRelativeErr",
    "RelEuclideanDistance", "KLD", "One Thousandth Err Ratio", "Five Thousandths Err Ratio",
    "NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min", "Bench mean",
    "Bench l2norm", "Accuracy Reached or Not", "Result", "Err_message", "NPU_Stack_Info"]
STATISTICS_METRICS = ["Max diff", "Min diff", "Mean diff", "L2norm diff", "MaxRelativeErr",
                      "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr"]


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
    assert header == TENSOR_HEADER
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


def test_a_csv_opdiff_did_not_write_is_never_overwritten(fault_result, tmp_path, monkeypatch):
    monkeypatch.setattr(opdiff.report, "_stamp", lambda: "20250101120000")
    theirs = tmp_path / "compare_result_20250101120000.csv"
    theirs.write_text("the user's own copy")
    ours = write_outputs(fault_result, tmp_path)["csv"]
    assert ours != str(theirs) and Path(ours).exists()
    assert theirs.read_text() == "the user's own copy"
    # a second compare in the same second replaces opdiff's CSV, and still not the user's
    again = write_outputs(fault_result, tmp_path)["csv"]
    assert Path(again).exists() and theirs.read_text() == "the user's own copy"
    assert sorted(p.name for p in tmp_path.glob("*.csv")) == sorted({theirs.name, Path(again).name})


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
    assert data["files"] == files       # every file written, summary.json and rows.jsonl included
    assert set(files) == {"csv", "summary", "html", "rows"}
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
    assert header == SEED_COLUMNS + STATISTICS_METRICS + TENSOR_HEADER[16:]


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


def test_importing_the_csv_writer_does_not_import_torch():
    code = ("import sys, opdiff.report.csv_report; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_write_outputs_returns_the_files_and_leaves_the_result_alone(fault_result, tmp_path):
    before = dict(fault_result.files)
    files = write_outputs(fault_result, tmp_path / "out")
    assert fault_result.files == before
    assert all(Path(p).is_file() for p in files.values())


def _opdiff_command() -> list[str]:
    exe = Path(sys.executable).with_name("opdiff")
    return [str(exe)] if exe.exists() else [shutil.which("opdiff") or "opdiff"]


def test_piped_output_is_not_wrapped(tmp_path):
    # a path longer than 80 columns: rich wraps it at 80 when stdout is not a terminal
    deep = tmp_path / ("a_directory_name_long_enough_to_pass_eighty_columns_" * 2)
    cnn_run(deep / "golden")
    cnn_run(deep / "target", bf16=True, faults=[("Functional.conv2d", 1, 1.01)])
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")}
    done = subprocess.run(_opdiff_command() + ["compare", str(deep / "target"), str(deep / "golden"),
                                               "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"  target {deep / 'target'}" in lines, done.stdout
    wrote = [line for line in lines if line.startswith("Wrote ")]
    assert len(wrote) == 1 and wrote[0].endswith(f" to {tmp_path / 'out'}"), done.stdout
    assert max(len(line) for line in lines) > 80
