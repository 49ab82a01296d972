"""Source context comes from the dump itself or from a directory the user names
(`--source-root`), never from a file a dump's stack merely names: a hostile dump naming
`/tmp/secret.txt` (mode 0600) must not put its lines into the terminal, summary.json,
report.html or the CSV."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from sec_input_dumps import capture

import opdiff
from opdiff.cli import main

SECRET = "SECRET-TOKEN-5f3a9c"
HERE = Path(__file__).resolve().parent
MSPROBE = HERE.parent / "data" / "msprobe" / "tensor"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("ctx")
    return capture(root / "t", fault=True), capture(root / "g", fault=False)


@pytest.fixture
def secret(tmp_path):
    """A private file of the user's, its line 3 holding the secret."""
    path = tmp_path / "private" / "secret.txt"
    path.parent.mkdir()
    path.write_text(f"line one\nline two\napi_key = '{SECRET}'\nline four\nline five\n")
    os.chmod(path, 0o600)
    return path


def _point_stacks_at(dump: Path, file: Path, line: int = 3) -> None:
    """Every frame of the dump's stacks names `file`:`line`, with no context lines of its own
    (the code line the dump holds stays)."""
    out = []
    for raw in (dump / "stacks.jsonl").read_text().splitlines():
        entry = json.loads(raw)
        for frame in entry["frames"]:
            frame["file"], frame["line"] = str(file), line
            frame.pop("context", None)
        out.append(json.dumps(entry))
    (dump / "stacks.jsonl").write_text("\n".join(out) + "\n")


def _run(capsys, *args: str) -> str:
    capsys.readouterr()
    rc = main(list(args))
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return captured.out + captured.err


def _written(out: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(out.iterdir()) if p.is_file())


def test_a_dump_naming_a_private_file_discloses_nothing(dumps, secret, tmp_path, capsys):
    target = Path(shutil.copytree(dumps[0], tmp_path / "t" / "step0" / "rank0"))
    _point_stacks_at(target, secret)
    out = tmp_path / "out"
    text = _run(capsys, "compare", str(target), str(dumps[1]), "-o", str(out))
    assert f"{secret}:3" in text                         # the location is named...
    assert SECRET not in text                            # ...its lines are not read
    summary = json.loads((out / "summary.json").read_text())
    assert summary["first_divergence"]["location"]["file"] == str(secret)
    assert summary["first_divergence"]["context"] == []
    assert SECRET not in _written(out)                   # summary, report.html, CSV, rows
    assert (out / "report.html").exists()
    # opdiff check and overflow on the same dump: the same rule.
    checked = tmp_path / "checked"
    text = _run(capsys, "check", str(target), "-o", str(checked))
    assert SECRET not in text and SECRET not in _written(checked)
    assert SECRET not in _run(capsys, "overflow", str(target), "-o", str(tmp_path / "ov"))
    assert SECRET not in _written(tmp_path / "ov")


def test_source_root_shows_the_lines_around(dumps, secret, tmp_path, capsys):
    target = Path(shutil.copytree(dumps[0], tmp_path / "t" / "step0" / "rank0"))
    secret = secret.rename(secret.with_suffix(".py"))       # the user's source: a .py file
    _point_stacks_at(target, secret)
    out = tmp_path / "out"
    text = _run(capsys, "compare", str(target), str(dumps[1]), "-o", str(out),
                "--source-root", str(secret.parent))
    assert SECRET in text and "line two" in text         # the user named the directory
    context = json.loads((out / "summary.json").read_text())["first_divergence"]["context"]
    assert [n for n, _ in context] == [1, 2, 3, 4, 5] and SECRET in context[2][1]
    assert SECRET in (out / "report.html").read_text()
    # The same through the Python API, and for opdiff check's report.
    result = opdiff.compare(target, dumps[1], source_root=secret.parent)
    assert dict(result.first_divergence.context)[3].endswith(f"'{SECRET}'")
    _run(capsys, "check", str(target), "-o", str(tmp_path / "checked"),
         "--source-root", str(secret.parent))
    assert SECRET in (tmp_path / "checked" / "report.html").read_text()


def test_source_root_never_follows_a_link_out_of_it(dumps, secret, tmp_path, capsys):
    target = Path(shutil.copytree(dumps[0], tmp_path / "t" / "step0" / "rank0"))
    root = tmp_path / "project"
    root.mkdir()
    os.symlink(secret, root / "secret.txt")               # inside the root, pointing out
    _point_stacks_at(target, root / "secret.txt")
    text = _run(capsys, "compare", str(target), str(dumps[1]), "--source-root", str(root))
    assert SECRET not in text
    # Nor does a path that climbs out of the root with "..".
    _point_stacks_at(target, root / ".." / "private" / "secret.txt")
    text = _run(capsys, "compare", str(target), str(dumps[1]), "--source-root", str(root))
    assert SECRET not in text


def test_a_regular_capture_still_shows_the_users_lines(dumps, tmp_path, capsys):
    """Capture stores the lines around the user's line with the call site (read in the user's
    own process); the compare shows them from the dump, without reading the file."""
    stacks = [json.loads(line) for line in (dumps[0] / "stacks.jsonl").read_text().splitlines()]
    inner = stacks[0]["frames"][0]
    assert [n for n, _ in inner["context"]] == list(range(inner["line"] - 2, inner["line"] + 3))
    out = tmp_path / "out"
    text = _run(capsys, "compare", str(dumps[0]), str(dumps[1]), "-o", str(out))
    assert "sec_input_dumps.py" in text and "model(x).sum().backward()" in text
    assert "dbg.start()" in text and "dbg.stop()" in text
    first = json.loads((out / "summary.json").read_text())["first_divergence"]
    assert first["location"]["code"].startswith("model(x).sum().backward()")
    assert [list(c) for c in inner["context"]] == first["context"]
    assert "model(x).sum().backward()" in (out / "report.html").read_text()


def test_context_comes_from_the_dump_not_the_file(dumps, secret, tmp_path, capsys):
    """A dump whose frame names the private file but holds its own context lines: those are
    shown (they are the dump's own bytes), the file's are not."""
    target = Path(shutil.copytree(dumps[0], tmp_path / "t" / "step0" / "rank0"))
    lines = []
    for raw in (target / "stacks.jsonl").read_text().splitlines():
        entry = json.loads(raw)
        entry["frames"][0].update(file=str(secret), line=3,
                                  context=[[2, "what the dump says"], [3, "model(x)"]])
        lines.append(json.dumps(entry))
    (target / "stacks.jsonl").write_text("\n".join(lines) + "\n")
    text = _run(capsys, "compare", str(target), str(dumps[1]))
    assert "what the dump says" in text and SECRET not in text


def test_a_foreign_dump_reads_its_files_only_under_the_root(tmp_path, capsys):
    """msprobe's stacks name the script that made the fixture, on another machine's path:
    without --source-root only the line msprobe stored; with it, the file found by its tail."""
    out = tmp_path / "out"
    _run(capsys, "compare", str(MSPROBE / "target"), str(MSPROBE / "golden"), "-o", str(out))
    first = json.loads((out / "summary.json").read_text())["first_divergence"]
    assert first["location"]["code"] == "out += residual" and first["context"] == []
    root = HERE.parent / "data" / "make_fixtures"
    _run(capsys, "compare", str(MSPROBE / "target"), str(MSPROBE / "golden"), "-o", str(out),
         "--source-root", str(root))
    context = json.loads((out / "summary.json").read_text())["first_divergence"]["context"]
    assert len(context) == 5 and "out += residual" in dict(context)[first["location"]["line"]]


def test_source_root_must_be_a_directory(dumps, tmp_path, capsys):
    assert main(["compare", str(dumps[0]), str(dumps[1]), "--source-root",
                 str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "not a directory" in err and len(err.strip().splitlines()) == 1


def _overflowing(path: Path) -> Path:
    import torch

    dbg = opdiff.PrecisionDebugger(dump_path=str(path), task="statistics")
    dbg.start()
    torch.exp(torch.full((4,), 100.0))          # exp(100) overflows float32: the origin
    dbg.stop()
    return path / "step0" / "rank0"


def test_overflow_reads_a_missing_code_line_only_under_the_root(tmp_path, capsys):
    dump = _overflowing(tmp_path / "ov")
    lines = []
    for raw in (dump / "stacks.jsonl").read_text().splitlines():
        entry = json.loads(raw)
        for frame in entry["frames"]:
            frame["code"] = ""                  # a dump that holds no code line
            frame.pop("context", None)
        lines.append(json.dumps(entry))
    (dump / "stacks.jsonl").write_text("\n".join(lines) + "\n")
    assert "torch.exp(torch.full" not in _run(capsys, "overflow", str(dump))
    text = _run(capsys, "overflow", str(dump), "--source-root", str(HERE))
    assert "Origin: Torch.exp" in text and "torch.exp(torch.full((4,), 100.0))" in text
