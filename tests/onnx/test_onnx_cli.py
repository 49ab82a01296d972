"""`opdiff onnx` end to end: files written, exit codes, one-line errors."""
import csv
import json
import sys

import pytest

from opdiff.cli import main


def test_cli_fp16_overflow_writes_every_report(models, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["onnx", str(models["cnn_big_fp16"]), str(models["cnn_big"]), "-o", str(out)])
    assert rc == 0
    names = {p.name for p in out.iterdir()}
    assert {"summary.json", "report.html", "onnx_details.json"} <= names
    assert any(n.startswith("result_") and n.endswith(".csv") for n in names)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first_divergence"]["name"] == "/fc1/Gemm"
    assert summary["first_divergence"]["op"] == "Gemm"
    html = (out / "report.html").read_text()
    assert "/fc1/Gemm" in html and "opdiff onnx" in html
    assert main(["onnx", str(models["cnn_big_fp16"]), str(models["cnn_big"]), "-o", str(out),
                 "--fail-on-divergence"]) == 1


def test_cli_torch_and_opt_levels(models, tmp_path, capsys):
    import tiny_models

    rc = main(["onnx", "--torch", f"{tiny_models.__file__}:build_model", str(models["cnn"]),
               "-o", str(tmp_path / "t")])
    assert rc == 0
    rc = main(["onnx", str(models["cnn"]), str(models["cnn"]), "--golden-opt", "disable_all",
               "--target-opt", "all", "-o", str(tmp_path / "o"), "--fail-on-divergence"])
    assert rc == 0
    row = next(csv.reader(open(next((tmp_path / "o").glob("result_*.csv")))))
    assert "CosineSimilarity" in row and "IsPrecisionError" in row


@pytest.mark.parametrize("argv, match", [
    (["onnx", "{cnn}"], "give two models"),
    (["onnx", "{cnn}", "{cnn}", "--target-ep", "NoSuchEP"], "not available"),
    (["onnx", "{cnn}", "{cnn}", "-i", "{cnn}"], "use .npy"),
    (["onnx", "{cnn}", "/nonexistent.onnx"], "does not exist"),
    (["onnx", "{cnn}", "{notmodel}"], "not a readable ONNX model"),
])
def test_cli_bad_input_exits_2_with_one_line(models, tmp_path, capsys, argv, match):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not protobuf")
    argv = [a.format(cnn=models["cnn"], notmodel=bad) for a in argv]
    assert main(argv + ["-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1


def test_cli_without_onnxruntime_says_how_to_install(models, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)     # import fails as if not installed
    assert main(["onnx", str(models["cnn"]), str(models["cnn"]), "-o", str(tmp_path / "o")]) == 2
    assert "pip install 'opdiff[onnx]'" in capsys.readouterr().err


def test_onnx_compare_does_not_import_torch(models, tmp_path):
    """ONNX vs ONNX never needs torch: importing it would cost more than the whole compare."""
    import subprocess

    code = ("import sys; from opdiff.cli import main; "
            f"rc = main(['onnx', r'{models['cnn_fp16']}', r'{models['cnn']}', '-o', r'{tmp_path / 'o'}']); "
            "print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "0 False", out.stderr[-500:]
    assert (tmp_path / "o" / "report.html").exists()
