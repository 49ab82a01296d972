"""CSV cells never carry a dump's control characters: an op name holding ESC, BEL, a C1 byte or
a bidirectional override is written with visible escapes, so `cat`/`less` on the CSV cannot set
the terminal's title, ring it or reorder a line; numbers stay numbers (a real compare)."""
from __future__ import annotations

import csv
import re

from opdiff.cli import main
from opdiff.report.csv_report import safe_cell

from outputs_kit import write_dump

CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
HOSTILE = ["Functional.\x1b]0;owned\x07relu", "Functional.\x9b31mlinear", "Tensor.\u202eadd",
           "Functional.\x1b[2Jconv2d\x00"]


def test_control_characters_in_names_are_escaped_in_every_cell(tmp_path, capsys):
    target = write_dump(tmp_path / "target", HOSTILE, wrong=1)
    golden = write_dump(tmp_path / "golden", HOSTILE)
    out = tmp_path / "out"
    assert main(["compare", str(target), str(golden), "-o", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    path = next(out.glob("compare_result_*.csv"))
    text = path.read_text(encoding="utf-8")
    assert not CONTROL.search(text.replace("\r\n", "\n")), repr(text[:400])
    rows = list(csv.reader(path.open(newline="", encoding="utf-8")))
    header, body = rows[0], rows[1:]
    names = {r[header.index("NPU Name")] for r in body}
    assert any("\\x1b]0;owned\\x07" in n for n in names), names
    assert any("\\x9b31m" in n for n in names) and any("\\u202e" in n for n in names)
    numbers = 0
    for row in body:
        for h, cell in zip(header, row):
            if h.startswith(("NPU max", "NPU min", "Bench max", "Bench min")) and cell:
                float(cell)                      # still a number
                numbers += 1
    assert numbers > 0


def test_safe_cell_escapes_controls_and_keeps_numbers():
    assert safe_cell("a\x1b[31mb\x07") == "a\\x1b[31mb\\x07"
    assert safe_cell("=\x1bcmd") == "'=\\x1bcmd"          # still neutralised as a formula
    assert safe_cell("line one\nline two\tx") == "line one\nline two\tx"   # stacks keep lines
    assert safe_cell("-1.5e-05") == "-1.5e-05" and safe_cell(-0.5) == -0.5
