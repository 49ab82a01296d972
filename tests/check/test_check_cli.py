"""`opdiff check` end to end: outputs, exit codes, bad input, filters, --jobs, --resume and
statistics dumps checked on --device."""
from __future__ import annotations

import csv
import json

import pytest
from checkmodels import dump

import opdiff
import opdiff.testing
from opdiff.check import check_dump
from opdiff.cli import main

FAULT = dict(op="Functional.conv2d", call=2, phase="forward", scale=1.001)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    return dump("cnn", tmp_path_factory.mktemp("faulty") / "d", fault=FAULT)


def test_outputs_and_exit_codes(faulty, tmp_path, capsys):
    out = tmp_path / "out"
    (out).mkdir()
    (out / "mine.txt").write_text("the user's")
    assert main(["check", str(faulty), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "first failure" in text and "Functional.conv2d.2.forward" in text
    assert "x worse" in text and "replay_models.py" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == 1 and summary["checked"] > 10
    first = summary["first_failure"]
    assert first["name"] == "Functional.conv2d.2.forward" and first["phase"] == "forward"
    assert first["location"]["file"].endswith("replay_models.py")
    assert first["metrics"]["error"] > 100 * first["metrics"]["reference_error"]
    assert [f["name"] for f in summary["failures"]] == [first["name"]]
    rows = list(csv.DictReader(open(next(out.glob("check_result_*.csv")))))
    bad = [r for r in rows if r["status"] == "fail"]
    assert [r["name"] for r in bad] == ["Functional.conv2d.2.forward"]
    assert float(bad[0]["ratio"]) > 100 and bad[0]["standard"] == "ratio"
    html = (out / "report.html").read_text()
    assert "opdiff check" in html and "Functional.conv2d.2.forward" in html
    assert (out / "mine.txt").read_text() == "the user's"
    # Again into the same OUT: the old CSV goes, the user's file stays; exit 1 on request.
    assert main(["check", str(faulty), "-o", str(out), "--fail-on-failure"]) == 1
    assert len(list(out.glob("check_result_*.csv"))) == 1 and (out / "mine.txt").exists()


def test_healthy_exit_zero_with_fail_on_failure(tmp_path, capsys):
    path = dump("cnn", tmp_path / "d")
    assert main(["check", str(path), "--fail-on-failure"]) == 0
    assert "0 failed" in capsys.readouterr().out


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["check", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and len(err.strip().splitlines()) == 1
    stats = dump("cnn", tmp_path / "s", task="statistics")
    assert main(["check", str(stats)]) == 2
    err = capsys.readouterr().err
    assert "--device" in err and len(err.strip().splitlines()) == 1
    corrupt = tmp_path / "c" / "step0" / "rank0"
    corrupt.mkdir(parents=True)
    (corrupt / "records.jsonl").write_text("{not json\n{\"name\": 1}\n")
    assert main(["check", str(corrupt)]) == 2
    err = capsys.readouterr().err
    assert "corrupt" in err and len(err.strip().splitlines()) == 1


def test_list_and_scope_select_ops(faulty):
    only = check_dump(faulty, names=["Functional.conv2d"])
    assert only.ops and {o.op for o in only.ops} == {"Functional.conv2d"}
    assert only.first_failure.name == "Functional.conv2d.2.forward"
    scoped = check_dump(faulty, scope=["Functional.conv2d.3.forward", "Functional.linear.0.forward"])
    names = [o.name for o in scoped.ops]
    assert names[0] == "Functional.conv2d.3.forward" and names[-1] == "Functional.linear.0.forward"
    assert scoped.first_failure is None        # the faulty conv2d.2 is before the scope


@pytest.mark.slow
def test_two_jobs_give_the_same_verdicts(faulty):
    one, two = check_dump(faulty), check_dump(faulty, jobs=2)
    assert [(o.name, o.status) for o in one.ops] == [(o.name, o.status) for o in two.ops]
    assert two.first_failure.name == "Functional.conv2d.2.forward"


def test_resume_skips_what_is_done(faulty, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["check", str(faulty), "-o", str(out), "--list", "Functional.conv2d"]) == 0
    progress = (out / "check_progress.jsonl").read_text().splitlines()
    assert len(progress) == len([json.loads(line) for line in progress]) > 3
    # Keep half of the lines, as an interrupted check leaves them, then resume.
    (out / "check_progress.jsonl").write_text("\n".join(progress[:2]) + "\n")
    done = check_dump(faulty, names=["Functional.conv2d"], resume=True,
                      progress_file=out / "check_progress.jsonl")
    assert any(n.startswith("resumed: 2 op(s)") for n in done.notes), done.notes
    assert len(done.ops) == len(progress)
    assert done.first_failure.name == "Functional.conv2d.2.forward"
    capsys.readouterr()
    assert main(["check", str(faulty), "-o", str(out), "--list", "Functional.conv2d",
                 "--resume"]) == 0
    assert "resumed:" in capsys.readouterr().out


def test_statistics_dump_on_device_finds_a_fault_in_the_checking_process(tmp_path):
    stats = dump("cnn", tmp_path / "s", task="statistics")
    healthy = check_dump(stats, device="cpu")
    assert healthy.mode == "statistics" and len(healthy.checked) > 10
    assert not healthy.failures, [(o.name, o.reason) for o in healthy.failures]
    with opdiff.testing.inject_fault(op="Functional.conv2d", call=None, phase="forward",
                                     scale=1.001):
        faulty = check_dump(stats, device="cpu")
    assert faulty.first_failure is not None
    assert faulty.first_failure.op == "Functional.conv2d", faulty.first_failure.name
    assert faulty.first_failure.name == "Functional.conv2d.0.forward"


def test_random_ops_are_listed_with_the_reason_never_judged(model_cases, tmp_path, capsys):
    model, inputs, loss_fn = model_cases["transformer"].build()     # Dropout(0.1), training
    with opdiff.dump(model, tmp_path / "d", level="mix", task="tensor"):
        loss_fn(model(*inputs)).backward()
    out = tmp_path / "out"
    assert main(["check", str(tmp_path / "d"), "-o", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    skipped = {s["name"]: s["reason"] for s in summary["not_checked"]}
    assert "Functional.dropout.0.forward" in skipped and "random" in skipped[
        "Functional.dropout.0.forward"]
    assert summary["failed"] == 0 and summary["checked"] > 10
    assert "not checked: Functional.dropout" in capsys.readouterr().out
