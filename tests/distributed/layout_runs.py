"""The spawned multi-process runs of the layouts tests, in one module: the models, the captured
training step and one worker per layout, run as a script in its own session and killed with its
ranks when it overruns.

    python layout_runs.py LAYOUT ROOT STORE WORLD RUN...

writes one dump root per RUN, ROOT/RUN (each with a `statistics` and a `tensor` dump unless the
layout says otherwise). RUN "one" ("oneN": N steps, where the layout takes steps) is the same
model on one process, run in this process; the
others run in ONE `mp.spawn` of WORLD gloo ranks, each rank running them in order, so that the
tests of a layout share one process group. A RUN written `NAME:OP:CALL` plants a 1% fault at
call CALL of OP on rank 1 (`NAME` alone: healthy). From a test:

    roots = run_layout(tmp, "tp", 2, "one", "tp", "faulty:Functional.gelu:1")   # {run: root}
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LIMIT_S = 300
TASKS = ("statistics", "tensor")
Fault = Optional[tuple[str, int]]


def run_worker(tmp: Path, source: str, name: str, what: str, *args: object) -> str:
    """Run `source` (a script taking ROOT STORE ARGS...) as run `name`; ROOT when it ends well.
    `what`: the run in words, for the message when it does not finish in LIMIT_S."""
    script = tmp / f"worker_{name}.py"
    script.write_text(source)
    _spawn([str(script), str(tmp / name), str(tmp / f"store_{name}"), *map(str, args)],
           name, what)
    return str(tmp / name)


def run_layout(tmp: Path, layout: str, world: int, *runs: str) -> dict[str, str]:
    """Run this module's worker of `layout` for `runs` (one spawn of `world` ranks); {run's
    name: its dump root}."""
    root = tmp / f"{layout}{world}"
    _spawn([__file__, layout, str(root), str(tmp / f"store_{layout}{world}"), str(world),
                 *runs], layout, f"{world}-rank {layout} runs")
    return {run.split(":")[0]: str(root / run.split(":")[0]) for run in runs}


def _spawn(argv: list[str], name: str, what: str) -> None:
    import pytest

    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{name}: {what} under capture does not finish in {LIMIT_S} s")
    assert proc.returncode == 0, stderr[-3000:]


# ---- what the workers share -------------------------------------------------------------

def mlp(width: int = 16) -> torch.nn.Module:
    """Two blocks of Linear, GELU, Linear (the second block `width` wide), seed 0."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8),
                               torch.nn.Linear(8, width), torch.nn.GELU(),
                               torch.nn.Linear(width, 8))


def batch(*shape: int) -> torch.Tensor:
    torch.manual_seed(5)
    return torch.randn(*shape)


def _loss(model: torch.nn.Module, x: torch.Tensor) -> None:
    model(x).pow(2).mean().backward()


def capture(model: Any, x: torch.Tensor, root: str, fault: Fault,
            lr: float = 0.1, train: Callable[[Any, Any], None] = _loss,
            tasks: tuple[str, ...] = TASKS, steps: int = 1) -> None:
    """One dump per task under ROOT/TASK: `steps` captured training steps (SGD at `lr`) of
    `model` (a module, the same for every task, or a function making each task's), a 1% fault
    at `fault` (op, call) when given."""
    import opdiff
    from opdiff.testing.faults import inject_fault

    make = model if not isinstance(model, torch.nn.Module) else lambda: model
    for task in tasks:
        model = make()
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        dbg = opdiff.PrecisionDebugger(dump_path=f"{root}/{task}", level="L1", task=task)
        for _ in range(steps):
            with inject_fault(fault[0], call=fault[1], scale=1.01) if fault \
                    else contextlib.nullcontext():
                dbg.start(model)
                train(model, x)
                opt.step()
                dbg.stop()
                dbg.step()
            opt.zero_grad()


def _run(spec: str) -> tuple[str, Fault]:
    name, _, fault = spec.partition(":")
    op, _, call = fault.partition(":")
    return name, ((op, int(call)) if op else None)


def _init(rank: int, store: str, world: int) -> None:
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)


def _tp_plan(*pairs: str) -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {name: ColwiseParallel() if i % 2 == 0 else RowwiseParallel()
            for i, name in enumerate(pairs)}


# ---- one worker per layout: (rank, world, root, runs) on each rank; `one` for the golden ----

def tp_rank(rank: int, world: int, root: str, runs: list[str]) -> None:
    """DTensor ColwiseParallel/RowwiseParallel over both blocks; "replica": rank 1's copy of
    the second linear's bias off by 1e-3."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    def model_for(name: str) -> torch.nn.Module:
        model = parallelize_module(mlp(), mesh, _tp_plan("0", "2", "3", "5"))
        if name == "replica" and rank == 1:
            with torch.no_grad():
                model[2].bias._local_tensor.add_(1e-3)
        return model
    for spec in runs:
        name, fault = _run(spec)
        capture(functools.partial(model_for, name), batch(4, 8), f"{root}/{name}",
                fault if rank == 1 else None)


def tp_one(root: str) -> None:
    capture(mlp, batch(4, 8), root, None)


def ddp_rank(rank: int, world: int, root: str, runs: list[str]) -> None:
    """DistributedDataParallel, the batch of 8 split between the ranks; the same weights
    (lr 0) for both tasks."""
    for spec in runs:
        name, fault = _run(spec)
        model = torch.nn.parallel.DistributedDataParallel(mlp())
        capture(model, batch(8, 8).chunk(world)[rank], f"{root}/{name}",
                fault if rank == 1 else None, lr=0.0)


def ddp_one(root: str) -> None:
    model = mlp()
    capture(model, batch(8, 8), root, None, lr=0.0)


def fsdp_rank(rank: int, world: int, root: str, runs: list[str]) -> None:
    """FSDP2 on each linear and the root, the second block 15 wide (uneven shards), the batch
    of 8 split; the tensor task is the model's second step (its parameters gathered again)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for spec in runs:
        name, fault = _run(spec)
        model = mlp(15)
        for i in (0, 2, 3, 5):
            fully_shard(model[i], mesh=mesh)
        fully_shard(model, mesh=mesh)
        capture(model, batch(8, 8).chunk(world)[rank], f"{root}/{name}",
                fault if rank == 1 else None, lr=0.0)


def fsdp_one(root: str) -> None:
    model = mlp(15)
    capture(model, batch(8, 8), root, None, lr=0.0)


def mesh_rank(rank: int, world: int, root: str, runs: list[str]) -> None:
    """A 2 x 2 mesh: TP over the inner dim, DDP (`_pre_dp_module_transform`) over the outer
    one, the batch of 8 split between the data-parallel halves; a run named "...2" is two
    steps."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))

    def model_for() -> torch.nn.Module:
        model = parallelize_module(mlp(), mesh["tp"], _tp_plan("0", "2", "3", "5"))
        _pre_dp_module_transform(model)
        return torch.nn.parallel.DistributedDataParallel(model,
                                                         process_group=mesh["dp"].get_group())
    for spec in runs:
        name, fault = _run(spec)
        capture(model_for, batch(8, 8).chunk(2)[mesh.get_coordinate()[0]], f"{root}/{name}",
                fault if rank == 1 else None, steps=2 if name.endswith("2") else 1)


def mesh_one(root: str, steps: int = 1) -> None:
    capture(mlp, batch(8, 8), root, None, steps=steps)


def fsdp_tp_rank(rank: int, world: int, root: str, runs: list[str]) -> None:
    """A 2 x 2 mesh: FSDP2 (`fully_shard`) over the outer (dp) dim, TP over the inner one, the
    batch of 8 split between the data-parallel halves."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for spec in runs:
        name, fault = _run(spec)
        model = parallelize_module(mlp(), mesh["tp"], _tp_plan("0", "2", "3", "5"))
        for i in (0, 2, 3, 5):
            fully_shard(model[i], mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        capture(model, batch(8, 8).chunk(2)[mesh.get_coordinate()[0]], f"{root}/{name}",
                fault if rank == 1 else None, lr=0.0)


def fsdp_tp_one(root: str) -> None:
    ddp_one(root)


def pipeline_rank(rank: int, world: int, root: str, runs: list[str]) -> None:
    """Two stages: rank 0 block 0, rank 1 block 1 and the loss; activations and gradients sent
    between them."""
    def train(model: torch.nn.Module, x: torch.Tensor) -> None:
        if rank == 0:
            out = model(x)
            dist.send(out.detach(), 1)
            grad = torch.empty_like(out)
            dist.recv(grad, 1)
            out.backward(grad)
        else:
            inp = torch.empty(4, 8)
            dist.recv(inp, 0)
            inp.requires_grad_(True)
            model(inp).pow(2).mean().backward()
            dist.send(inp.grad, 0)

    def model_for() -> torch.nn.Module:
        model = mlp()
        for i in ((3, 4, 5) if rank == 0 else (0, 1, 2)):      # this rank's stage only
            model[i] = torch.nn.Identity()
        return model
    for spec in runs:
        name, fault = _run(spec)
        capture(model_for, batch(4, 8), f"{root}/{name}", fault if rank == 1 else None,
                train=train)


def pipeline_one(root: str) -> None:
    tp_one(root)


class Block(torch.nn.Module):
    """Layer norm, Linear, gelu, Linear, layer norm, head: the sequence-parallel model."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 8)
        self.norm2 = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))
        return self.head(self.norm2(h))


def block() -> Block:
    torch.manual_seed(0)
    return Block()


def sequence_rank(rank: int, world: int, root: str, runs: list[str]) -> None:
    """SequenceParallel on the two norms, the linears between them column/row parallel with the
    sequence dim split at their ends; each rank its half of the sequence."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    mesh = init_device_mesh("cpu", (world,))
    for spec in runs:
        name, fault = _run(spec)
        model = parallelize_module(block(), mesh, {
            "norm": SequenceParallel(),
            "fc1": ColwiseParallel(input_layouts=Shard(1)),
            "fc2": RowwiseParallel(output_layouts=Shard(1)),
            "norm2": SequenceParallel(),
            "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        })
        capture(model, batch(2, 8, 8).chunk(world, dim=1)[rank], f"{root}/{name}",
                fault if rank == 1 else None, lr=0.0)


def sequence_one(root: str) -> None:
    model = block()
    capture(model, batch(2, 8, 8), root, None, lr=0.0)


def collective_rank(rank: int, world: int, root: str, runs: list[str]) -> None:
    """A 3-layer MLP, statistics of one step, a 5% fault on rank 1's gelu where asked, as two
    kinds: FSDP2 with its gradient reduce-scatter recorded (each rank its own batch), and
    DTensor TP (ROOT/RUN/KIND)."""
    import opdiff
    from opdiff.capture.collectives import record_fsdp_reduce_scatter
    from opdiff.testing.faults import inject_fault
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    for spec in runs:
        name, fault = _run(spec)
        for kind in ("fsdp2", "tp"):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                        torch.nn.Linear(16, 2))
            if kind == "fsdp2":
                for part in (model[0], model[2], model):
                    fully_shard(part, mesh=mesh)
                record_fsdp_reduce_scatter(model)      # FSDP2's gradient reduce-scatter
                torch.manual_seed(1 + rank)            # data parallel: each rank its own batch
            else:
                parallelize_module(model, mesh, _tp_plan("0", "2"))
            x = torch.randn(4, 8)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            with inject_fault(fault[0], call=fault[1], scale=1.05) if fault and rank == 1 \
                    else contextlib.nullcontext():
                dbg = opdiff.PrecisionDebugger(dump_path=f"{root}/{name}/{kind}", level="L1",
                                               task="statistics")
                dbg.start()
                model(x).sum().backward()
                opt.step()
                dbg.stop()
                dbg.step()


# ---- expert parallel: a tiny mixture of experts, tokens routed to experts on other ranks ----

EXPERTS = 4


class MoE(torch.nn.Module):
    """A router (Linear 8 -> EXPERTS), top-1 by softmax, each token through its expert (Linear,
    gelu, Linear) scaled by its gate; `owned` experts are built here, the others live on other
    ranks. Each expert takes its tokens in global token order (stable sort), as under expert
    parallelism, where rank 0's tokens arrive before rank 1's."""

    def __init__(self, owned: range = range(EXPERTS)) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.router = torch.nn.Linear(8, EXPERTS)
        made = [torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                    torch.nn.Linear(16, 8)) for _ in range(EXPERTS)]
        self.owned = owned          # named by their global index: `experts.2.0.weight`
        self.experts = torch.nn.ModuleDict({str(i): made[i] for i in owned})

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gate, chosen = torch.softmax(self.router(x), dim=-1).max(dim=-1)
        order = torch.argsort(chosen, stable=True)
        return gate, chosen, order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, chosen, order = self.route(x)
        counts = torch.bincount(chosen, minlength=EXPERTS).tolist()
        pieces = x[order].split(counts)
        out = torch.cat([expert(piece) for expert, piece in zip(self.experts.values(), pieces)])
        back = torch.empty_like(out)
        back[order] = out
        return back * gate.unsqueeze(-1)


def _moe_loss(model: torch.nn.Module, x: torch.Tensor, tokens: int) -> None:
    model(x).pow(2).sum().div(tokens * 8).backward()


class ExpertParallel(MoE):
    """MoE over WORLD ranks, each holding EXPERTS / WORLD experts: tokens sent to their
    expert's rank with all_to_all (differentiable), sent back the same way."""

    def __init__(self, rank: int, world: int) -> None:
        per = EXPERTS // world
        super().__init__(range(rank * per, (rank + 1) * per))
        self.world, self.per = world, per

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.nn.functional import all_to_all_single

        gate, chosen, order = self.route(x)
        counts = torch.bincount(chosen, minlength=EXPERTS)
        sent = counts.view(self.world, self.per).sum(1).tolist()
        theirs = torch.empty_like(counts)
        dist.all_to_all_single(theirs, counts)               # how many of each expert arrive
        got = theirs.view(self.world, self.per)
        received = all_to_all_single(torch.empty(int(got.sum()), x.shape[1]), x[order],
                                     got.sum(1).tolist(), sent)
        # from each source rank, its tokens of my experts in expert order: regroup by expert
        chunks = [c.split(n.tolist()) for c, n in zip(received.split(got.sum(1).tolist()), got)]
        outs = [expert(torch.cat([chunks[src][e] for src in range(self.world)]))
                for e, expert in enumerate(self.experts.values())]
        per_src = [[o.split(got[:, e].tolist())[src] for e, o in enumerate(outs)]
                   for src in range(self.world)]
        done = all_to_all_single(torch.empty(x.shape[0], x.shape[1]),
                                 torch.cat([torch.cat(p) for p in per_src]),
                                 sent, got.sum(1).tolist())
        back = torch.empty_like(done)
        back[order] = done
        return back * gate.unsqueeze(-1)


def expert_rank(rank: int, world: int, root: str, runs: list[str]) -> None:
    """Expert parallel: 4 experts, each rank 2 of them and half the batch of 16 tokens (data
    parallel outside the experts); the router's weights the same on every rank (lr 0)."""
    import warnings

    # torch.distributed.nn.functional.all_to_all_single (differentiable) warns it is deprecated
    warnings.filterwarnings("ignore", "torch.distributed.nn.functional", FutureWarning)
    x = batch(16, 8)
    for spec in runs:
        name, fault = _run(spec)
        capture(functools.partial(ExpertParallel, rank, world), x.chunk(world)[rank],
                f"{root}/{name}", fault if rank == 1 else None, lr=0.0,
                train=functools.partial(_moe_loss, tokens=16))


def expert_one(root: str) -> None:
    capture(MoE, batch(16, 8), root, None, lr=0.0, train=functools.partial(_moe_loss, tokens=16))


def _work(rank: int, layout: str, root: str, store: str, world: int, runs: list[str]) -> None:
    _init(rank, store, world)
    globals()[f"{layout}_rank"](rank, world, root, runs)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    layout, root, store, world, *runs = sys.argv[1:]
    for run in runs:               # "one", or "oneN": the golden, N steps
        if run.startswith("one"):
            globals()[f"{layout}_one"](f"{root}/{run}", *([int(run[3:])] if run[3:] else []))
    runs = [r for r in runs if not r.startswith("one")]
    if runs:
        mp.spawn(_work, args=(layout, root, store, int(world), runs), nprocs=int(world),
                 join=True)
