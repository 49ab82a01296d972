"""Turn a CompareResult into files and screens. Nothing here recomputes a metric.

    from opdiff.report import write_outputs
    files = write_outputs(result, "./out")   # {"csv": ..., "summary": ..., "html": ...}
"""
from __future__ import annotations

import logging
import os
from datetime import datetime
from pathlib import Path

from ..errors import ConfigError

log = logging.getLogger("opdiff")


def write_outputs(result, output_path) -> dict:
    """Write compare_result_{timestamp}.csv, summary.json and (when the HTML reporter is
    installed) report.html into the directory output_path; returns {"csv", "summary", "html"}.

    An existing CSV is never overwritten (a suffix is added); summary.json and report.html are
    opdiff's own fixed names and are replaced by the newest compare.
    """
    from .csv_report import write_csv
    from .summary import write_summary

    out = Path(os.fspath(output_path))
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a directory; pass a directory for the output")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{out}: cannot create the output directory ({exc.strerror})") from None
    stamp = datetime.now().strftime("%Y%m%d%H%M%S")
    csv_path = out / f"compare_result_{stamp}.csv"
    n = 1
    while csv_path.exists():
        csv_path = out / f"compare_result_{stamp}_{n}.csv"
        n += 1
    files = {"csv": str(write_csv(result, csv_path))}
    result.files = dict(files)
    files["summary"] = str(out / "summary.json")
    result.files = dict(files)
    try:
        from .html import write_html
    except ImportError:
        log.info("opdiff: HTML reporter not available; report.html not written")
    else:
        html_path = out / "report.html"
        files["html"] = str(html_path)
        result.files = dict(files)
        try:
            write_html(result, html_path)
        except Exception as exc:  # the CSV and summary are still worth having
            log.warning("opdiff: writing report.html failed (%s)", exc)
            files.pop("html")
    result.files = dict(files)
    write_summary(result, out / "summary.json")
    return files
