"""The output directory: file modes, and a reused -o that drops what opdiff wrote there before
(and only that)."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from opdiff.errors import ConfigError, OpdiffError
from opdiff.report import outputs, write_outputs


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    old = os.umask(0o022)
    try:
        yield lambda m: os.umask(m)
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o027, 0o640)])
def test_every_file_gets_the_mode_the_umask_gives(cnn_result, tmp_path, umask, mask, expected):
    umask(mask)
    files = write_outputs(cnn_result(), tmp_path / "out")
    assert set(files) == {"csv", "summary", "html", "rows"}
    assert {k: oct(mode(p)) for k, p in files.items()} == {k: oct(expected) for k in files}


def test_a_reused_output_directory_holds_one_compare(cnn_result, tmp_path):
    out = tmp_path / "out"
    first = write_outputs(cnn_result(), out)
    # what the user keeps there: a note, a folder, a CSV of their own
    (out / "notes.txt").write_text("mine")
    (out / "plots").mkdir()
    (out / "plots" / "loss.png").write_bytes(b"png")
    (out / "compare_result_19990101000000.csv").write_text("an old CSV the user copied here")
    second = write_outputs(cnn_result(), out)
    assert not Path(first["csv"]).exists() or first["csv"] == second["csv"]
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted({outputs.MANIFEST, "notes.txt", "plots", "compare_result_19990101000000.csv",
                            *(Path(p).name for p in second.values())})
    assert (out / "plots" / "loss.png").read_bytes() == b"png"
    assert json.loads((out / "summary.json").read_text())["files"] == second


def test_an_onnx_run_before_is_cleared_by_the_next_compare(cnn_result, tmp_path):
    with outputs.session(tmp_path / "out") as out:
        # what `opdiff onnx -o out` writes, declared as it writes it
        dump = outputs.make_dir(out / "onnx_dump_20250101_120000")
        csv = out / "result_20250101_120000.csv"
        outputs.remember(out, [csv])
        (dump / "golden" / "step0" / "rank0").mkdir(parents=True)
        (dump / "golden" / "step0" / "rank0" / "records.jsonl").write_text("{}\n")
        csv.write_text("msit")
    (out / "onnx_dump_mine").mkdir()        # the user's, though named alike
    files = write_outputs(cnn_result(), out)
    assert not dump.exists() and not csv.exists()
    assert (out / "onnx_dump_mine").is_dir()
    assert Path(files["csv"]).exists()


def test_a_directory_from_before_the_manifest_is_never_cleared_from_its_summary(cnn_result, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "compare_result_20240101000000.csv").write_text("listed")
    (out / "summary.json").write_text(json.dumps({"counts": {}, "files": {
        "csv": "/somewhere/else/out/compare_result_20240101000000.csv",
        "summary": "/somewhere/else/out/summary.json", "html": "/etc/passwd"}}))
    with pytest.raises(outputs.OutputConflict, match="summary.json exists and was not written"):
        write_outputs(cnn_result(), out)
    assert (out / "compare_result_20240101000000.csv").read_text() == "listed"
    assert sorted(p.name for p in out.iterdir()) == ["compare_result_20240101000000.csv",
                                                     "summary.json"]


def test_the_manifest_cannot_name_anything_outside_the_directory(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    st = os.stat(victim)
    rec = {"type": "file", "dev": st.st_dev, "ino": st.st_ino}
    (out / outputs.MANIFEST).write_text(json.dumps({"written_by": "opdiff", "format": 2, "entries": {
        "../victim.txt": rec, str(victim): rec, "..": rec, ".": rec}}))
    with outputs.session(out):
        with pytest.raises(ValueError):
            outputs.remember(out, [victim])
    assert victim.read_text() == "keep" and out.is_dir()


def test_the_dumps_being_compared_are_kept(tmp_path):
    with outputs.session(tmp_path / "out") as out:
        dump = outputs.make_dir(out / "onnx_dump_1")
        (dump / "target").mkdir(parents=True)
        (dump / "target" / "records.jsonl").write_text("{}\n")
    with outputs.session(out, keep=[dump / "target"]):    # `opdiff compare out/onnx_dump_1/target ...`
        assert (dump / "target" / "records.jsonl").is_file()
    assert "onnx_dump_1/target/records.jsonl" in outputs.written(out)
    with outputs.session(out):                              # kept records stay opdiff's
        pass
    assert not dump.exists()


def test_an_interrupted_atomic_write_is_cleared_too(tmp_path):
    with outputs.session(tmp_path / "out") as out:
        with pytest.raises(KeyboardInterrupt):
            with outputs.atomic_open(out / "compare_result_1.csv", "the CSV") as f:
                f.write("half a CSV")
                # the temporary file, recorded, would be left by a kill here
                tmp = next(p for p in out.iterdir() if p.name.endswith(".tmp")
                           and not p.name.startswith(outputs.MANIFEST))
                assert tmp.name in outputs.written(out)
                raise KeyboardInterrupt
    assert sorted(p.name for p in out.iterdir()) == []      # nothing written: no trace


def test_output_path_that_is_a_file_is_a_user_error(cnn_result, tmp_path):
    blocker = tmp_path / "out"
    blocker.write_text("a user's file")
    with pytest.raises(ConfigError, match="is a file; pass a directory"):
        write_outputs(cnn_result(), blocker)
    assert blocker.read_text() == "a user's file"


def test_atomic_writes_leave_nothing_behind_on_failure(tmp_path):
    target = tmp_path / "x.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with outputs.atomic_open(target, "the test file") as f:
            f.write("new")
            raise RuntimeError("boom")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.txt"]
    with pytest.raises(OpdiffError, match="cannot write the test file"):
        outputs.atomic_write_text(tmp_path / "missing" / "x.txt", "y", "the test file")
