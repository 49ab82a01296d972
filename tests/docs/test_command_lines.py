"""Every `opdiff ...` command line in the docs, the README and CONTRIBUTING.md parses with the
real parser (parse_args, not run): a renamed command or option fails here, not in a user's shell."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from opdiff.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
_INLINE = re.compile(r"`(opdiff [^`]+)`")


def command_lines(text: str) -> list[str]:
    """The opdiff command lines of a Markdown text: in fenced or indented code (a line starting
    with `opdiff `, `\\` continuations joined, `# comments` dropped) and in inline code."""
    found, fenced, pending = [], False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        code = fenced or line.startswith("    ")
        stripped = line.strip()
        if pending:
            stripped, pending = pending + " " + stripped, ""
        elif not (code and stripped.startswith("opdiff ")):
            found += [m for m in _INLINE.findall(line)]
            continue
        if stripped.endswith("\\"):
            pending = stripped[:-1].strip()
            continue
        found.append(stripped)
    return found


def argv_of(line: str) -> list[str]:
    words = shlex.split(line, comments=True)
    assert words[0] == "opdiff"
    return words[1:]


def _cases():
    for page in PAGES:
        for line in command_lines(page.read_text(encoding="utf-8")):
            yield pytest.param(line, id=f"{page.relative_to(ROOT)}: {line[:60]}")


@pytest.mark.parametrize("line", list(_cases()))
def test_command_line_parses(line, capsys):
    parser = build_parser()
    argv = argv_of(line)
    if argv == ["..."]:                  # prose about command lines in general
        return
    if len(argv) == 1 and not argv[0].startswith("-"):      # a command named in prose
        from opdiff.cli import COMMANDS
        assert argv[0] in COMMANDS, f"{line!r}: there is no command {argv[0]!r}"
        return
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:          # --help / --version exit 0; a bad line exits 2
        assert exc.code == 0, f"{line!r} does not parse: {capsys.readouterr().err.strip()}"
        return
    assert getattr(args, "run", None) is not None, f"{line!r} names no command"


def test_the_docs_hold_command_lines_of_every_command():
    lines = [line for page in PAGES for line in command_lines(page.read_text(encoding="utf-8"))]
    used = {argv_of(line)[0] for line in lines}
    from opdiff.cli import COMMANDS
    assert set(COMMANDS) <= used, f"commands no page shows: {set(COMMANDS) - used}"


def test_a_wrong_line_is_caught(capsys):
    assert command_lines("    opdiff compare a b \\\n      --no-such-option\n") == [
        "opdiff compare a b --no-such-option"]
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv_of("opdiff compare a b --no-such-option"))
    assert exc.value.code == 2
