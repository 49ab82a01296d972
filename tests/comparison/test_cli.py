"""`opdiff compare` on the command line: outputs, exit codes, one-line errors."""
import json

import pytest

from opdiff.cli import main

from dumpkit import cnn_run


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    cnn_run(root / "cpu" / "step0" / "rank0")
    cnn_run(root / "npu" / "step0" / "rank0", faults=[("Tensor.__iadd__", 0, 1.01)])
    cnn_run(root / "same" / "step0" / "rank0")
    return root


def test_compare_writes_outputs_and_prints_the_culprit(dumps, tmp_path, capsys):
    code = main(["compare", str(dumps / "npu"), str(dumps / "cpu"), "-o", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0
    assert "First divergence" in out and "Tensor.__iadd__.0.forward" in out
    assert "out += residual" in out
    # (hidden files are opdiff's own bookkeeping, e.g. report's .opdiff-outputs.json)
    names = sorted(p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith("."))
    assert names[0].startswith("compare_result_") and names[0].endswith(".csv")
    assert "summary.json" in names and "report.html" in names
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["first_divergence"]["name"] == "Tensor.__iadd__.0.forward"
    assert summary["first_divergence"]["location"]["line"] > 0


def test_fail_on_divergence_exit_codes(dumps):
    args = ["compare", str(dumps / "npu"), str(dumps / "cpu"), "--no-progress"]
    assert main(args + ["--fail-on-divergence"]) == 1
    assert main(["compare", str(dumps / "same"), str(dumps / "cpu"), "--fail-on-divergence"]) == 0


@pytest.mark.parametrize("extra,message", [
    (["--threshold", "bf16"], "KEY=VALUE"),
    (["--threshold", "nonsense=1"], "unknown threshold"),
    (["--threshold", "bf16=-1"], ">= 0"),
    (["--thresholds", "/nonexistent/t.json"], "thresholds file not found"),
])
def test_bad_thresholds_exit_2(dumps, capsys, extra, message):
    assert main(["compare", str(dumps / "npu"), str(dumps / "cpu")] + extra) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_missing_dump_exits_2_with_one_line(dumps, capsys):
    assert main(["compare", str(dumps / "nope"), str(dumps / "cpu")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("opdiff: error:") and "no such file" in err and "\n" not in err


def test_output_path_that_is_a_file_is_refused_and_kept(dumps, tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    assert main(["compare", str(dumps / "npu"), str(dumps / "cpu"), "-o", str(f)]) == 2
    assert f.read_text() == "mine"


def test_thresholds_file_changes_the_verdict(dumps, tmp_path):
    # A tolerance so loose that a 1 % scale error is "within precision" for fp32.
    t = tmp_path / "t.json"
    t.write_text(json.dumps({"tolerance": {"fp32": 0.5}, "scale_tolerance": {"fp32": 0.5}}))
    args = ["compare", str(dumps / "npu"), str(dumps / "cpu"), "--fail-on-divergence"]
    assert main(args) == 1
    assert main(args + ["--thresholds", str(t)]) == 0


def test_a_note_about_an_unpaired_step_is_said_once(tmp_path, capsys, caplog):
    cnn_run(tmp_path / "t" / "step0" / "rank0")
    cnn_run(tmp_path / "g" / "step0" / "rank0")
    cnn_run(tmp_path / "g" / "step1" / "rank0")
    with caplog.at_level("INFO", logger="opdiff"):
        assert main(["compare", str(tmp_path / "t"), str(tmp_path / "g"), "--no-progress"]) == 0
    out = capsys.readouterr()
    note = "golden step 1 rank 0 has no target counterpart"
    said = (out.out + out.err).count(note) + sum(note in r.getMessage() for r in caplog.records)
    assert said == 1
