"""Sequence parallelism (torch `SequenceParallel` on two layer norms, the linears between them
column/row parallel with the sequence dim split at their ends) on 2 gloo CPU ranks, each given
its half of the sequence, compared with the same model on one process given the whole: the
ranks are merged into one run (comparison/layouts: the model's input held by a `Shard(1)`
DTensor is joined along the sequence, DTensor's gather-and-reorder (`wait_tensor`, `chunk`,
`cat`, `contiguous` after the all-gather) and reorder-and-scatter (`chunk`, `cat` before the
reduce-scatter) are left out with their collectives, and a partial sum's statistics are its
reduce-scatter's pieces'), so a healthy pair names nothing with nothing unmatched, and a 1%
fault on rank 1 is named at its op: the gelu on the hidden dim's shard, or the second layer
norm on the sequence's. Before, 26 rows were unmatched, the input was taken for a batch split
(an error row) and the gelu's gradient was judged 0.5 off.

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

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(8)
            self.fc1 = torch.nn.Linear(8, 16)
            self.fc2 = torch.nn.Linear(16, 8)
            self.norm2 = torch.nn.LayerNorm(8)
            self.head = torch.nn.Linear(8, 4)

        def forward(self, x):
            h = self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))
            return self.head(self.norm2(h))

    def model_():
        torch.manual_seed(0)
        return Block()

    def batch():
        torch.manual_seed(5)
        return torch.randn(2, 8, 8)

    def run(model, x, root, fault):
        for task in ("statistics", "tensor"):
            opt = torch.optim.SGD(model.parameters(), lr=0.0)     # the same weights both times
            dbg = opdiff.PrecisionDebugger(dump_path=f"{root}/{task}", level="L1", task=task)
            with (inject_fault(fault[0], call=fault[1], scale=1.01) if fault
                  else contextlib.nullcontext()):
                dbg.start(model)
                model(x).pow(2).mean().backward()
                opt.step()
                dbg.stop()
                dbg.step()
            opt.zero_grad()

    def work(rank, root, store, fault):
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       SequenceParallel, parallelize_module)
        model = parallelize_module(model_(), init_device_mesh("cpu", (2,)), {
            "norm": SequenceParallel(),
            "fc1": ColwiseParallel(input_layouts=Shard(1)),
            "fc2": RowwiseParallel(output_layouts=Shard(1)),
            "norm2": SequenceParallel(),
            "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        })
        run(model, batch().chunk(2, dim=1)[rank], root, fault if rank == 1 else None)
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        root, store, fault = sys.argv[1], sys.argv[2], sys.argv[3]
        op, _, call = fault.partition(":")
        fault = (op, int(call)) if op not in ("one", "healthy") else None
        if op == "one":
            run(model_(), batch(), root, None)
        else:
            mp.spawn(work, args=(root, store, fault), nprocs=2, join=True)
''')


def _run(tmp: Path, name: str, fault: str) -> str:
    return run_worker(tmp, _WORKER, name, "a 2-rank sequence-parallel step", fault)


@pytest.fixture(scope="session")
def sp_roots(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sequence")
    return {"one": _run(tmp, "one", "one"), "sp": _run(tmp, "sp", "healthy"),
            "gelu": _run(tmp, "gelu", "Functional.gelu:0"),
            "norm": _run(tmp, "norm", "Functional.layer_norm:1")}


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_healthy_sequence_parallel_against_one_device_names_nothing(sp_roots, task):
    result = opdiff.compare(f"{sp_roots['sp']}/{task}", f"{sp_roots['one']}/{task}")
    assert result.first_divergence is None, result.first_divergence
    assert result.counts["error"] == result.counts["unmatched"] == 0, result.counts
    assert not any(n.startswith("inconclusive") for n in result.notes), result.notes
    said = [n for n in result.notes if "ranks [0, 1] were merged into one run" in n]
    assert said and "unknown" not in said[0], result.notes      # every tensor's layout known
    # from statistics, the backward partial sums DTensor reduces out of sight (the layer
    # norms' weight gradients, the linears' input gradients) are not judged; with tensors
    # every tensor is scored
    assert result.counts["warning"] == (10 if task == "statistics" else 0), result.counts


@pytest.mark.parametrize("task", ["statistics", "tensor"])
@pytest.mark.parametrize("fault,op,dim", [("gelu", "Functional.gelu.0.forward", 2),
                                          ("norm", "Functional.layer_norm.1.forward", 1)])
def test_a_fault_on_rank_1s_piece_is_named_at_its_op(sp_roots, task, fault, op, dim):
    result = opdiff.compare(f"{sp_roots[fault]}/{task}", f"{sp_roots['one']}/{task}")
    fd = result.first_divergence
    assert fd is not None and fd.name == op, fd
    assert fd.location is not None and fd.location.line > 0
    assert f"sharded along dim {dim}" in fd.reason, fd.reason
    if task == "tensor":
        assert fd.rank == 1 and "rank 1's piece" in fd.reason, fd
    else:
        assert "statistics cannot say which rank's piece differs" in fd.reason
