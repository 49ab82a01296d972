"""A 2-block MLP under torch tensor parallelism (DTensor ColwiseParallel/RowwiseParallel) on 2
gloo CPU ranks, compared with the same model on one process (comparison/layouts): the two ranks
are merged into one logical run (shards joined, partial sums taken from their all-reduce,
replicas checked), so a healthy pair names nothing and scores every tensor, and a 1% fault
after rank 1's second gelu is named at that gelu. Before, the healthy pair named an SGD update
on a sharded weight, rank 1 had "no golden counterpart" and 53 tensors were "not comparable".

One spawn of all the 2-rank runs and one of the 4-rank run, shared by the tests (session
fixture; the workers are in layout_runs.py).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch.distributed as dist

import opdiff
from opdiff.store.adapters import discover

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]

def test_capture_says_the_tensor_parallel_styles_in_meta(tp_runs):
    meta = json.loads((Path(tp_runs["tp"]) / "step0" / "rank1" / "meta.json").read_text())
    assert meta["parallel"]["world_size"] == 2 and meta["parallel"]["rank"] == 1
    assert meta["parallel"]["styles"]["0"] == {"style": "ColwiseParallel", "input": ["R"],
                                               "output": ["S(-1)"]}
    assert meta["parallel"]["styles"]["5"]["style"] == "RowwiseParallel"


def test_healthy_tensor_parallel_run_against_one_device_names_nothing(tp_runs):
    result = opdiff.compare(tp_runs["tp"], tp_runs["one"])
    assert result.first_divergence is None, result.first_divergence
    assert result.counts["error"] == 0 and result.counts["unmatched"] == 0
    assert not any(n.startswith("inconclusive") for n in result.notes)
    assert any("ranks [0, 1] were merged into one run" in n for n in result.notes)
    # every tensor scored but the backward partial sum nothing recorded the reduction of
    assert result.counts["warning"] <= 1


def test_a_fault_on_rank_1s_shard_is_named_at_its_op(tp_runs):
    result = opdiff.compare(tp_runs["faulty"], tp_runs["one"])
    fd = result.first_divergence
    assert fd is not None and fd.name == "Functional.gelu.1.forward", fd
    assert fd.location is not None and fd.location.line > 0
    assert "merged from ranks [0, 1]" in fd.reason      # statistics: which piece, it cannot say


def _records(root: str) -> dict[str, dict]:
    from opdiff.comparison.layouts import MergedSource

    dumps = discover(root)
    source = MergedSource(dumps) if len(dumps) > 1 else dumps[0]
    return {r["name"]: r for r in source.records()}


def test_merged_statistics_equal_the_one_device_runs(tp_runs):
    merged, one = _records(tp_runs["tp"]), _records(tp_runs["one"])
    checked = 0
    for name in ("Parameter.0.weight.0.forward", "Parameter.0.bias.0.forward",
                 "Parameter.2.weight.0.forward", "Parameter.5.weight.0.forward"):
        m, o = merged[name]["outputs"][0], one[name]["outputs"][0]
        assert m["shape"] == o["shape"] and "placement" not in m
        assert [p["rank"] for p in m["pieces"]] == [0, 1]
        for key in ("max", "min", "mean", "norm"):
            a, b = float(m["stats"][key]), float(o["stats"][key])
            assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15), (name, key, a, b)
            checked += 1
    assert checked == 16
    # DTensor's own views and the group's all-reduces are not ops of the logical run
    assert not any(n.startswith(("Tensor.view_as", "Distributed.")) for n in merged)


def test_tensor_dumps_healthy_pair_agrees_everywhere(tp_tensors):
    result = opdiff.compare(tp_tensors["tp"], tp_tensors["one"])
    assert result.first_divergence is None, result.first_divergence
    # every tensor scored, the backward partial sum too (summed from the ranks' summands)
    assert result.counts["warning"] == result.counts["error"] == result.counts["unmatched"] == 0


def test_tensor_dumps_name_the_rank_whose_piece_differs(tp_tensors):
    result = opdiff.compare(tp_tensors["faulty"], tp_tensors["one"])
    fd = result.first_divergence
    assert fd is not None and fd.name == "Functional.gelu.1.forward", fd
    assert fd.rank == 1, fd
    assert "rank 1's piece of Functional.gelu.1.forward.output.0" in fd.reason
    assert "the other pieces agree" in fd.reason


@pytest.mark.parametrize("golden", ["one", "tp"])
def test_tp4_against_tp2_or_one_device_names_nothing(tp_runs, tp_tensors, golden):
    for runs in (tp_runs, tp_tensors):
        result = opdiff.compare(runs["tp4"], runs[golden])
        assert result.first_divergence is None, result.first_divergence
        assert result.counts["error"] == 0 and result.counts["unmatched"] == 0
        assert any("ranks [0, 1, 2, 3] were merged" in n for n in result.notes)
        if golden == "tp":
            assert any("golden's ranks [0, 1] were merged" in n for n in result.notes)


def test_four_shards_merge_to_the_one_device_statistics(tp_runs):
    merged, one = _records(tp_runs["tp4"]), _records(tp_runs["one"])
    m = merged["Parameter.0.weight.0.forward"]["outputs"][0]
    o = one["Parameter.0.weight.0.forward"]["outputs"][0]
    assert [p["offset"] for p in m["pieces"]] == [0, 4, 8, 12] and m["shape"] == o["shape"]
    for key in ("max", "min", "mean", "norm"):
        assert math.isclose(float(m["stats"][key]), float(o["stats"][key]), rel_tol=1e-12), key


def test_a_replica_that_differs_is_said_with_its_rank(tp_runs):
    result = opdiff.compare(tp_runs["replica"], tp_runs["one"])
    said = [n for n in result.notes if "copy of" in n]
    assert said and "rank 1's copy of Parameter.2.bias.0.forward.output.0 differs from rank 0's" \
        in said[0], result.notes
    healthy = opdiff.compare(tp_runs["tp"], tp_runs["one"])
    assert not any("copy of" in n for n in healthy.notes)
