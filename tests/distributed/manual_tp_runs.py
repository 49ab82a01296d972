"""A 2-block MLP split by hand over gloo CPU ranks, Megatron-style: plain tensors, column-parallel
linears (each rank a slice of the output features) followed by row-parallel ones (a slice of the
input features, an all-reduce of the partial sums, then the bias), with Megatron's autograd
functions around the region (copy: identity forward, all-reduce backward; reduce: all-reduce
forward, identity backward). No DTensor: nothing in the dump says which tensor is a shard.

`run(tmp, name, faulty)`: faulty -2 is the same model on one process (world 1: the same code,
no collective), -1 the healthy 2-rank run, 1 a 1% fault after rank 1's second gelu. Each root
holds a `statistics` and a `tensor` dump of one training step.

`run_stages(tmp, name, faulty)`: the same model as a 2-stage pipeline whose stage 0 runs on
rank 1 and stage 1 on rank 0 (activations and gradients sent between them), faulty -1 healthy,
0 a 1% fault after rank 0's gelu (stage 1's). `STAGES` is its layout file.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

from layout_runs import run_worker

LAYOUT = "column 0\nrow 2\ncolumn 3 dim=0 ranks=0,1\nrow 5   # the second block\n"
STAGES = "# stage 0 (block 0) runs on rank 1\nstage 0 ranks=1\nstage 1 ranks=0\n"

WORKER = textwrap.dedent('''
    import contextlib, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    import torch.nn.functional as F
    import opdiff
    from opdiff.testing.faults import inject_fault

    class Copy(torch.autograd.Function):          # into the tensor-parallel region
        @staticmethod
        def forward(ctx, x):
            return x
        @staticmethod
        def backward(ctx, g):
            if dist.is_initialized():
                dist.all_reduce(g)      # in place, as Megatron does: bumps no version counter
            return g

    class Reduce(torch.autograd.Function):        # out of it: the partial sums added
        @staticmethod
        def forward(ctx, x):
            if dist.is_initialized():
                dist.all_reduce(x)
            return x
        @staticmethod
        def backward(ctx, g):
            return g

    class Column(torch.nn.Module):
        def __init__(self, full, rank, world):
            super().__init__()
            n = full.out_features // world
            self.weight = torch.nn.Parameter(full.weight.detach()[rank * n:(rank + 1) * n].clone())
            self.bias = torch.nn.Parameter(full.bias.detach()[rank * n:(rank + 1) * n].clone())
        def forward(self, x):
            return F.linear(Copy.apply(x), self.weight, self.bias)

    class Row(torch.nn.Module):
        def __init__(self, full, rank, world):
            super().__init__()
            n = full.in_features // world
            self.weight = torch.nn.Parameter(
                full.weight.detach()[:, rank * n:(rank + 1) * n].clone())
            self.bias = torch.nn.Parameter(full.bias.detach().clone())
        def forward(self, x):
            return Reduce.apply(F.linear(x, self.weight)) + self.bias

    def model_(rank=0, world=1):
        torch.manual_seed(0)
        full = [torch.nn.Linear(8, 16), torch.nn.Linear(16, 8), torch.nn.Linear(8, 16),
                torch.nn.Linear(16, 8)]
        return torch.nn.Sequential(Column(full[0], rank, world), torch.nn.GELU(),
                                   Row(full[1], rank, world), Column(full[2], rank, world),
                                   torch.nn.GELU(), Row(full[3], rank, world))

    def step(model, root, fault, task):
        torch.manual_seed(5)
        x = torch.randn(4, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with fault:
            dbg = opdiff.PrecisionDebugger(dump_path=root + "/" + task, level="L1", task=task)
            dbg.start(model)
            model(x).pow(2).mean().backward()
            opt.step()
            dbg.stop()
            dbg.step()

    def work(rank, root, store, faulty, world):
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                                world_size=world)
        for task in ("statistics", "tensor"):
            fault = inject_fault("Functional.gelu", call=1, scale=1.01) if rank == faulty \\
                else contextlib.nullcontext()
            step(model_(rank, world), root, fault, task)
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        root, store, faulty = sys.argv[1], sys.argv[2], int(sys.argv[3])
        if faulty == -2:                                   # the one-device golden
            for task in ("statistics", "tensor"):
                step(model_(), root, contextlib.nullcontext(), task)
        else:
            mp.spawn(work, args=(root, store, faulty, 2), nprocs=2, join=True)
''')


def run(tmp: Path, name: str, faulty: int) -> str:
    return run_worker(tmp, WORKER, name, "a 2-rank hand-split TP step", faulty)


STAGE_WORKER = textwrap.dedent('''
    import contextlib, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    import opdiff
    from opdiff.testing.faults import inject_fault

    FIRST = 1                      # the rank that runs stage 0

    def model_():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8),
                                   torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))

    def step(model, root, fault, task, rank=None):
        torch.manual_seed(5)
        x = torch.randn(4, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        dbg = opdiff.PrecisionDebugger(dump_path=f"{root}/{task}", level="L1", task=task)
        with fault:
            dbg.start(model)
            if rank is None:
                model(x).pow(2).mean().backward()
            elif rank == FIRST:
                out = model(x)
                dist.send(out.detach(), 1 - FIRST)
                grad = torch.empty_like(out)
                dist.recv(grad, 1 - FIRST)
                out.backward(grad)
            else:
                inp = torch.empty(4, 8)
                dist.recv(inp, FIRST)
                inp.requires_grad_(True)
                model(inp).pow(2).mean().backward()
                dist.send(inp.grad, FIRST)
            opt.step()
            dbg.stop()
            dbg.step()

    def work(rank, root, store, faulty):
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
        for task in ("statistics", "tensor"):
            model = model_()
            for i in ((3, 4, 5) if rank == FIRST else (0, 1, 2)):     # this rank's stage only
                model[i] = torch.nn.Identity()
            fault = inject_fault("Functional.gelu", call=0, scale=1.01) if rank == faulty \\
                else contextlib.nullcontext()
            step(model, root, fault, task, rank)
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        root, store, faulty = sys.argv[1], sys.argv[2], int(sys.argv[3])
        if faulty == -2:
            for task in ("statistics", "tensor"):
                step(model_(), root, contextlib.nullcontext(), task)
        else:
            mp.spawn(work, args=(root, store, faulty), nprocs=2, join=True)
''')


def run_stages(tmp: Path, name: str, faulty: int) -> str:
    return run_worker(tmp, STAGE_WORKER, name, "a 2-stage pipeline step", faulty)
