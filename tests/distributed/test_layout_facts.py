"""What was merged of a side laid out over ranks, as data (issue 44's report item): summary.json
`layouts` (one `LayoutFacts` per side and step: the layout kinds, the ranks, the tensors merged
by layout, the layout records left out, the replicas that differ, the culprit's rank) follows
its schema, loads back, and report.html shows it as a "Rank layouts" table. Before, only the
notes' words said it. The runs are the layouts tests' spawned ones (conftest.py): torch tensor
parallelism over 2 gloo ranks, and a 2-stage pipeline, against the same model on one process.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist

import opdiff
from opdiff import schemas
from opdiff.report.summary import load_summary

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]


def _compared(target: str, golden: str, out: Path) -> tuple[opdiff.CompareResult, dict]:
    result = opdiff.compare(target, golden, progress=False, output_path=str(out))
    summary = json.loads((out / "summary.json").read_text())
    pytest.importorskip("jsonschema")
    schemas.validate("compare-summary", summary)
    return result, summary


def _sides(summary: dict) -> dict[str, dict]:
    return {f["side"]: f for f in summary["layouts"]}


def test_healthy_tensor_parallel_pair_says_what_was_merged(tp_runs, tmp_path):
    result, summary = _compared(tp_runs["tp"], tp_runs["one"], tmp_path)
    sides = _sides(summary)
    assert len(summary["layouts"]) == 2
    target, golden = sides["target"], sides["golden"]
    assert target["kinds"] == ["tp"] and target["how"] == "merged"
    assert target["world"] == 2 and target["ranks"] == [0, 1] and target["step"] == 0
    assert all(target["counts"].get(k, 0) > 0 for k in ("shard", "partial", "replicate"))
    assert target["left_out"] > 0 and target["mesh"] == []
    assert target["replicas"] == [] and target["culprit_ranks"] == []
    assert golden["kinds"] == ["none"] and golden["how"] == "one rank" and golden["world"] == 1
    assert load_summary(tmp_path).layouts == result.layouts     # read back as they were
    page = (tmp_path / "report.html").read_text()
    assert '<section id="rank-layouts"' in page
    assert "<td>merged: ranks [0, 1] of 2</td>" in page and "<td>one rank: ranks [0] of 1</td>" \
        in page


def test_a_fault_on_rank_1s_shard_names_rank_1(tp_tensors, tmp_path):
    result, summary = _compared(tp_tensors["faulty"], tp_tensors["one"], tmp_path)
    assert result.first_divergence is not None and result.first_divergence.rank == 1
    assert _sides(summary)["target"]["culprit_ranks"] == [1]
    assert _sides(summary)["golden"]["culprit_ranks"] == []


def test_statistics_that_cannot_tell_the_pieces_apart_name_no_rank(tp_runs, tmp_path):
    result, summary = _compared(tp_runs["faulty"], tp_runs["one"], tmp_path)
    assert result.first_divergence is not None
    assert _sides(summary)["target"]["culprit_ranks"] == []


def test_a_replica_that_differs_is_named_with_its_rank(tp_runs, tmp_path):
    _, summary = _compared(tp_runs["replica"], tp_runs["one"], tmp_path)
    replicas = _sides(summary)["target"]["replicas"]
    assert {"tensor": "Parameter.2.bias.0.forward.output.0", "rank": 1, "against": 0} \
        in replicas, replicas


def test_a_pipeline_says_its_stages_were_chained_and_the_culprits_rank(pp_roots, tmp_path):
    healthy = opdiff.compare(f"{pp_roots['pp']}/statistics", f"{pp_roots['one']}/statistics",
                             progress=False)
    laid = {f.side: f for f in healthy.layouts}
    assert laid["target"].kinds == ("pipeline",) and laid["target"].how == "chained"
    assert laid["target"].ranks == (0, 1) and laid["target"].culprit_ranks == ()
    _, summary = _compared(f"{pp_roots['faulty']}/statistics",
                           f"{pp_roots['one']}/statistics", tmp_path)
    assert _sides(summary)["target"]["culprit_ranks"] == [1]


def test_a_one_device_pair_has_no_layouts_and_older_files_still_load(tp_runs, tmp_path):
    result, summary = _compared(tp_runs["one"], tp_runs["one"], tmp_path)
    assert result.layouts == [] and summary["layouts"] == []
    assert 'id="rank-layouts"' not in (tmp_path / "report.html").read_text()
    del summary["layouts"]                      # as an opdiff before this wrote it
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert load_summary(tmp_path).layouts == []
