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
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import opdiff
from opdiff.capture import collectives
from opdiff.errors import ConfigError

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]

_WORKER = textwrap.dedent('''
    import contextlib, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    import opdiff
    from opdiff.testing.faults import inject_fault

    def work(rank, root, store, faulty, kind):
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (2,))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
        if kind == "fsdp2":
            from torch.distributed.fsdp import fully_shard
            fully_shard(model[0], mesh=mesh)
            fully_shard(model[2], mesh=mesh)
            fully_shard(model, mesh=mesh)
            from opdiff.capture.collectives import record_fsdp_reduce_scatter
            record_fsdp_reduce_scatter(model)        # FSDP2's gradient reduce-scatter, recorded
            torch.manual_seed(1 + rank)              # data parallel: each rank its own batch
        else:
            from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                           parallelize_module)
            parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x = torch.randn(4, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)   # steps DTensor parameters (both kinds)
        fault = inject_fault("Functional.gelu", call=0, scale=1.05) if rank == faulty \\
            else contextlib.nullcontext()
        with fault:
            dbg = opdiff.PrecisionDebugger(dump_path=root, level="L1", task="statistics")
            dbg.start()
            model(x).sum().backward()
            opt.step()
            dbg.stop()
            dbg.step()
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(work, args=(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]), nprocs=2,
                 join=True)
''')


# Both kinds take ~20 s a run here without load.
LIMIT_S = 300


def _run(tmp: Path, kind: str, name: str, faulty: int) -> tuple[str, str]:
    """(the dump root, why it cannot be used: "" when it can)."""
    script = tmp / "worker.py"
    script.write_text(_WORKER)
    root = tmp / name
    limit = LIMIT_S
    # Its own session, so that on a timeout the spawned ranks go too (killpg of this group).
    proc = subprocess.Popen([sys.executable, str(script), str(root), str(tmp / f"store_{name}"),
                             str(faulty), kind], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return str(root), f"{kind} under opdiff capture does not finish a 2-rank step in {limit} s"
    if proc.returncode != 0:
        lines = [ln for ln in stderr.splitlines() if "Error" in ln and ":" in ln]
        return str(root), f"{kind} under opdiff capture fails: {lines[-1] if lines else stderr[-300:]}"
    empty = [r for r in (0, 1)
             if not (root / "step0" / f"rank{r}" / "records.jsonl").read_text().strip()]
    if empty:
        return str(root), f"{kind} under opdiff capture records no op on rank(s) {empty}"
    return str(root), ""


# the collective that brings rank 1's difference to rank 0
CARRIER = {"fsdp2": "Distributed.reduce_scatter_single", "tp": "Distributed.all_reduce"}


@pytest.mark.parametrize("kind", ["fsdp2", "tp"])
def test_fault_on_one_rank_is_named_and_a_healthy_pair_names_nothing(kind, tmp_path):
    target, why = _run(tmp_path, kind, "target", faulty=1)
    assert not why, why
    golden, why = _run(tmp_path, kind, "golden", faulty=-1)
    assert not why, why
    again, why = _run(tmp_path, kind, "golden2", faulty=-1)
    assert not why, why
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
