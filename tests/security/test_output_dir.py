"""`-o OUT` is the user's directory: opdiff removes only what it provably wrote there, never
overwrites a file it did not write, never follows a symlink or a name out of OUT, and two runs
into one OUT take turns (real CLI runs, real files, real processes)."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from opdiff.cli import main
from opdiff.outdir.records import proven, read_manifest
from opdiff.report import outputs

from outputs_kit import env, start_cli, write_dump

OPS = ["Functional.conv2d", "Functional.relu", "Tensor.__iadd__", "Functional.linear"]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("dumps")
    return write_dump(root / "target", OPS, wrong=2), write_dump(root / "golden", OPS)


def compare(dumps, out, capsys) -> tuple[int, str]:
    code = main(["compare", str(dumps[0]), str(dumps[1]), "-o", str(out), "--no-progress"])
    return code, capsys.readouterr().err


def snapshot(root: Path) -> dict:
    """Every path under root (symlinks not followed) with its bytes, its link or "dir"."""
    found = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        found[rel] = (f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir()
                      else p.read_bytes())
    return found


def assert_one_line_refusal(code: int, err: str, name: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert name in err and "was not written by opdiff" in err, err
    assert "choose another -o or remove it" in err, err


def consistent(out: Path) -> None:
    """OUT holds one run's result: summary.json lists files that exist, every manifest record is
    proven, no lock or temporary file is left, one CSV."""
    summary = json.loads((out / "summary.json").read_text())
    assert all(Path(p).is_file() for p in summary["files"].values())
    entries = read_manifest(out)
    assert entries and all(proven(out, n, r) for n, r in entries.items())
    assert set(entries) >= {Path(p).name for p in summary["files"].values()}
    names = [p.name for p in out.iterdir()]
    assert outputs.LOCK not in names and not [n for n in names if n.endswith(".tmp")]
    assert len([n for n in names if n.endswith(".csv")]) == 1, names


# -- the user's files are never deleted ------------------------------------------------------------
def test_a_users_summary_naming_files_deletes_nothing(dumps, tmp_path, capsys):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "results.csv").write_text("epoch,loss\n1,0.5\n")
    (out / "results.csv").write_text("my results\n")
    (out / "model.pt").write_bytes(b"weights")
    (out / "summary.json").write_text(json.dumps(
        {"files": {"csv": str(elsewhere / "results.csv"), "model": "model.pt"}}))
    before, outside = snapshot(out), snapshot(elsewhere)
    code, err = compare(dumps, out, capsys)
    assert_one_line_refusal(code, err, "summary.json")
    assert snapshot(out) == before and snapshot(elsewhere) == outside


@pytest.mark.parametrize("manifest", [
    {"written_by": "opdiff", "written": ["checkpoints", "paper.tex"]},          # an older opdiff's
    "forged"])                                                                  # this format's
def test_a_copied_manifest_removes_nothing_of_the_users(dumps, tmp_path, capsys, manifest):
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "epoch1.pt").write_bytes(b"\x01" * 100)
    (out / "paper.tex").write_text("\\section{Results}\n")
    if manifest == "forged":
        st = os.stat(out / "checkpoints")
        manifest = {"written_by": "opdiff", "format": 2, "entries": {
            "checkpoints": {"type": "dir", "dev": st.st_dev, "ino": st.st_ino + 1},
            "checkpoints/epoch1.pt": {"type": "file", "dev": 1, "ino": 2, "size": 100,
                                      "sha256": hashlib.sha256(b"other bytes").hexdigest()},
            "paper.tex": {"type": "file", "dev": 1, "ino": 2, "size": 18, "sha256": "0" * 64}}}
    (out / outputs.MANIFEST).write_text(json.dumps(manifest))
    before = snapshot(out)
    code, err = compare(dumps, out, capsys)
    assert code == 0, err
    after = snapshot(out)
    assert {k: v for k, v in after.items() if k in before and k != outputs.MANIFEST} == \
        {k: v for k, v in before.items() if k != outputs.MANIFEST}
    consistent(out)


@pytest.mark.parametrize("name", ["report.html", "summary.json", "rows.jsonl"])
def test_a_users_report_file_is_never_overwritten(dumps, tmp_path, capsys, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("the user's own file\n")
    code, err = compare(dumps, out, capsys)
    assert_one_line_refusal(code, err, name)
    assert sorted(p.name for p in out.iterdir()) == [name]          # nothing written beside it
    assert (out / name).read_text() == "the user's own file\n"


def test_symlinks_and_names_out_of_out_are_never_followed(dumps, tmp_path, capsys):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    data = b"the user's data"
    (elsewhere / "data.bin").write_bytes(data)
    (tmp_path / "victim.txt").write_bytes(data)
    (out / "results").symlink_to(elsewhere)               # the user's link, named in the manifest
    (out / "plots").mkdir()
    rec = {"type": "file", "dev": 1, "ino": 2, "size": len(data),
           "sha256": hashlib.sha256(data).hexdigest()}       # the right hash: only names protect
    (out / outputs.MANIFEST).write_text(json.dumps({"written_by": "opdiff", "written": ["results"],
                                                    "format": 2, "entries": {
        "results/data.bin": rec, "../victim.txt": rec, str(tmp_path / "victim.txt"): rec,
        "plots/../../victim.txt": rec, "results": {"type": "dir", "dev": 1, "ino": 2}}}))
    before, outside = snapshot(out), snapshot(tmp_path / "elsewhere")
    code, err = compare(dumps, out, capsys)
    assert code == 0, err
    assert (tmp_path / "victim.txt").read_bytes() == data
    assert snapshot(tmp_path / "elsewhere") == outside
    assert {k: v for k, v in snapshot(out).items() if k in before} == \
        {k: v for k, v in before.items() if k != outputs.MANIFEST} | \
        {outputs.MANIFEST: (out / outputs.MANIFEST).read_bytes()}


# -- what opdiff wrote stays reusable, and only while it is what opdiff wrote ---------------------
def test_an_opdiff_directory_is_reused_and_the_users_edits_survive(dumps, tmp_path, capsys):
    out = tmp_path / "out"
    assert compare(dumps, out, capsys)[0] == 0
    first_csv = next(out.glob("compare_result_*.csv"))
    (out / "notes.txt").write_text("mine")
    time.sleep(1.1)                                     # another timestamp for the next CSV
    assert compare(dumps, out, capsys)[0] == 0          # opdiff's own files are replaced
    consistent(out)
    assert not first_csv.exists() and (out / "notes.txt").read_text() == "mine"
    # The user edits opdiff's CSV (it is theirs now) and its page: neither is removed ...
    csv = next(out.glob("compare_result_*.csv"))
    csv.write_text(csv.read_text() + "my note\n")
    (out / "report.html").write_text("<p>annotated by me</p>")
    code, err = compare(dumps, out, capsys)
    assert_one_line_refusal(code, err, "report.html")   # ... and the page is not overwritten
    assert csv.read_text().endswith("my note\n")
    assert (out / "report.html").read_text() == "<p>annotated by me</p>"


def test_the_python_api_refuses_before_comparing(dumps, tmp_path):
    import opdiff

    out = tmp_path / "out"
    out.mkdir()
    (out / "rows.jsonl").write_text("{}\n")
    with pytest.raises(outputs.OutputConflict, match="rows.jsonl exists"):
        opdiff.compare(dumps[0], dumps[1], output_path=out)
    assert [p.name for p in out.iterdir()] == ["rows.jsonl"]


def test_overflow_check_and_trend_refuse_a_users_file(dumps, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "overflow.json").write_text("my overflow notes")
    code = main(["overflow", str(dumps[0]), "-o", str(out)])
    assert_one_line_refusal(code, capsys.readouterr().err, "overflow.json")
    (out / "summary.json").write_text("my summary")
    code = main(["check", str(dumps[0]), "-o", str(out)])
    assert_one_line_refusal(code, capsys.readouterr().err, "summary.json")
    assert sorted(p.name for p in out.iterdir()) == ["overflow.json", "summary.json"]
    assert (out / "overflow.json").read_text() == "my overflow notes"
    assert (out / "summary.json").read_text() == "my summary"


def test_onnx_refuses_a_users_file_and_replaces_only_its_own_dump(tmp_path, capsys):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                               helper.make_node("Neg", ["r"], ["y"], name="neg")], "g", [x], [y])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    out = tmp_path / "out"
    out.mkdir()
    (out / "onnx_details.json").write_text("my notes")
    code = main(["onnx", str(model), str(model), "-o", str(out)])
    assert_one_line_refusal(code, capsys.readouterr().err, "onnx_details.json")
    assert [p.name for p in out.iterdir()] == ["onnx_details.json"]
    (out / "onnx_details.json").unlink()
    (out / "onnx_dump_mine").mkdir()                 # the user's, though named alike
    for _ in range(2):
        assert main(["onnx", str(model), str(model), "-o", str(out)]) == 0
    capsys.readouterr()
    assert len(list(out.glob("onnx_dump_2*"))) == 1 and (out / "onnx_dump_mine").is_dir()
    entries = read_manifest(out)
    assert entries and all(proven(out, n, r) for n, r in entries.items())


@pytest.mark.slow
def test_trend_and_demo_refuse_a_users_file(tmp_path, capsys):
    from opdiff.demo.trend_runs import train

    for side in ("target", "golden"):
        train(3, monitor_path=tmp_path / "mon" / side)
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("my summary")
    code = main(["trend", str(tmp_path / "mon" / "target"), str(tmp_path / "mon" / "golden"),
                 "-o", str(out)])
    assert_one_line_refusal(code, capsys.readouterr().err, "summary.json")
    assert (out / "summary.json").read_text() == "my summary"
    # an opdiff directory holding the user's own `dump` folder: the demo must not write into it
    (out / "summary.json").unlink()
    assert main(["trend", str(tmp_path / "mon" / "target"), str(tmp_path / "mon" / "golden"),
                 "-o", str(out)]) == 0
    (out / "dump").mkdir()
    (out / "dump" / "mine.txt").write_text("keep")
    code = main(["demo", "--scenario", "fp16-overflow", "-o", str(out)])
    assert_one_line_refusal(code, capsys.readouterr().err, "dump")
    assert (out / "dump" / "mine.txt").read_text() == "keep"


# -- a killed run ----------------------------------------------------------------------------------
HOLD = """
import sys, time
from pathlib import Path
from opdiff.report import outputs
out = Path(sys.argv[1])
with outputs.session(out) as out:
    dump = outputs.make_dir(out / "onnx_dump_1")
    (dump / "records.jsonl").write_text("{}\\n")
    progress = outputs.make_file(out / "check_progress.jsonl")
    progress.write_text("line 1\\n")
    Path(sys.argv[2]).write_text("ready")
    deadline = time.monotonic() + 600
    while not Path(sys.argv[3]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def hold(out: Path, ready: Path, release: Path):
    """A process that holds OUT (a folder and a file written in it) until `release` exists."""
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", HOLD, str(out), str(ready), str(release)],
                            env=env(), stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_killed_runs_files_are_recognised_and_its_lock_is_free(dumps, tmp_path, capsys):
    out, ready = tmp_path / "out", tmp_path / "ready"
    proc = hold(out, ready, tmp_path / "never")
    wait_for(ready, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (out / outputs.LOCK).exists()                # left by the dead holder
    start = time.monotonic()
    with outputs.session(out, keep=[out / "check_progress.jsonl"]) as held:
        # its progress file is opdiff's (a resumed check goes on with it) ...
        assert outputs.make_file(held / "check_progress.jsonl").read_text() == "line 1\n"
        # ... its half-written dump folder is not: it holds files nobody recorded
        with pytest.raises(outputs.OutputConflict, match="onnx_dump_1"):
            outputs.make_dir(held / "onnx_dump_1")
    assert time.monotonic() - start < 30                # a dead holder's lock is not waited for
    code, err = compare(dumps, out, capsys)
    assert code == 0, err
    assert not (out / "check_progress.jsonl").exists()  # proven opdiff's: cleared
    assert (out / "onnx_dump_1" / "records.jsonl").exists()   # unproven: kept
    assert not (out / outputs.LOCK).exists()


# -- two runs into one OUT -------------------------------------------------------------------------
def test_a_second_compare_waits_for_the_run_holding_out(dumps, tmp_path):
    out, ready, release = tmp_path / "out", tmp_path / "ready", tmp_path / "release"
    holder = hold(out, ready, release)
    wait_for(ready, holder)
    second = start_cli("compare", dumps[0], dumps[1], "-o", out, "--no-progress")
    said = second.stderr.readline()          # blocks until the compare has reached OUT
    assert "is being written by another opdiff (opdiff pid" in said, said
    assert "waiting for it to finish" in said
    assert second.poll() is None             # waiting, not refused, not writing
    assert not list(out.glob("compare_result_*.csv"))
    release.write_text("go")
    assert holder.wait(timeout=60) == 0
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    consistent(out)
    assert not (out / "onnx_dump_1").exists()   # the holder's run, whole and proven: replaced


def test_two_compares_at_once_leave_one_whole_result(dumps, tmp_path):
    out = tmp_path / "out"
    procs = [start_cli("compare", dumps[0], dumps[1], "-o", out, "--no-progress")
             for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    consistent(out)
    summary = json.loads((out / "summary.json").read_text())
    rows = (out / "rows.jsonl").read_text().splitlines()
    assert summary["counts"]["error"] >= 1 and len(rows) - 1 == sum(summary["counts"].values())


def test_the_early_check_waits_its_judgement_while_another_run_writes(dumps, tmp_path):
    """Another opdiff holding OUT has renamed a file in before recording it: the early check must
    not call that file the user's; once the lock is free the same file is judged again."""
    from opdiff.outdir.lock import lock, unlock
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")       # a file the manifest does not (yet) record
    fd = lock(out)
    try:
        outputs.check_free(out, ("summary.json",))
    finally:
        unlock(out, fd)
    with pytest.raises(outputs.OutputConflict):
        outputs.check_free(out, ("summary.json",))
