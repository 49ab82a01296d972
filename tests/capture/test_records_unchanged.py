"""What capture records is unchanged for the benchmark models: names, kinds, descriptors,
producers, leaves and call sites against the fingerprint committed from the code it names
(tests/capture/records_fingerprint.py; regenerate only for a change that is meant); statistics
against the float64 statistics of the same tensors, saved on this machine in the same test
(a committed float would hold the kernels of the CPU it was written on)."""
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
    stats_dir = tmp_path / case[0] / "step1" / "rank0"
    if case[3] == "tensor":
        tensor_dir = stats_dir
    else:
        twin = (f"{case[0]}-tensor", case[1], case[2], "tensor")
        fp.run_case(twin, tmp_path)
        tensor_dir = tmp_path / twin[0] / "step1" / "rank0"
    problems, checked = fp.statistics_problems(stats_dir, tensor_dir)
    assert checked >= found["count"] // 2, f"{case[0]}: only {checked} tensors' statistics checked"
    assert not problems, f"{case[0]}: statistics that are not their tensors':\n  " + "\n  ".join(problems)


def test_a_changed_statistic_or_descriptor_is_found(tmp_path):
    """The comparison itself can fail: one statistic nudged by 1e-4 of its size, one descriptor's
    dtype."""
    case = fp.CASES[-1]             # the tensor task: the run is its own reference
    rank_dir = tmp_path / case[0] / "step1" / "rank0"
    fp.run_case(case, tmp_path)
    expected, names = fp.record_rows(rank_dir)
    problems, checked = fp.statistics_problems(rank_dir, rank_dir)
    assert problems == [] and checked > 0
    lines = (rank_dir / "records.jsonl").read_text().splitlines()
    record = json.loads(lines[5])
    desc = next(d for d in record["outputs"] if d.get("stats"))
    stats_dir = tmp_path / "nudged"
    stats_dir.mkdir()
    desc["stats"]["norm"] *= 1 + 1e-4
    (stats_dir / "records.jsonl").write_text("\n".join(lines[:5] + [json.dumps(record)] + lines[6:]))
    problems, _ = fp.statistics_problems(stats_dir, rank_dir)
    assert len(problems) == 1 and names[5] in problems[0] and "norm" in problems[0]
    desc["dtype"] = "float16"
    (rank_dir / "records.jsonl").write_text("\n".join(lines[:5] + [json.dumps(record)] + lines[6:]))
    found, _ = fp.record_rows(rank_dir)
    assert any("content" in p for p in fp.differences(expected, found, names))
    assert fp.differences(expected, expected, names) == []
