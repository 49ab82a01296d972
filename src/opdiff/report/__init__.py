"""Turn a CompareResult into files and screens. Nothing here recomputes a metric.

    from opdiff.report import write_outputs
    result.files = write_outputs(result, "./out")   # {"csv", "summary", "html", "rows"}

- `columns`, `csv_report`: the msprobe-style CSV, its columns from one table
- `rows`, `summary`: rows.jsonl and summary.json, which load back (`summary.load_summary`)
- `html` (with `payload` and the report_*.js/css assets): the self-contained report.html
- `console`: the terminal summary, the verdict line and the progress bar
- `outputs`: the output directory: what opdiff wrote there, written atomically
"""
from __future__ import annotations

import logging
import os
from datetime import datetime

from . import outputs

log = logging.getLogger("opdiff")


def _stamp() -> str:
    return datetime.now().strftime("%Y%m%d%H%M%S")


def write_outputs(result, output_path) -> dict:
    """Write compare_result_{timestamp}.csv, summary.json, report.html and rows.jsonl into the
    directory output_path and return the map of what was written: {"csv", "summary", "html",
    "rows"} to paths ("html" absent when the page could not be written). `result` is left
    as it is; summary.json and the page list the files.

    What opdiff provably wrote into output_path before (an earlier compare's CSV, an `opdiff
    onnx` dump) is removed first, the user's own files are not (`opdiff.report.outputs`); a
    summary.json, report.html or rows.jsonl that opdiff did not write is an OutputConflict
    (nothing is overwritten), a CSV of the same name gets a suffix.
    """
    from .csv_report import write_csv
    from .html import write_html
    from .rows import write_rows
    from .summary import write_summary

    with outputs.session(output_path, keep=(result.target, result.golden)) as out:
        stamp = _stamp()
        csv_path = out / f"compare_result_{stamp}.csv"
        n = 1
        while os.path.lexists(csv_path):
            csv_path = out / f"compare_result_{stamp}_{n}.csv"
            n += 1
        files = {"csv": str(csv_path), "summary": str(out / "summary.json"),
                 "html": str(out / "report.html"), "rows": str(out / "rows.jsonl")}
        outputs.remember(out, files.values())
        try:
            write_csv(result, csv_path)
            write_rows(result.rows, files["rows"])
            try:
                write_html(result, files["html"], files=files)
            except Exception as exc:  # the CSV and summary are still worth having
                log.warning("opdiff: writing report.html failed (%s)", exc)
                files.pop("html")
            write_summary(result, files["summary"], files=files)
        except BaseException as exc:  # Ctrl-C, a full disk: never a part that looks whole
            _say_missing(out, files, exc)
            raise
    return files


def _say_missing(out, files: dict, exc: BaseException) -> None:
    """One warning: which of the compare's files an interrupted write left in OUT, and which it
    did not write. Each is written whole or not at all (`outputs.atomic_open`), and what an
    earlier run wrote was removed when the session began: a file there is this run's, whole."""
    there = [os.path.basename(files[k]) for k in ("csv", "rows", "html", "summary")
             if k in files and os.path.exists(files[k])]
    missing = [os.path.basename(files[k]) for k in ("csv", "rows", "html", "summary")
               if k in files and not os.path.exists(files[k])]
    if not missing:
        return
    why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"stopped ({exc})"
    log.warning("opdiff: writing the compare's files into %s was %s: %s %s not written%s; "
                "compare again for a whole set", out, why, ", ".join(missing),
                "is" if len(missing) == 1 else "are",
                f" ({', '.join(there)} {'is' if len(there) == 1 else 'are'} there)"
                if there else "")


__all__ = ["write_outputs"]
