"""What `opdiff check -o OUT` writes: check_result_{timestamp}.csv, summary.json, report.html.

    from opdiff.check.outputs import write_check_outputs
    files = write_check_outputs(result, "./out")       # {"csv", "summary", "html"}

The CSV has one row per op and output (ops that could not be checked: one row with the
reason). The HTML page is the compare's (`opdiff.report.html`), fed a CompareResult titled
"opdiff check" whose rows are the checked outputs and whose first divergence is the first
failure, so it shows the same verdict box, source context and table. OUT is prepared through
`opdiff.report.outputs`: what opdiff wrote there before goes, the user's files stay.
"""
from __future__ import annotations

import contextlib
import json
import logging
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator, Optional

from ..comparison.reasons import source_context
from ..comparison.result import ERROR, PASS, REPLAY, CompareResult, Divergence, TensorRow, count
from ..report import outputs
from ..report.csv_report import safe_writer
from ..store.records import SCHEMA_VERSION, json_text, strict_json
from .engine import NOT_CHECKED, CheckResult

log = logging.getLogger("opdiff")

PROGRESS = "check_progress.jsonl"
CSV_COLUMNS = ("index", "name", "op", "phase", "tensor", "dtype", "numel", "standard", "status",
               "target_error", "reference_error", "ratio", "reference", "reason", "location",
               "metrics")


def csv_rows(result: CheckResult) -> list[list[Any]]:
    """The CSV's rows (without the header)."""
    rows: list[list[Any]] = []
    for op in result.ops:
        where = f"{op.location.file}:{op.location.line}" if op.location else ""
        if op.status == NOT_CHECKED or not op.outputs:
            rows.append([op.index, op.name, op.op, op.phase, "", "", "", "", op.status, "", "",
                         "", op.reference, op.reason, where, ""])
            continue
        for o in op.outputs:
            ratio = o.ratio
            rows.append([op.index, op.name, op.op, op.phase, o.name, o.dtype, o.numel, o.standard,
                         o.status, repr(o.error), repr(o.reference_error),
                         "" if ratio is None else repr(ratio), op.reference, o.reason, where,
                         json.dumps(strict_json(o.metrics), sort_keys=True)])
    return rows


def as_compare_result(result: CheckResult, source_root: Optional[str] = None) -> CompareResult:
    """The CompareResult the compare's HTML writer shows for a check."""
    from ..comparison.metric_table import METRICS

    rows = []
    for op in result.checked:
        for o in op.outputs:
            rows.append(TensorRow(
                target_name=o.name, golden_name=f"{o.name} (float64 replay)", op_name=op.name,
                role="output", phase=op.phase, kind="api", index=op.index,
                target_dtype=o.dtype, golden_dtype="float64",
                metrics={k: o.metrics.get(k) for k in METRICS},
                result=ERROR if o.status == "fail" else PASS,
                accuracy_reached="No" if o.status == "fail" else "Yes",
                reason=o.reason or f"{o.standard} standard met", module=op.module,
                stack=(op.location,) if op.location else (), error=o.error,
                scale_error=o.metrics.get("scale_error")))
    first = result.first_failure
    divergence: Optional[Divergence] = None
    if first is not None:
        w = first.worst
        divergence = Divergence(
            name=first.name, op=first.op, phase=first.phase, reason=first.reason,
            location=first.location, metrics=dict(w.metrics) if w else {},
            tensor=w.name if w else None, module=first.module,
            context=source_context(first.location, source_root=source_root,
                                   dumps=(result.dump,)), kind=REPLAY)
    return CompareResult(target=result.dump, golden="float64 replay on the CPU", rows=rows,
                         first_divergence=divergence, counts=count(rows), title="opdiff check",
                         verdict=verdict(result), notes=not_checked_notes(result) + result.notes)


def verdict(result: CheckResult) -> str:
    """One line: what the check found."""
    first = result.first_failure
    head = f"checked {len(result.checked)} op(s), {len(result.failures)} failed"
    if first is None:
        return head + ": every checked op is as accurate as a correct CPU kernel of its dtype"
    where = f" at {first.location.file}:{first.location.line}" if first.location else ""
    return f"{head}; first failure {first.name}{where}: {first.reason}"


def not_checked_notes(result: CheckResult, limit: int = 10) -> list[str]:
    """A line per op and reason that could not be checked (calls of one op left out for one
    reason are one line: 42 `zeros_like` calls are one story), the first `limit`, then a count."""
    groups: dict[tuple[str, str], list[str]] = {}
    for o in result.not_checked:
        groups.setdefault((o.op, o.reason), []).append(o.name)
    notes = [f"not checked: {names[0]}: {reason}" if len(names) == 1 else
             f"not checked: {op}, {len(names)} calls (first {names[0]}): {reason}"
             for (op, reason), names in list(groups.items())[:limit]]
    if len(groups) > limit:
        rest = sum(len(n) for n in list(groups.values())[limit:])
        notes.append(f"... and {rest} more op(s) not checked (see the CSV)")
    return notes


def write_check_outputs(result: CheckResult, out_dir: Any,
                        source_root: Optional[str] = None) -> dict[str, str]:
    """Write the CSV, summary.json and report.html into out_dir; return {"csv", "summary",
    "html"} ("html" absent when the page could not be written). The progress file of a
    `--resume`-able check (`PROGRESS`) is kept."""
    from ..report.html import write_html

    out = Path(out_dir)
    stamp = datetime.now().strftime("%Y%m%d%H%M%S")
    csv_path = out / f"check_result_{stamp}.csv"
    files = {"csv": str(csv_path), "summary": str(out / "summary.json"),
             "html": str(out / "report.html")}
    outputs.remember(out, files.values())
    with outputs.atomic_open(csv_path, "the CSV", newline="") as f:
        w = safe_writer(f)           # op names from the dump: no formulas
        w.writerow(CSV_COLUMNS)
        w.writerows(csv_rows(result))
    try:
        write_html(as_compare_result(result, source_root), files["html"], files=files)
    except Exception as exc:  # the CSV and summary are still worth having
        log.warning("opdiff: writing report.html failed (%s)", exc)
        files.pop("html")
    summary = {"schema_version": SCHEMA_VERSION, **result.summary(), "files": files}
    outputs.atomic_write_text(out / "summary.json",
                              json_text(summary, indent=1) + "\n", "summary.json")
    return files


@contextlib.contextmanager
def prepare(out_dir: Any, keep: tuple[Any, ...] = (), resume: bool = False) -> Iterator[Path]:
    """Hold OUT for the whole check (`opdiff.report.outputs.session`): what opdiff wrote there
    before goes (the progress file too, unless resuming), a summary.json or report.html opdiff
    did not write is refused before the check starts; yields OUT."""
    out = Path(out_dir)
    progress = out / PROGRESS
    with outputs.session(out, keep=(*keep, progress) if resume else keep) as out:
        outputs.remember(out, [out / "summary.json", out / "report.html"])
        outputs.make_file(progress)
        yield out
