"""Call stacks written by foreign tools, as opdiff frames: {"file", "line", "function", "code"}.

msprobe writes each frame as one string, `File /a/b.py, line 12, in forward, \\n out = f(x)`;
ptdbg_ascend writes `[path, "12", function, code]`. Both list the innermost frame first.
opdiff shows the user's code, so frames inside torch, the dumping tool and the Python standard
library are dropped (when nothing is left, the stack is kept whole rather than lost); which
frames those are is `opdiff.store.frames.is_internal`'s answer, the same as for live frames.
"""
from __future__ import annotations

import re
from typing import Any

from ..frames import is_internal

_MSPROBE_FRAME = re.compile(r"^File (?P<file>.*?), line (?P<line>\d+), in (?P<function>.*?),?\s*\n(?P<code>.*)$",
                            re.DOTALL)


def parse_msprobe_frame(text: object) -> dict[str, Any] | None:
    """One msprobe stack string as a frame, or None if it does not look like one."""
    m = _MSPROBE_FRAME.match(text.strip("\r")) if isinstance(text, str) else None
    if not m:
        return None
    return {"file": m["file"], "line": int(m["line"]), "function": m["function"].strip(),
            "code": m["code"].strip()}


_FRAME_IN_TEXT = re.compile(r"File (?P<file>.+?), line (?P<line>\d+), in (?P<function>.+?),[ \t]*\n(?P<code>[^\n]*)")


def parse_msprobe_frames(entry: object) -> list[dict[str, Any]]:
    """msprobe frames given as a list of strings, or as one string holding them all."""
    if isinstance(entry, str):
        return [{"file": m["file"], "line": int(m["line"]), "function": m["function"].strip(),
                 "code": m["code"].strip()} for m in _FRAME_IN_TEXT.finditer(entry)]
    if isinstance(entry, list):
        return [f for f in map(parse_msprobe_frame, entry) if f]
    return []


def parse_list_frame(item: object) -> dict[str, Any] | None:
    """One ptdbg_ascend frame `[path, line, function, code]` as a frame."""
    if not isinstance(item, (list, tuple)) or len(item) < 3:
        return None
    try:
        line = int(item[1])
    except (TypeError, ValueError):
        line = 0
    code = item[3] if len(item) > 3 else ""
    if isinstance(code, list):  # inspect's code_context, when written unprocessed
        code = code[0] if code else ""
    return {"file": str(item[0]), "line": line, "function": str(item[2]),
            "code": (code or "").strip()}


def user_frames(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Frames outside torch / the dump tool / the standard library, innermost first."""
    kept = [f for f in frames if not is_internal(f["file"])]
    return kept or frames
