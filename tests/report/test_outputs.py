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
    out = outputs.prepare(tmp_path / "out")
    # what `opdiff onnx -o out` writes, declared as it writes it
    dump, csv = out / "onnx_dump_20250101_120000", out / "result_20250101_120000.csv"
    outputs.remember(out, [dump, csv])
    (dump / "golden" / "step0" / "rank0").mkdir(parents=True)
    (dump / "golden" / "step0" / "rank0" / "records.jsonl").write_text("{}\n")
    csv.write_text("msit")
    (out / "onnx_dump_mine").mkdir()        # the user's, though named alike
    files = write_outputs(cnn_result(), out)
    assert not dump.exists() and not csv.exists()
    assert (out / "onnx_dump_mine").is_dir()
    assert Path(files["csv"]).exists()


def test_a_directory_from_before_the_manifest_loses_only_the_files_its_summary_lists(cnn_result, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "compare_result_20240101000000.csv").write_text("listed")
    (out / "compare_result_20230101000000.csv").write_text("not listed: may be the user's")
    (out / "summary.json").write_text(json.dumps({"counts": {}, "files": {
        "csv": "/somewhere/else/out/compare_result_20240101000000.csv",
        "summary": "/somewhere/else/out/summary.json", "html": "/etc/passwd"}}))
    write_outputs(cnn_result(), out)
    assert not (out / "compare_result_20240101000000.csv").exists()
    assert (out / "compare_result_20230101000000.csv").read_text() == "not listed: may be the user's"


def test_the_manifest_cannot_name_anything_outside_the_directory(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (out / outputs.MANIFEST).write_text(json.dumps({"written": ["../victim.txt", str(victim), "..", "."]}))
    outputs.prepare(out)
    assert victim.read_text() == "keep" and out.is_dir()
    with pytest.raises(ValueError):
        outputs.remember(out, [victim])


def test_the_dumps_being_compared_are_kept(tmp_path):
    out = outputs.prepare(tmp_path / "out")
    dump = out / "onnx_dump_1"
    outputs.remember(out, [dump])
    (dump / "target").mkdir(parents=True)
    outputs.prepare(out, keep=[dump / "target"])      # `opdiff compare out/onnx_dump_1/target ...`
    assert (dump / "target").is_dir()


def test_an_interrupted_run_is_cleared_too(tmp_path):
    out = outputs.prepare(tmp_path / "out")
    half = out / "compare_result_1.csv"
    outputs.remember(out, [half])          # declared before writing: then the run died
    half.write_text("half a CSV")
    outputs.prepare(out)
    assert not half.exists()


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
