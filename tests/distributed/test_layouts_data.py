"""DistributedDataParallel on 2 gloo CPU ranks, the global batch of 8 split between them (4
rows each), compared with the same model on one process given the whole batch: the ranks are
merged into one run (comparison/layouts: the batch is dim 0 of what the inputs made, parameters
are replicas, the mean loss is the ranks' weighted by their share of the batch, and so are its
gradients), so a healthy pair names nothing with nothing unmatched, and a 1% fault after rank
1's second gelu is named at that gelu (with tensors: on rank 1). Before, the compare refused the
pair ("look like dumps of different models") or named rank 0.

One spawn per run, statistics and tensors in it (session fixture).
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch.distributed as dist

import opdiff
from layout_runs import run_worker

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]

_WORKER = textwrap.dedent('''
    import contextlib, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    import opdiff
    from opdiff.testing.faults import inject_fault

    def model_():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8),
                                   torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))

    def batch():
        torch.manual_seed(5)
        return torch.randn(8, 8)

    def run(model, x, root, faulty):
        for task in ("statistics", "tensor"):
            fault = inject_fault("Functional.gelu", call=1, scale=1.01) if faulty \\
                else contextlib.nullcontext()
            opt = torch.optim.SGD(model.parameters(), lr=0.0)     # the same weights both times
            dbg = opdiff.PrecisionDebugger(dump_path=f"{root}/{task}", level="L1", task=task)
            with fault:
                dbg.start(model)
                model(x).pow(2).mean().backward()
                opt.step()
                dbg.stop()
                dbg.step()
            opt.zero_grad()

    def work(rank, root, store, faulty):
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
        model = torch.nn.parallel.DistributedDataParallel(model_())
        run(model, batch().chunk(2)[rank], root, rank == faulty)
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        root, store, faulty = sys.argv[1], sys.argv[2], int(sys.argv[3])
        if faulty == -2:
            run(model_(), batch(), root, False)
        else:
            mp.spawn(work, args=(root, store, faulty), nprocs=2, join=True)
''')
def _run(tmp: Path, name: str, faulty: int) -> str:
    return run_worker(tmp, _WORKER, name, "a 2-rank DDP step", faulty)


@pytest.fixture(scope="session")
def dp_roots(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("data")
    return {"one": _run(tmp, "one", -2), "dp": _run(tmp, "dp", -1), "faulty": _run(tmp, "faulty", 1)}


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_healthy_split_batch_against_one_device_names_nothing(dp_roots, task):
    result = opdiff.compare(f"{dp_roots['dp']}/{task}", f"{dp_roots['one']}/{task}")
    assert result.first_divergence is None, result.first_divergence
    assert result.counts["error"] == result.counts["unmatched"] == 0
    assert not any(n.startswith("inconclusive") for n in result.notes)
    # from statistics, the ranks' parameter gradients before DDP's bucket all-reduce are partial
    # means that cannot be merged (8: two per linear); with tensors every tensor is scored
    assert result.counts["warning"] == (8 if task == "statistics" else 0)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_fault_on_rank_1s_part_of_the_batch_is_named(dp_roots, task):
    result = opdiff.compare(f"{dp_roots['faulty']}/{task}", f"{dp_roots['one']}/{task}")
    fd = result.first_divergence
    assert fd is not None and fd.name == "Functional.gelu.1.forward", fd
    if task == "tensor":
        assert fd.rank == 1 and "rank 1's piece" in fd.reason, fd
    else:
        assert "statistics cannot say which rank's piece differs" in fd.reason
