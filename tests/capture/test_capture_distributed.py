"""torch.distributed: rank directories and collectives recorded at L1 (gloo on CPU).

The two-rank test runs a real process group of two spawned processes; the one-rank test runs a
FileStore group inside the test process (fast).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

import opdiff
from opdiff.store import decoded_stats, find_dumps, open_dump

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")

_WORKER = textwrap.dedent('''
    import os, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    import opdiff

    def work(rank, root, store):
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
        dbg = opdiff.PrecisionDebugger(dump_path=root, level="L1", task="tensor")
        dbg.start()
        t = torch.full((4,), float(rank + 1))                    # rank0: 1, rank1: 2
        dist.all_reduce(t)                                       # 3 everywhere
        gathered = [torch.zeros(2), torch.zeros(2)]
        dist.all_gather(gathered, torch.full((2,), 10.0 * (rank + 1)))
        b = torch.full((3,), 5.0 if rank == 0 else -1.0)
        dist.broadcast(b, src=0)                                 # 5 everywhere
        if rank == 0:
            dist.send(torch.full((2,), 7.0), dst=1)
        else:
            r = torch.zeros(2)
            dist.recv(r, src=0)                                  # 7
        a = torch.full((4,), float(rank + 1))
        work_ = dist.all_reduce(a, async_op=True)
        work_.wait()                                             # 3 once waited
        flat = torch.zeros(4)
        dist.all_gather_into_tensor(flat, torch.full((2,), float(rank)))
        swapped = torch.zeros(2)
        dist.all_to_all_single(swapped, torch.full((2,), float(rank)))
        dbg.stop()
        dbg.step()
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(work, args=(sys.argv[1], sys.argv[2]), nprocs=2, join=True)
''')


@pytest.fixture(scope="module")
def two_rank_dump(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    script = tmp / "worker.py"
    script.write_text(_WORKER)
    root = tmp / "dump"
    proc = subprocess.run([sys.executable, str(script), str(root), str(tmp / "store")],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def _records(directory):
    return {r["name"]: r for r in open_dump(directory).records()}


def _max(desc):
    return decoded_stats(desc)["max"]


@pytest.mark.slow
def test_each_rank_writes_its_own_directory(two_rank_dump):
    dirs = find_dumps(two_rank_dump)
    assert [(d.parent.name, d.name) for d in dirs] == [("step0", "rank0"), ("step0", "rank1")]
    for rank, d in enumerate(dirs):
        meta = json.loads((d / "meta.json").read_text())
        assert meta["rank"] == rank


@pytest.mark.slow
def test_collectives_are_recorded_with_values_before_and_after(two_rank_dump):
    for rank, d in enumerate(find_dumps(two_rank_dump)):
        recs = _records(d)
        dump = open_dump(d)
        ar = recs["Distributed.all_reduce.0.forward"]
        assert _max(ar["inputs"][0]) == rank + 1          # this rank's contribution
        assert _max(ar["outputs"][0]) == 3.0              # the reduced value
        assert torch.equal(dump.tensor(ar["outputs"][0]["key"]), torch.full((4,), 3.0))
        ag = recs["Distributed.all_gather.0.forward"]
        gathered = [leaf for leaf in _leaves(ag["outputs"])]
        assert sorted(_max(g) for g in gathered) == [10.0, 20.0]
        bc = recs["Distributed.broadcast.0.forward"]
        assert _max(bc["outputs"][0]) == 5.0
        p2p = recs["Distributed.send.0.forward" if rank == 0 else "Distributed.recv.0.forward"]
        assert _max(p2p["inputs"][0]) == (7.0 if rank == 0 else 0.0)
        if rank == 1:
            assert _max(p2p["outputs"][0]) == 7.0


@pytest.mark.slow
def test_async_collective_output_is_the_reduced_value(two_rank_dump):
    # async_op=True returns before the data arrives: the record must not show the input again.
    for rank, d in enumerate(find_dumps(two_rank_dump)):
        rec = _records(d)["Distributed.all_reduce.1.forward"]
        assert _max(rec["inputs"][0]) == rank + 1
        assert _max(rec["outputs"][0]) == 3.0


@pytest.mark.slow
def test_collectives_carry_their_group_and_a_per_group_number(two_rank_dump):
    # The same collective has the same (ranks, seq) on every rank; p2p counts per peer pair.
    groups = []
    for d in find_dumps(two_rank_dump):
        recs = [r for r in open_dump(d).records() if r["op"].startswith("Distributed.")]
        groups.append({r["name"]: r.get("group") for r in recs})
    rank0, rank1 = groups
    world = ["Distributed.all_reduce.0.forward", "Distributed.all_gather.0.forward",
             "Distributed.broadcast.0.forward", "Distributed.all_reduce.1.forward",
             "Distributed.all_gather_single.0.forward",   # all_gather_into_tensor
             "Distributed.all_to_all_single.0.forward"]
    assert [rank0[n] for n in world] == [{"ranks": [0, 1], "seq": k} for k in range(len(world))]
    assert [rank1[n] for n in world] == [rank0[n] for n in world]
    assert rank0["Distributed.send.0.forward"] == {"ranks": [0, 1], "seq": 0, "peer": 1}
    assert rank1["Distributed.recv.0.forward"] == {"ranks": [0, 1], "seq": 0, "peer": 0}


def _leaves(descs):
    for d in descs:
        if d.get("type") == "tensor":
            yield d
        elif d.get("type") in ("list", "tuple"):
            yield from _leaves(d["items"])


def test_single_rank_group_records_collectives_and_rank(tmp_path, dump_root):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        x = torch.arange(4.0)
        gathered = [torch.zeros(4)]
        scattered = torch.zeros(4)
        with opdiff.dump(None, dump_root, level="L1"):
            dist.all_reduce(x)
            dist.broadcast(x, src=0)
            dist.all_gather(gathered, x)
            dist.reduce_scatter(scattered, [x])
            dist.barrier()
        names = [r["name"] for r in open_dump(find_dumps(dump_root)[0]).records()]
    finally:
        dist.destroy_process_group()
    assert names == ["Distributed.all_reduce.0.forward", "Distributed.broadcast.0.forward",
                     "Distributed.all_gather.0.forward", "Distributed.reduce_scatter.0.forward"]
    assert find_dumps(dump_root)[0].name == "rank0"


def test_a_dtensor_is_its_local_shard_and_a_functional_collective_is_numbered(tmp_path,
                                                                            dump_root):
    # (2 gloo processes under TP and FSDP2: tests/distributed/test_fsdp_tp.py)
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        dt = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
        with opdiff.dump(None, dump_root, level="L1"):
            torch.mul(dt, 2.0)
            reduced = funcol.all_reduce(torch.full((3,), 2.0), "sum", dist.group.WORLD)
        recs = _records(find_dumps(dump_root)[0])
    finally:
        dist.destroy_process_group()
    shard = recs["Torch.mul.0.forward"]["inputs"][0]
    assert shard["placement"] == {"placements": ["S(0)"], "coordinate": [0], "global_shape": [4, 2],
                                  "whole": True}     # one device: the shard is all of it
    assert shard["shape"] == [4, 2] and _max(shard) == 7.0
    got = recs["Distributed.all_reduce.0.forward"]
    assert got["group"] == {"ranks": [0], "seq": 0}
    assert _max(got["outputs"][0]) == 2.0 and float(reduced.max()) == 2.0
