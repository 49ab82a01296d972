"""A divergence carried over from an earlier step says which step as a field
(`Divergence.carried_from`), which `is_carried_over` reads instead of the reason's words; a
summary.json of an older opdiff, which said it only in words, is read back with the same field
(report/summary.py, the one place that reads those words)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import opdiff
from opdiff.comparison.origins import is_carried_over
from opdiff.report.summary import load_summary

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "origins"))
from test_carried_over import three_steps  # noqa: E402


def test_carried_from_is_a_field_and_old_summaries_read_it_from_their_words(tmp_path):
    result = opdiff.compare(three_steps(tmp_path / "t", fault=True),
                            three_steps(tmp_path / "g", fault=False), tmp_path / "out",
                            progress=False, replay="off")
    later = {p["step"]: p["first_divergence"] for p in result.pairs if p["step"] > 0}
    assert {s: fd.carried_from for s, fd in later.items()} == {1: 0, 2: 0}
    assert all(is_carried_over(fd) for fd in later.values())
    summary = tmp_path / "out" / "summary.json"
    data = json.loads(summary.read_text())
    saved = {p["step"]: p["first_divergence"]["carried_from"] for p in data["pairs"]
             if p["step"] > 0}
    assert saved == {1: 0, 2: 0}
    for p in data["pairs"]:         # as an older opdiff wrote it: the words alone
        if p["first_divergence"]:
            p["first_divergence"].pop("carried_from")
    summary.write_text(json.dumps(data))
    old = {p["step"]: p["first_divergence"] for p in load_summary(summary).pairs
           if p["step"] > 0}
    assert {s: fd["carried_from"] for s, fd in old.items()} == {1: 0, 2: 0}
