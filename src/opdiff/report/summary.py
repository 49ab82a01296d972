"""summary.json: the machine-readable outcome of a compare, and loading it back into a
CompareResult.

    {"first_divergence": null | {"name", "op", "phase", "reason",
                                 "location": {"file", "line", "code", "function"},
                                 "metrics", "tensor", "input_metrics", "module", "step", "rank",
                                 "context": [[line, text], ...], ...every other Divergence field},
     "counts": {"pass", "warning", "error", "unmatched"},
     "target", "golden", "environment_diff": [{"key", "target", "golden"}],
     "verdict": "one sentence",
     "pairs": [{"step", "rank", "target", "golden", "counts",
                "first_divergence": null | {the same fields as the top-level one},
                "incomplete": null | {"side", "why"},        (one per step/rank pair)
                "cut": null | [{"side", "why", "records", "last_record"}]}],  (a side ends early)
     "incomplete": [{"step", "rank", "side", "why"}         (pairs not compared: a side held no ops)
                    | {"step", "rank", "side", "why": "killed" | "disk full" | "write failed",
                       "records", "last_record", "compared": true}],   (compared up to the cut)
     "notes": [...], "note_kinds": [each note's kind, `Note.KINDS`],
     "facts": [{"step", "rank", "withheld": [record], "exposed": [record],
                "regions": [{"number", "phase", "inputs": [row], ...}], "forced": [...]}],
                                   (what a pair's plan decided that rejudge needs: PairFacts)
     "worst": [the 10 tensors with the largest error], "files": {...},
     "evidence": {"verdict", "culprit", "confidence", "facts", "next"}}   (`opdiff.explain`)

Non-finite numbers are written as the strings "NaN", "Infinity", "-Infinity" (strict JSON).
The rows are not in summary.json (it stays small): "files" names rows.jsonl beside it
(`opdiff.report.rows`), and `load_summary` reads both::

    from opdiff.report.summary import load_summary
    result = load_summary("out/summary.json")    # a CompareResult, rows included
"""
from __future__ import annotations

import dataclasses
import heapq
import json
import math
import os
from pathlib import Path
from typing import Any

from ..comparison.facts import PairFacts
from ..comparison.layouts.facts import LayoutFacts
from ..comparison.tokens.where import TokenErrors
from ..comparison.origins import CARRIED
from ..comparison.result import CompareResult, Divergence, Note, Origin, note_kind
from ..errors import DumpError
from ..explain import evidence_of
from ..store.records import SCHEMA_VERSION, decode_float, encode_float, json_text
from ..store.schema import Location
from .outputs import atomic_write_text
from .rows import read_rows

# CompareResult fields summary.json holds under their own name (rows and first_divergence apart).
_RESULT_FIELDS = ("target", "golden", "counts", "environment_diff", "verdict", "title", "step",
                  "rank", "pairs", "notes", "files", "coverage")
_NUMBER_DICTS = ("metrics", "input_metrics")     # Divergence fields holding numbers by name


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


def _divergence(fd) -> dict | None:
    if fd is None:
        return None
    first = {f.name: getattr(fd, f.name) for f in dataclasses.fields(fd)}
    first["location"] = _location(fd.location)
    first["context"] = [list(c) for c in fd.context]
    return first


def _pair(p: dict) -> dict:
    """A pairs entry with its first divergence as the top-level one's fields (an entry loaded
    back from summary.json holds that dict already)."""
    fd = p.get("first_divergence")
    return {**p, "first_divergence": _divergence(fd) if isinstance(fd, Divergence) else fd}


def summary_dict(result, files: dict | None = None) -> dict:
    """The summary as a plain dict (what summary.json holds); `files` (default `result.files`)
    is the map of files written beside it."""
    # The 10 largest in one pass (a many-rank result's rows stream from disk); nlargest keeps
    # the order a stable descending sort gives.
    scored = heapq.nlargest(10, (r for r in result.rows if r.error is not None
                                 and r.result in ("error", "warning")),
                            key=lambda r: (r.error if not math.isnan(r.error) else math.inf))
    worst = [{"name": r.target_name, "result": r.result, "error": r.error,
              "cosine": r.metrics.get("Cosine"), "max_abs_err": r.metrics.get("MaxAbsErr"),
              "reason": r.reason, "step": r.step, "rank": r.rank} for r in scored]
    out: dict[str, Any] = {"schema_version": SCHEMA_VERSION,
                           "first_divergence": _divergence(result.first_divergence)}
    out.update({name: getattr(result, name) for name in _RESULT_FIELDS})
    out["counts"] = dict(result.counts)
    out["note_kinds"] = [note_kind(n) for n in result.notes]
    out["pairs"] = [_pair(p) for p in result.pairs or [] if isinstance(p, dict)]
    out["incomplete"] = [{"step": p.get("step"), "rank": p.get("rank"), **p["incomplete"]}
                         for p in out["pairs"] if p.get("incomplete")]
    out["incomplete"] += [{"step": p.get("step"), "rank": p.get("rank"), **c, "compared": True}
                          for p in out["pairs"] for c in p.get("cut") or []]
    out["worst"] = worst
    out["facts"] = [f.to_json() for f in getattr(result, "facts", ()) if f]
    if getattr(result, "token_errors", None) is not None:
        out["token_errors"] = result.token_errors.to_json()
    out["layouts"] = [f.to_json() for f in getattr(result, "layouts", ())]
    out["files"] = dict(result.files if files is None else files)
    out["evidence"] = evidence_of(result)
    return _clean(out)


def write_summary(result, path, files: dict | None = None) -> Path:
    """Write summary.json for `result` at `path`, listing `files` (default `result.files`)."""
    text = json_text(summary_dict(result, files), indent=2)
    return atomic_write_text(path, text, "summary.json")


def load_summary(path) -> CompareResult:
    """The CompareResult a summary.json (or the directory holding it) describes, with its rows
    read from the rows.jsonl it lists: what re-judging with new thresholds needs, metrics and
    dtypes included. A DumpError when the files are missing or are not opdiff's."""
    path = Path(os.fspath(path))
    if path.is_dir():
        path = path / "summary.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DumpError(f"{path}: cannot read the summary ({exc.strerror})") from exc
    except ValueError as exc:
        raise DumpError(f"{path}: not a summary.json written by opdiff ({exc})") from exc
    if not isinstance(data, dict) or "counts" not in data:
        raise DumpError(f"{path}: not a summary.json written by opdiff")
    files = data.get("files") or {}
    if not files.get("rows"):
        raise DumpError(f"{path}: lists no rows.jsonl (written by an older opdiff); compare "
                        "again to get a result that loads back")
    # Paths in "files" are as the writer saw them; the rows lie beside the summary.
    rows = read_rows(path.parent / os.path.basename(files["rows"]))
    known = {f.name for f in dataclasses.fields(CompareResult)}
    kwargs = {k: data[k] for k in _RESULT_FIELDS if k in data and k in known}
    kwargs["notes"] = _notes(data.get("notes") or [], data.get("note_kinds"))
    for p in kwargs.get("pairs") or []:
        fd = p.get("first_divergence") if isinstance(p, dict) else None
        if isinstance(fd, dict) and "carried_from" not in fd:   # (an older opdiff: its words)
            fd["carried_from"] = _carried_from(fd.get("origin"), fd.get("reason"))
    facts = data.get("facts")
    kwargs["facts"] = [f for f in map(PairFacts.from_json, facts if isinstance(facts, list) else [])
                       if f is not None]
    kwargs["token_errors"] = TokenErrors.from_json(data.get("token_errors"))
    laid = data.get("layouts")      # (absent in files of an older opdiff)
    kwargs["layouts"] = [f for f in map(LayoutFacts.from_json, laid if isinstance(laid, list)
                                        else []) if f is not None]
    return CompareResult(rows=rows, first_divergence=_load_divergence(data.get("first_divergence")),
                         **kwargs)


# What an opdiff that wrote no "note_kinds" said in the notes re-judging drops (`rejudge.STALE`),
# and its inconclusive notes (the verdict line says them):
# recognised once, here where such a file is read, so nothing after it reads a note's words.
_OLD_WORDS = ((Note.THRESHOLDS, lambda n: "statistics only" in n),
              (Note.REPLAY, lambda n: n.startswith("replayed ") or ": replayed " in n),
              (Note.REJUDGED, lambda n: n.startswith("re-judged from the saved metrics")),
              (Note.INCONCLUSIVE, lambda n: n.startswith("inconclusive:") or ": inconclusive: " in n))


def _notes(texts: list, kinds) -> list[str]:
    """summary.json's notes as `Note`s of their kinds ("note_kinds"; an unknown kind is OTHER)."""
    if not isinstance(kinds, list) or len(kinds) != len(texts):
        kinds = [next((kind for kind, said in _OLD_WORDS if said(str(t))), Note.OTHER)
                 for t in texts]
    return [Note(str(t), k if k in Note.KINDS else Note.OTHER) for t, k in zip(texts, kinds)]


def _load_divergence(d: dict | None) -> Divergence | None:
    if not d:
        return None
    known = {f.name for f in dataclasses.fields(Divergence)}
    kw = {k: v for k, v in d.items() if k in known}
    loc = kw.get("location")
    kw["location"] = None if loc is None else Location(**{
        k: v for k, v in loc.items() if k in ("file", "line", "code", "function")})
    kw["context"] = tuple(tuple(c) for c in kw.get("context") or ())
    for name in _NUMBER_DICTS:
        if isinstance(kw.get(name), dict):
            kw[name] = {k: decode_float(v) for k, v in kw[name].items()}
    if "carried_from" not in d:     # an older opdiff said it in the reason only
        kw["carried_from"] = _carried_from(kw.get("origin"), kw.get("reason"))
    return Divergence(**kw)


def _carried_from(origin: object, reason: object) -> int | None:
    """The step a divergence of an older summary.json was carried over from, from its words."""
    if origin != Origin.PARAMETER or not isinstance(reason, str) or CARRIED not in reason:
        return None
    step = reason.split(CARRIED, 1)[1].split(",")[0].strip()
    return int(step) if step.isdigit() else None


__all__ = ["summary_dict", "write_summary", "load_summary"]
