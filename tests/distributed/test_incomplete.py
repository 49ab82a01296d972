"""A dump root where a rank crashed just as a step began: every complete pair is compared, the
empty ones are named (notes, summary.json), and only a root with nothing comparable is exit 2.

The dumps are real: a small MLP recorded for two steps by PrecisionDebugger; the rank1
directories are copies of rank0's (no process group needed to lay out a two-rank root)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import opdiff
from opdiff.cli import main

pytestmark = pytest.mark.slow


def _copy(root: Path, to: Path) -> Path:
    shutil.copytree(root, to)
    return to


def test_an_empty_rank_is_named_and_every_other_pair_compared(roots, tmp_path, capsys):
    target = _copy(roots[0], tmp_path / "t")
    (target / "step1" / "rank1" / "records.jsonl").write_text("")      # SIGKILLed at step start
    assert main(["compare", str(target), str(roots[1]), "-o", str(tmp_path / "out"),
                 "--no-progress"]) == 0
    said = capsys.readouterr()
    assert "step 1 rank 1: the target holds no op records" in said.out + said.err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    from opdiff import schemas

    schemas.validate("compare-summary", summary)     # an incomplete pair writes null dumps
    assert summary["incomplete"] == [{"step": 1, "rank": 1, "side": "target",
                                      "why": summary["incomplete"][0]["why"]}]
    pairs = {(p["step"], p["rank"]): p for p in summary["pairs"]}
    assert sorted(pairs) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert pairs[(1, 1)]["incomplete"]["side"] == "target" and pairs[(1, 1)]["counts"] == {}
    for key in [(0, 0), (0, 1), (1, 0)]:          # the fault is found in every complete pair
        assert pairs[key]["incomplete"] is None
        assert pairs[key]["first_divergence"]["op"] == "Functional.gelu"
    assert summary["first_divergence"]["step"] == 0 and summary["first_divergence"]["rank"] == 0


def test_a_missing_rank_directory_is_incomplete_too(roots, tmp_path):
    golden = _copy(roots[1], tmp_path / "g")
    shutil.rmtree(golden / "step1" / "rank0")
    result = opdiff.compare(str(roots[0]), str(golden))
    assert [(i["step"], i["rank"], i["side"]) for i in _incomplete(result)] == [(1, 0, "golden")]
    assert len([p for p in result.pairs if not p["incomplete"]]) == 3


def _incomplete(result):
    return [{"step": p["step"], "rank": p["rank"], **p["incomplete"]}
            for p in result.pairs if p["incomplete"]]


def test_nothing_comparable_is_exit_2(roots, tmp_path, capsys):
    target = _copy(roots[0], tmp_path / "t")
    for records in target.glob("step*/rank*/records.jsonl"):
        records.write_text("")
    assert main(["compare", str(target), str(roots[1]), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "no step/rank pair can be compared" in err and "Traceback" not in err
