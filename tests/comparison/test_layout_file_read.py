"""Reading a layout file (`--layout`, comparison/layouts/declared.py) as untrusted input: only a
regular file, read without waiting (a FIFO nobody writes, /dev/zero), at most 16 MiB, UTF-8;
each a `LayoutError` naming the file, never a hang or a traceback. What the lines say, on real
hand-split runs: tests/distributed/test_layout_file.py."""
from __future__ import annotations

import os

import pytest

from opdiff.comparison.layouts.declared import LayoutError, load


@pytest.mark.parametrize("kind", ["fifo", "device", "large", "binary", "empty"])
def test_a_layout_file_that_cannot_be_one_is_refused_naming_it(tmp_path, kind):
    path = tmp_path / "layout.txt"
    if kind == "fifo":
        os.mkfifo(path)          # nobody writes it: a blocking read would hang the compare
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "large":
        path.write_text("# " + "x" * (16 << 20) + "\ncolumn 0\n")
    elif kind == "binary":
        path.write_bytes(b"column \xff\xfe\n")
    else:
        path.write_text("# only a comment\n\n")
    with pytest.raises(LayoutError) as raised:
        load(path)
    said = str(raised.value)
    assert said.startswith(str(path)) and "\n" not in said, said


def test_a_good_file_reads_each_line_with_its_number(tmp_path):
    path = tmp_path / "layout.txt"
    path.write_text("# TP=2\ncolumn layers.0.mlp.up  ranks=0-1\n\nrow layers.0.mlp.down dim=1\n"
                    "column h.0.attn.c_attn dim=1   # GPT-2 Conv1D: [in, out]\n")
    layout = load(path)
    got = [(s.line, s.kind, s.module, s.dim, s.ranks) for s in layout.splits]
    assert got == [(2, "column", "layers.0.mlp.up", 0, (0, 1)),
                   (4, "row", "layers.0.mlp.down", 1, None),
                   (5, "column", "h.0.attn.c_attn", 1, None)]


@pytest.mark.parametrize("text,said", [
    ("stage 0 ranks=0,1\n", "a stage over several ranks"),
    ("stage first ranks=0\n", "write 'stage N ranks=R'"),
    ("stage 0 ranks=0\nstage 1 ranks=0\n", "rank 0 runs stage 0 already (line 1)"),
    ("column 0 ranks=0-99999999999\n", "more than 65536 ranks"),
])
def test_a_bad_line_is_refused_with_its_line(tmp_path, text, said):
    path = tmp_path / "layout.txt"
    path.write_text(text)
    with pytest.raises(LayoutError) as raised:
        load(path)
    line = len(text.splitlines())
    assert str(raised.value).startswith(f"{path}:{line}: ") and said in str(raised.value)


def test_stage_lines_read_in_any_order(tmp_path):
    path = tmp_path / "layout.txt"
    path.write_text("stage 1 ranks=0\nstage 0 ranks=1\n")
    assert [(s.stage, s.ranks) for s in load(path).stages] == [(1, (0,)), (0, (1,))]
