"""FSDP2 (`fully_shard`) and tensor parallelism (DTensor `parallelize_module`) on 2 gloo CPU
processes, captured at L1 with a gelu fault on rank 1: the first divergence names rank 1's gelu,
rank 0's differences are received through the collective that carried them (origin
"collective", from rank 1), and a healthy pair names nothing.

- FSDP2: the workers call `record_fsdp_reduce_scatter`, so FSDP2's gradient reduce-scatter is a
  `Distributed.reduce_scatter_single` record; rank 0's own gradients agree, its reduced shard
  does not. The optimizer step reads FSDP2's sharded DTensor parameters (local shards too).
- TP: DTensors are described by their local shard with its placement and mesh coordinate
  (`collectives.local_shard`), and RowwiseParallel's functional all_reduce is a
  `Distributed.all_reduce` record with its group, described once it has finished
  (`collectives.waited`). Before that every TP row read "neither tensor nor statistics saved".
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import opdiff
from layout_runs import run_layout
from opdiff.capture import collectives
from opdiff.errors import ConfigError

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]


@pytest.fixture(scope="module")
def kind_roots(tmp_path_factory):
    """{run: {kind: root}}: one spawn writes both kinds of every run; a rank that recorded no
    op fails it."""
    runs = run_layout(tmp_path_factory.mktemp("fsdp_tp"), "collective", 2,
                      "target:Functional.gelu:0", "golden", "golden2")
    out = {name: {kind: f"{root}/{kind}" for kind in CARRIER} for name, root in runs.items()}
    for kinds in out.values():
        for root in kinds.values():
            empty = [r for r in (0, 1) if not
                     (Path(root) / "step0" / f"rank{r}" / "records.jsonl").read_text().strip()]
            assert not empty, f"{root}: no op recorded on rank(s) {empty}"
    return out


# the collective that brings rank 1's difference to rank 0
CARRIER = {"fsdp2": "Distributed.reduce_scatter_single", "tp": "Distributed.all_reduce"}


@pytest.mark.parametrize("kind", ["fsdp2", "tp"])
def test_fault_on_one_rank_is_named_and_a_healthy_pair_names_nothing(kind, kind_roots):
    target, golden, again = (kind_roots[run][kind] for run in ("target", "golden", "golden2"))
    result = opdiff.compare(target, golden)
    fd = result.first_divergence
    assert fd is not None and fd.rank == 1 and fd.op == "Functional.gelu"
    if kind == "tp":     # a DTensor is described by this rank's shard, with where it sits
        recs = [json.loads(line) for line in
                (Path(target) / "step0" / "rank1" / "records.jsonl").open()]
        weight = next(r for r in recs if r["op"] == "Functional.linear")["inputs"][1]
        assert weight["shape"] == [8, 8] and weight["stats"] is not None
        assert weight["placement"] == {"placements": ["S(0)"], "coordinate": [1],
                                       "global_shape": [16, 8], "whole": False}
    got = {p["rank"]: p["first_divergence"] for p in result.pairs}[0]
    assert got is not None and got.origin == "collective", got
    assert got.op == CARRIER[kind] and "from rank 1" in got.reason
    healthy = opdiff.compare(again, golden)
    assert healthy.first_divergence is None
    assert [p["first_divergence"] for p in healthy.pairs] == [None, None]


def test_recording_the_reduce_scatter_needs_an_fsdp2_model():
    with pytest.raises(ConfigError, match="holds no FSDP2 module"):
        collectives.record_fsdp_reduce_scatter(torch.nn.Linear(2, 2))
