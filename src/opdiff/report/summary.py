"""summary.json: the machine-readable outcome of a compare (DESIGN.md's schema, plus extras).

    {"first_divergence": null | {"name", "op", "phase", "reason",
                                 "location": {"file", "line", "code", "function"},
                                 "metrics", "tensor", "input_metrics", "module", "step", "rank",
                                 "context": [[line, text], ...]},
     "counts": {"pass", "warning", "error", "unmatched"},
     "target", "golden", "environment_diff": [{"key", "target", "golden"}],
     "verdict": "one sentence", "pairs": [{"step", "rank", "counts", "first_divergence"}],
     "notes": [...], "worst": [the 10 tensors with the largest error], "files": {...}}

Non-finite numbers are written as the strings "NaN", "Infinity", "-Infinity" (strict JSON).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from ..store.records import encode_float


def _clean(v):
    if isinstance(v, float):
        return encode_float(v)
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if v is None or isinstance(v, (str, int, bool)):
        return v
    return str(v)


def _location(loc):
    if loc is None:
        return None
    return {"file": loc.file, "line": loc.line, "code": loc.code, "function": loc.function}


def summary_dict(result) -> dict:
    """The summary as a plain dict (what summary.json holds)."""
    fd = result.first_divergence
    first = None
    if fd is not None:
        first = {"name": fd.name, "op": fd.op, "phase": fd.phase, "reason": fd.reason,
                 "location": _location(fd.location), "metrics": fd.metrics, "tensor": fd.tensor,
                 "input_metrics": fd.input_metrics, "module": fd.module, "step": fd.step,
                 "rank": fd.rank, "context": [list(c) for c in fd.context]}
    scored = [r for r in result.rows if r.error is not None and r.result in ("error", "warning")]
    scored.sort(key=lambda r: (r.error if not math.isnan(r.error) else math.inf), reverse=True)
    worst = [{"name": r.target_name, "result": r.result, "error": r.error,
              "cosine": r.metrics.get("Cosine"), "max_abs_err": r.metrics.get("MaxAbsErr"),
              "reason": r.reason, "step": r.step, "rank": r.rank} for r in scored[:10]]
    return _clean({
        "first_divergence": first, "counts": dict(result.counts), "target": result.target,
        "golden": result.golden, "environment_diff": result.environment_diff,
        "verdict": result.verdict, "title": result.title, "step": result.step,
        "rank": result.rank, "pairs": result.pairs, "notes": result.notes, "worst": worst,
        "files": result.files})


def write_summary(result, path) -> Path:
    path = Path(path)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary_dict(result), indent=2, allow_nan=False, ensure_ascii=False))
    os.replace(tmp, path)
    return path
