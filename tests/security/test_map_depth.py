"""A `--map` file nested 50,000 deep (flow or block style) is one line and exit code 2, not a
RecursionError, and a FIFO or /dev/zero named as one is refused at once, not read (a real CLI run
in a child process; the files are made here)."""
from __future__ import annotations

import pytest

from outputs_kit import cli, write_dump

OPS = ["Functional.linear", "Functional.relu"]
DEEP = 50_000


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("dumps")
    return write_dump(root / "target", OPS), write_dump(root / "golden", OPS)


@pytest.mark.parametrize("style", ["flow", "block", "msprobe"])
def test_a_deep_mapping_file_is_one_line_and_exit_2(dumps, tmp_path, style):
    path = tmp_path / "pairs.yaml"
    if style == "flow":
        path.write_text("modules: " + "[" * DEEP + "]" * DEEP + "\n")
    elif style == "block":
        path.write_text("modules:\n" + "".join(f"{' ' * (i + 1)}- \n" for i in range(3000)))
    else:
        path.write_text("fc1.Linear: " + "{a: " * DEEP + "b" + "}" * DEEP + "\n")
    done = cli("compare", dumps[0], dumps[1], "--map", path, "--no-progress", timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "nested more than 100 deep" in lines[0] and str(path) in lines[0], done.stderr


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_mapping_that_is_not_a_regular_file_is_refused_without_waiting(dumps, tmp_path, kind):
    import os

    if kind == "fifo":
        path = tmp_path / "pairs.yaml"
        os.mkfifo(path)          # nobody writes it: a blocking read would hang the compare
    else:
        path = tmp_path / "zero.yaml"
        path.symlink_to("/dev/zero")
    done = cli("compare", dumps[0], dumps[1], "--map", path, "--no-progress", timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a regular file" in lines[0] and str(path) in lines[0], done.stderr
