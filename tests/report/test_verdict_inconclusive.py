"""The verdict line finds an inconclusive note by its kind: also when several step/rank pairs
are merged and the note is said again with where it holds, and when an old summary.json (no
"note_kinds") is loaded back."""
from __future__ import annotations

import json

from opdiff.comparison.result import CompareResult, Note, note_kind
from opdiff.comparison.runs import merge
from opdiff.report.console import verdict_line
from opdiff.report.summary import load_summary
from opdiff.report.rows import write_rows

WHY = "the target ran torch.compile'd code, whose graphs are recorded per graph"


def _pair(step: int, notes: list[str]) -> CompareResult:
    return CompareResult(target="t", golden="g", rows=[], first_divergence=None,
                         counts={"pass": 0, "warning": 0, "error": 0, "unmatched": 0},
                         step=step, rank=0, notes=notes)


def test_one_pairs_inconclusive_note_makes_the_merged_verdict_inconclusive():
    merged = merge("t", "g", [_pair(0, []), _pair(1, [Note(f"inconclusive: {WHY}",
                                                           Note.INCONCLUSIVE)])], [])
    said = [n for n in merged.notes if note_kind(n) == Note.INCONCLUSIVE]
    assert said and str(said[0]).startswith("step 1 rank 0: ")
    assert verdict_line(merged) == f"inconclusive: step 1 rank 0: {WHY}"


def test_a_note_that_only_mentions_the_word_does_not_make_the_verdict():
    result = _pair(0, [Note("inconclusive: a quoted word in a note of another kind", Note.OTHER)])
    assert verdict_line(result).startswith("no divergence")


def test_an_old_summary_keeps_its_inconclusive_verdict(tmp_path):
    write_rows([], tmp_path / "rows.jsonl")
    summary = {"target": "t", "golden": "g", "counts": {}, "first_divergence": None,
               "notes": [f"step 1 rank 0: inconclusive: {WHY}"],
               "files": {"rows": "rows.jsonl"}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    loaded = load_summary(tmp_path / "summary.json")
    assert verdict_line(loaded) == f"inconclusive: step 1 rank 0: {WHY}"
