"""What capture records is unchanged for the benchmark models: names, kinds, descriptors,
producers, leaves, call sites and statistics, against the fingerprint committed from the code
it names (tests/capture/records_fingerprint.py; regenerate only for a change that is meant)."""
from __future__ import annotations

import json

import pytest

import records_fingerprint as fp

EXPECTED = json.loads(fp.DATA.read_text())


@pytest.mark.parametrize("case", fp.CASES, ids=[c[0] for c in fp.CASES])
def test_records_match_the_committed_fingerprint(case, tmp_path):
    found, names = fp.run_case(case, tmp_path)
    problems = fp.differences(EXPECTED["cases"][case[0]], found, names)
    assert not problems, (f"{case[0]}: the records differ from those of commit "
                          f"{EXPECTED['generated_from'][:10]}:\n  " + "\n  ".join(problems))


def test_a_changed_statistic_or_descriptor_is_found(tmp_path):
    """The comparison itself can fail: one statistic nudged by 1%, one descriptor's dtype."""
    case = fp.CASES[0]
    rank_dir = tmp_path / case[0] / "step1" / "rank0"
    fp.run_case(case, tmp_path)
    expected, names = fp.record_rows(rank_dir)
    lines = (rank_dir / "records.jsonl").read_text().splitlines()
    record = json.loads(lines[5])
    desc = next(d for d in record["outputs"] if d.get("stats"))
    desc["stats"]["norm"] *= 1.01
    (rank_dir / "records.jsonl").write_text("\n".join(lines[:5] + [json.dumps(record)] + lines[6:]))
    found, _ = fp.record_rows(rank_dir)
    assert any("statistics changed" in p and names[5] in p for p in fp.differences(expected, found, names))
    desc["dtype"] = "float16"
    (rank_dir / "records.jsonl").write_text("\n".join(lines[:5] + [json.dumps(record)] + lines[6:]))
    found, _ = fp.record_rows(rank_dir)
    assert any("content" in p for p in fp.differences(expected, found, names))
    assert fp.differences(expected, expected, names) == []
