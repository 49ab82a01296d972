"""What opdiff prints to a terminal never carries a dump's control characters.

Op and module names, file names, source lines and messages come from a dump, which is untrusted:
an escape sequence in one could set the window title, clear the screen, rewrite earlier lines or
write to the clipboard of the user's terminal. Every console opdiff prints through is a
`SafeConsole`, which shows each control character of the printed text (C0 but newline and tab,
DEL, C1, and the bidirectional overrides that reorder a line) as a visible escape such as
`\\x1b`; the colours rich adds itself are kept. Text from a dump is printed as `rich.text.Text`
(or escaped), never as markup, so a `[bold]` in an op name is shown as it is.

    from opdiff.terminal import console, one_line
    con = console()                          # rich Console on stdout, safe
    con.print(Text(one_line(record_name)))   # newlines too made visible: a name is one line
"""
from __future__ import annotations

import logging
import re
from typing import Any, Iterable

from rich.console import Console
from rich.segment import Segment

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROL_OR_NEWLINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _visible(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def safe(text: Any) -> str:
    """`text` with its control characters (not newline and tab) shown as escapes."""
    return _CONTROL.sub(_visible, str(text))


def one_line(text: Any) -> str:
    """`text` with every control character, newline and tab too, shown as an escape: a name or
    a one-line message cannot start a line of its own."""
    return _CONTROL_OR_NEWLINE.sub(_visible, str(text))


class SafeConsole(Console):
    """A rich Console that makes visible every control character of the text it prints; the
    styles and cursor codes rich itself emits are left alone."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            seg if seg.control or not _CONTROL.search(seg.text)
            else Segment(safe(seg.text), seg.style, seg.control) for seg in buffer)


_UNWRAPPED = 1 << 20


def console(stderr: bool = False, **kwargs: Any) -> SafeConsole:
    """A SafeConsole on stdout (or stderr). On a terminal it wraps to the terminal's width; into
    a pipe or a file it does not wrap at all (rich would wrap at 80 columns), so `grep` and
    scripts see every line whole."""
    kwargs.setdefault("highlight", False)
    con = SafeConsole(stderr=stderr, **kwargs)
    if con.is_terminal:
        return con
    return SafeConsole(stderr=stderr, soft_wrap=True, width=_UNWRAPPED, **kwargs)


class SafeFormatter(logging.Formatter):
    """A logging formatter that makes control characters in messages visible (see `safe`)."""

    def format(self, record: logging.LogRecord) -> str:
        return safe(super().format(record))


__all__ = ["safe", "one_line", "SafeConsole", "console", "SafeFormatter"]
