"""Many pairs, rows on disk: the streamed compare (each pair's rows spooled by its worker, the
CSV, rows.jsonl and summary.json written by streaming them) gives exactly what the in-memory path
gives (every pair compared in this process, every row held, merged as a list), on real
multi-rank dumps, statistics and tensor; the spool reads back whole across chunks, pickles as a
list and is removed once nothing reads it; the page of a large streamed result stays bounded;
`--replay-jobs` gives the one-process answer."""
from __future__ import annotations

import gc
import json
import os
import pickle
import re
from dataclasses import replace
from pathlib import Path

import pytest
from rank_dumps import dump_ranks

import opdiff
from opdiff.comparison.pair import compare_pair
from opdiff.comparison.ranks import attribute_collectives
from opdiff.comparison.reasons import with_context
from opdiff.comparison.runs import merge, pair_dumps, split_incomplete, unpaired
from opdiff.comparison.spool import CHUNK, ChainedRows, PairRows, Spool, on_disk, write_pair
from opdiff.comparison.verdicts import Policy
from opdiff.report import write_outputs
from opdiff.report.console import verdict_line
from opdiff.report.html import page_view
from opdiff.store.adapters import discover

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stats_roots(tmp_path_factory):
    """3 ranks, each its own batch, a gelu fault on rank 2 of the target (statistics)."""
    tmp = tmp_path_factory.mktemp("stream")
    return tuple(dump_ranks(tmp / name, task="statistics", ranks=3, hidden=2, faulty=faulty,
                            call=1, own_inputs=True)
                 for name, faulty in (("target", {2}), ("golden", set())))


def _in_memory(target: str, golden: str, out: Path):
    """The compare as it was before rows were spooled: every row in this process's memory."""
    targets, goldens = discover(target), discover(golden)
    pairs, notes = pair_dumps(targets, goldens)
    pairs, incomplete = split_incomplete(pairs)
    incomplete += unpaired(targets, goldens)
    results = [compare_pair(t, g, policy=Policy()) for t, g in pairs]
    results = attribute_collectives(results, pairs)
    result = merge(target, golden, results, notes, incomplete=incomplete)
    for p in result.pairs:      # the lines around each culprit, from its dump (as opdiff.compare does)
        p["first_divergence"] = with_context(p.get("first_divergence"), dumps=(p["target"], p["golden"]))
    result.first_divergence = with_context(result.first_divergence, dumps=(target, golden))
    result.verdict = verdict_line(result)
    result.files = write_outputs(result, out)
    return result


def _untimed(notes):
    return [n for n in notes if not re.search(r"replayed .* in [0-9.]+ s", n)]


def _summary(path: str) -> dict:
    data = json.loads(Path(path).read_text())
    data.pop("files")
    kept = [(n, k) for n, k in zip(data["notes"], data["note_kinds"]) if n in _untimed([n])]
    data["notes"], data["note_kinds"] = [n for n, _ in kept], [k for _, k in kept]
    return data


@pytest.mark.parametrize("which", ["statistics", "tensor"])
def test_streamed_outputs_equal_the_in_memory_ones(which, stats_roots, roots, tmp_path):
    target, golden = (str(p) for p in (stats_roots if which == "statistics" else roots))
    old = _in_memory(target, golden, tmp_path / "old")
    new = opdiff.compare(target, golden, output_path=str(tmp_path / "new"))
    assert isinstance(old.rows, list) and on_disk(new.rows)
    assert len(new.rows) == len(old.rows) > 0 and new.rows == old.rows
    assert {r.rank for r in new.rows} == {r.rank for r in old.rows} and \
        len({r.rank for r in new.rows}) > 1
    assert new.counts == old.counts and new.first_divergence == old.first_divergence
    assert new.first_divergence is not None and new.pairs == old.pairs
    if which == "statistics":
        assert new.first_divergence.rank == 2 and new.first_divergence.op == "Functional.gelu"
    # The files, byte for byte (the CSV and rows), and summary.json field for field.
    assert Path(new.files["csv"]).read_text() == Path(old.files["csv"]).read_text()
    assert Path(new.files["rows"]).read_bytes() == Path(old.files["rows"]).read_bytes()
    assert _summary(new.files["summary"]) == _summary(old.files["summary"])
    assert new.verdict == old.verdict


def test_spool_reads_back_across_chunks_and_goes_away(roots, tmp_path):
    t, g = discover(str(roots[0]))[0], discover(str(roots[1]))[0]
    base = compare_pair(t, g).rows
    rows = [replace(base[i % len(base)], index=i) for i in range(2 * CHUNK + 7)]
    spool = Spool()
    meta = write_pair(rows, spool.path_for(0), step=3, rank=5)
    lazy = PairRows(spool, meta)
    assert len(lazy) == len(rows) and list(lazy) == rows and lazy == rows and rows == lazy
    assert lazy[CHUNK] == rows[CHUNK] and lazy[-1] == rows[-1]
    assert lazy[CHUNK - 2:CHUNK + 2] == rows[CHUNK - 2:CHUNK + 2]
    with pytest.raises(IndexError):
        lazy[len(rows)]
    tagged = ChainedRows([lazy.tagged_view(), lazy.tagged_view()])
    assert len(tagged) == 2 * len(rows) and tagged[len(rows)].index == 0
    assert {(r.step, r.rank) for r in tagged} == {(3, 5)}
    assert lazy != tagged
    copy = pickle.loads(pickle.dumps(lazy))
    assert type(copy) is list and copy == rows
    where = spool.dir
    assert os.path.isdir(where)
    del spool, lazy, tagged
    gc.collect()
    assert not os.path.exists(where)


def test_a_large_streamed_page_is_bounded(stats_roots, tmp_path):
    result = opdiff.compare(str(stats_roots[0]), str(stats_roots[1]))
    assert on_disk(result.rows)
    view = page_view(result, limit=10)
    fd = result.first_divergence
    assert len(view.rows) == 10 and len(result.rows) > 10
    assert all(r.result != "pass" or (r.step, r.rank) == (fd.step, fd.rank) for r in view.rows)
    assert f"the page shows 10 of {len(result.rows)} rows" in view.notes[-1]
    assert page_view(result) is result          # under the page's limit: every row


def test_replay_jobs_give_the_one_process_answer(roots, tmp_path, capsys):
    from opdiff.cli import main

    t, g = roots[0] / "step0" / "rank0", roots[1] / "step0" / "rank0"
    one = opdiff.compare(str(t), str(g), replay="all", replay_jobs=1)
    two = opdiff.compare(str(t), str(g), replay="all", replay_jobs=2)
    assert one.rows == two.rows and one.first_divergence == two.first_divergence
    assert one.first_divergence is not None and one.first_divergence.op == "Functional.gelu"
    assert main(["compare", str(t), str(g), "--replay-jobs", "0", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "jobs expects a number of processes" in err and "Traceback" not in err
