"""`report.html`: one self-contained page that shows a CompareResult.

The page opens with the verdict (the culprit, why, the user's source line, what differs in the
environment), then a chart of error along execution order, the module tree coloured by worst
verdict, and the full table (sortable, filterable, each row linked to its stack)::

    from opdiff.report.html import write_html
    write_html(result, "out/report.html")

Nothing is recomputed here: the page only presents what the CompareResult holds, packed by
`opdiff.report.payload`. Everything a dump controls (names, paths, source code) travels as JSON
inside a `<script type="application/json">` block and is put on the page with `textContent` by
the embedded script, and a Content-Security-Policy allows only that script (by hash) and no
network at all, so a hostile dump cannot run code in the page. The table renders only the rows
in view, so tens of thousands of rows open quickly.

A many-rank result whose rows stream from disk (`opdiff.comparison.spool`) and number more than
`PAGE_ROWS` is drawn with a bounded table: every row that is not a pass, and the pass rows of the
first divergence's step/rank, up to `PAGE_ROWS`; a note on the page says so, and the CSV and
rows.jsonl hold every row. The page (and the memory it takes to build) stays bounded however
many ranks were compared.

The script is kept in parts (`SCRIPT_PARTS`, drawn in that order), joined here into one function
body: one script, one hash.
"""
from __future__ import annotations

import base64
import hashlib
import html
import json
import logging
import re
from pathlib import Path
from typing import Any, Optional

from dataclasses import replace

from ..comparison.result import PASS, CompareResult, Note
from ..comparison.spool import on_disk
from ..errors import OpdiffError
from .outputs import atomic_write_text
from .heatmap import heatmap_section
from .layouts import layouts_section
from .payload import build_payload

log = logging.getLogger("opdiff")

_ASSETS = Path(__file__).resolve().parent
SCRIPT_PARTS = ("report.js", "report_chart.js", "report_table.js", "report_main.js")
# Characters that could end the <script> block or an HTML comment, and the two line separators
# that older JavaScript parsers treat as newlines.
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                 "\u2028": "\\u2028", "\u2029": "\\u2029"}
_JSON_UNSAFE = re.compile("[<>&\u2028\u2029]")
# The most rows the page's table holds for a result streamed from disk.
PAGE_ROWS = 5_000


def write_html(result: CompareResult, path, files: Optional[dict] = None) -> Path:
    """Write `result` as one self-contained HTML file at `path` and return its path.

    `path` may be an existing directory, in which case the file is `report.html` inside it.
    `files` (default `result.files`) are the files written beside it, linked from the page. The
    file is written to a temporary name first and renamed, so a failed write never leaves a
    half-written report in place of an older one; its mode follows the umask, like the CSV's.
    """
    if not isinstance(result, CompareResult):
        raise TypeError(f"write_html needs a CompareResult, got {type(result).__name__}")
    path = Path(path)
    if path.is_dir():
        path = path / "report.html"
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise OpdiffError(f"cannot write the HTML report: {parent} is a file, not a directory; "
                          "choose another output path")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OpdiffError(f"cannot create {parent} for the HTML report ({exc.strerror}); "
                          "choose a writable output path") from exc
    page = render_html(result, files)
    atomic_write_text(path, page, "the HTML report")
    log.info("opdiff: wrote %s (%d rows, %.1f MB)", path, len(result.rows), len(page) / 1e6)
    return path


def render_html(result: CompareResult, files: Optional[dict] = None) -> str:
    """The report page as a string (what `write_html` writes)."""
    script = report_script()
    style = (_ASSETS / "report.css").read_text(encoding="utf-8")
    template = (_ASSETS / "report_template.html").read_text(encoding="utf-8")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    values = {
        "TITLE": html.escape(f"{result.title}: {_culprit_title(result)}"),
        "SCRIPT_HASH": f"sha256-{digest}",
        "STYLE": style,
        "DATA": json_for_script(build_payload(page_view(result), files)),
        "SCRIPT": script,
        "HEATMAP": heatmap_section(result),
        "LAYOUTS": layouts_section(result),
    }
    # One pass, so text substituted for one placeholder is never scanned for another.
    return re.sub(r"%%([A-Z_]+)%%", lambda m: values[m.group(1)], template)


def page_view(result: CompareResult, limit: int = PAGE_ROWS) -> CompareResult:
    """The result the page draws: `result` itself, or, when its rows stream from disk and number
    more than `limit`, a copy holding the rows that are not a pass and the pass rows of the
    first divergence's step/rank (in order, at most `limit`), with a note saying so."""
    if not on_disk(result.rows) or len(result.rows) <= limit:
        return result
    fd = result.first_divergence
    home = (fd.step, fd.rank) if fd is not None else None
    kept = []
    for r in result.rows:
        if r.result != PASS or (home is not None and (r.step, r.rank) == home):
            kept.append(r)
            if len(kept) >= limit:
                break
    where = f" and the pass rows of step {home[0]} rank {home[1]}" if home else ""
    note = (f"the page shows {len(kept)} of {len(result.rows)} rows (those that are not a pass"
            f"{where}); the CSV and rows.jsonl hold every row")
    return replace(result, rows=kept, notes=list(result.notes) + [Note(note, Note.REPORT)])


def report_script() -> str:
    """The page's script: the parts in `SCRIPT_PARTS`, in one strict-mode function."""
    parts = [(_ASSETS / name).read_text(encoding="utf-8") for name in SCRIPT_PARTS]
    return '(function () {\n  "use strict";\n' + "\n".join(parts) + "})();\n"


def json_for_script(obj: Any) -> str:
    """JSON that is safe inside a <script> element: `<`, `>`, `&`, U+2028/2029 are escaped."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return _JSON_UNSAFE.sub(lambda m: _JSON_ESCAPES[m.group(0)], text)


def _culprit_title(result: CompareResult) -> str:
    d = result.first_divergence
    return f"first divergence at {d.name}" if d is not None else "no divergence"


__all__ = ["write_html", "render_html", "page_view", "PAGE_ROWS", "report_script", "json_for_script", "SCRIPT_PARTS"]
