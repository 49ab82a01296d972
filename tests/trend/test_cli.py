"""`opdiff trend` through opdiff.cli.main: files, exit codes, and bad input on one line."""
from __future__ import annotations

import json

import pytest

from opdiff.cli import main

from .training import train


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    train(root / "golden", 48)
    train(root / "target", 48, fault="block", fault_step=30)
    return root


def test_two_runs_write_summary_page_and_next_dump(runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["trend", str(runs / "target"), str(runs / "golden"), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "the runs part at step 30" in text and "blocks.1" in text
    assert {p.name for p in out.iterdir()} == {"summary.json", "trend.html", "next_dump.json",
                                               ".opdiff-outputs.json"}
    assert json.loads((out / "summary.json").read_text())["first_divergence"]["step"] == 30


def test_a_reused_output_keeps_no_stale_next_dump_and_the_users_files(runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["trend", str(runs / "target"), str(runs / "golden"), "-o", str(out)]) == 0
    (out / "notes.txt").write_text("mine")
    # The same runs agree with themselves: no step to dump, so last run's config must go.
    assert main(["trend", str(runs / "golden"), str(runs / "golden"), "-o", str(out)]) == 0
    capsys.readouterr()
    assert {p.name for p in out.iterdir()} == {"summary.json", "trend.html", "notes.txt",
                                               ".opdiff-outputs.json"}
    assert json.loads((out / "summary.json").read_text())["first_divergence"] is None


def test_fail_on_divergence_exits_1(runs, capsys):
    assert main(["trend", str(runs / "target"), str(runs / "golden"),
                 "--fail-on-divergence"]) == 1
    assert main(["trend", str(runs / "golden"), str(runs / "golden"),
                 "--fail-on-divergence"]) == 0
    assert main(["trend", str(runs / "golden"), "--fail-on-divergence"]) == 0
    capsys.readouterr()


def test_help_has_an_example(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["trend", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "opdiff trend ./mon/npu ./mon/gpu -o ./out" in out and "--fail-on-divergence" in out


def test_trend_is_listed(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "trend" in capsys.readouterr().out


def _rank0(p, metrics=None):
    (p / "rank0").mkdir(parents=True)
    (p / "rank0" / "meta.json").write_text(json.dumps({"format": "opdiff-monitor"}))
    if metrics is not None:
        (p / "rank0" / "metrics.csv").write_text(metrics)


@pytest.mark.parametrize("make, message", [
    (lambda p: None, "does not exist"),
    (lambda p: p.mkdir(), "holds no monitor stream"),
    (lambda p: _rank0(p), "no metrics.csv"),
    (lambda p: _rank0(p, ""), "is empty"),
    (lambda p: _rank0(p, "step,loss\n0,1.0\n1\n2,1.0\n"), "metrics.csv:3"),
])
def test_bad_input_is_one_line_and_exit_2(runs, tmp_path, capsys, make, message):
    bad = tmp_path / "bad"
    make(bad)
    assert main(["trend", str(bad), str(runs / "golden")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("opdiff: error: ") and err.count("\n") == 1 and message in err
    assert "Traceback" not in err


def test_an_output_path_that_is_a_file_is_bad_input(runs, tmp_path, capsys):
    (tmp_path / "out").write_text("")
    assert main(["trend", str(runs / "golden"), "-o", str(tmp_path / "out")]) == 2
    assert "is a file; pass a directory" in capsys.readouterr().err
    assert (tmp_path / "out").read_text() == ""
