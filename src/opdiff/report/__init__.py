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
        write_csv(result, csv_path)
        write_rows(result.rows, files["rows"])
        try:
            write_html(result, files["html"], files=files)
        except Exception as exc:  # the CSV and summary are still worth having
            log.warning("opdiff: writing report.html failed (%s)", exc)
            files.pop("html")
        write_summary(result, files["summary"], files=files)
    return files


__all__ = ["write_outputs"]
