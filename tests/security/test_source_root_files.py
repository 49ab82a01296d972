"""`--source-root DIR` shows lines of the user's Python source under DIR, nothing else a dump
names there: not `.git/config`, `.env`, `secrets.yaml`, a hidden folder's file, nor a `.py` link
to one of them; a note says why (real compares of a real capture, stacks rewritten here)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sec_input_dumps import capture

from opdiff.cli import main

SECRET = "SECRET-TOKEN-91c2e7"


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("roots")
    return capture(root / "t", fault=True), capture(root / "g", fault=False)


@pytest.fixture
def project(tmp_path):
    """A checkout: its source, and the files beside it that are not source."""
    root = tmp_path / "project"
    lines = f"one\ntwo\npassword = '{SECRET}'\nfour\nfive\n"
    for rel in (".git/config", ".env", "secrets.yaml", "conf/.hidden/model.py", "CVS/model.py",
                "train.py.bak"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(lines)
    (root / "linked.py").symlink_to(root / "secrets.yaml")      # a .py name for a yaml file
    (root / "model.py").write_text(f"import torch\nx = 1\ny = model(x)  # {SECRET[:6]}-OK\n"
                                   "z = 2\nw = 3\n")
    return root


def _point_stacks_at(src: Path, dest: Path, file: str) -> Path:
    dump = Path(shutil.copytree(src, dest / "step0" / "rank0"))
    out = []
    for raw in (dump / "stacks.jsonl").read_text().splitlines():
        entry = json.loads(raw)
        for frame in entry["frames"]:
            frame["file"], frame["line"] = file, 3
            frame.pop("context", None)
        out.append(json.dumps(entry))
    (dump / "stacks.jsonl").write_text("\n".join(out) + "\n")
    return dump


@pytest.mark.parametrize("name", [".git/config", ".env", "secrets.yaml", "conf/.hidden/model.py",
                                  "CVS/model.py", "train.py.bak", "linked.py"])
def test_only_python_source_under_the_root_is_shown(dumps, project, tmp_path, capsys, caplog,
                                                     name):
    target = _point_stacks_at(dumps[0], tmp_path / "t", str(project / name))
    out = tmp_path / "out"
    code = main(["compare", str(target), str(dumps[1]), "-o", str(out), "--no-progress",
                 "--source-root", str(project)])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert SECRET not in said.out + said.err
    assert "--source-root: not showing the lines of" in said.err + caplog.text
    assert json.loads((out / "summary.json").read_text())["first_divergence"]["context"] == []
    assert all(SECRET not in p.read_text(errors="replace") for p in out.iterdir() if p.is_file())


def test_the_users_source_is_still_shown(dumps, project, tmp_path, capsys, caplog):
    # a dump from another machine: found by its tail under the root
    target = _point_stacks_at(dumps[0], tmp_path / "t", "/home/someone/project/model.py")
    code = main(["compare", str(target), str(dumps[1]), "--no-progress",
                 "--source-root", str(project)])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert "y = model(x)" in said.out and "x = 1" in said.out
    assert "not showing" not in said.err + caplog.text
