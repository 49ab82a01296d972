"""Cross-rank first divergence on real gloo process groups (2 and 4 spawned processes): a fault
planted in one rank's gelu is that rank's local error at its line; every other rank's difference
is received through the all_reduce from that rank (origin "collective"), not a local error; a
healthy pair of runs names nothing."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch.distributed as dist

import opdiff

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]

_WORKER = textwrap.dedent('''
    import contextlib, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    import opdiff
    from opdiff.testing.faults import inject_fault

    def work(rank, root, store, world, faulty):
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
        torch.manual_seed(0)
        up, down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 2)   # a tensor-parallel-like MLP
        x = torch.randn(4, 8) + rank
        fault = inject_fault("Functional.gelu", call=0, scale=1.05) if rank == faulty \\
            else contextlib.nullcontext()
        with fault:
            dbg = opdiff.PrecisionDebugger(dump_path=root, level="L1", task="tensor")
            dbg.start()
            h = torch.nn.functional.gelu(up(x))          # GELU_LINE
            dist.all_reduce(h)
            down(torch.tanh(h)).sum().backward()
            dbg.stop()
            dbg.step()
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        world, faulty = int(sys.argv[3]), int(sys.argv[4])
        mp.spawn(work, args=(sys.argv[1], sys.argv[2], world, faulty), nprocs=world, join=True)
''')
GELU_LINE = next(i for i, line in enumerate(_WORKER.splitlines(), 1) if "GELU_LINE" in line)


def _run(tmp, name: str, world: int, faulty: int):
    script = tmp / "worker.py"
    script.write_text(_WORKER)
    root = tmp / name
    proc = subprocess.run([sys.executable, str(script), str(root), str(tmp / f"store_{name}"),
                           str(world), str(faulty)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(root)


@pytest.fixture(scope="module", params=[2, 4])
def runs(request, tmp_path_factory):
    world = request.param
    tmp = tmp_path_factory.mktemp(f"xr{world}")
    faulty = world - 1
    return world, faulty, _run(tmp, "target", world, faulty), _run(tmp, "golden", world, -1)


def test_the_faulty_rank_is_first_and_the_others_received_it(runs):
    world, faulty, target, golden = runs
    result = opdiff.compare(target, golden)
    fd = result.first_divergence
    assert (fd.rank, fd.op, fd.origin) == (faulty, "Functional.gelu", "op")
    assert fd.location is not None and fd.location.line == GELU_LINE
    by_rank = {p["rank"]: p["first_divergence"] for p in result.pairs}
    assert sorted(by_rank) == list(range(world))
    for rank in range(world):
        if rank == faulty:
            continue
        got = by_rank[rank]
        assert got.origin == "collective" and got.op == "Distributed.all_reduce"
        assert f"received through Distributed.all_reduce #0 (group of ranks {list(range(world))}) " \
               f"from rank {faulty}:" in got.reason
    assert any("rank 0: received through" in n for n in result.notes)


def test_a_healthy_pair_names_nothing(runs):
    _, _, _, golden = runs
    result = opdiff.compare(golden, golden)
    assert result.first_divergence is None
    assert all(p["first_divergence"] is None for p in result.pairs)
