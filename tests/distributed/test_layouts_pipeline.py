"""A 2-stage pipeline on 2 gloo CPU ranks (rank 0: block 0; rank 1: block 1 and the loss;
activations and gradients sent between them), compared with the same model on one process:
the stages are chained into one run (comparison/layouts/chain.py), so a healthy pair names
nothing with nothing unmatched, and a 1% fault after stage 1's gelu is named at that gelu, on
rank 1, at its line. Before, 72 of 158 rows were unmatched and the faulty pair named rank 0.

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

    def stage(rank, root, faulty, task):
        model = model_()
        for i in ((3, 4, 5) if rank == 0 else (0, 1, 2)):      # this rank's stage only
            model[i] = torch.nn.Identity()
        torch.manual_seed(5)
        x = torch.randn(4, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        fault = inject_fault("Functional.gelu", call=0, scale=1.01) if rank == faulty \\
            else contextlib.nullcontext()
        dbg = opdiff.PrecisionDebugger(dump_path=f"{root}/{task}", level="L1", task=task)
        with fault:
            dbg.start(model)
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
            opt.step()
            dbg.stop()
            dbg.step()

    def work(rank, root, store, faulty):
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
        for task in ("statistics", "tensor"):
            stage(rank, root, faulty, task)
        dist.barrier()
        dist.destroy_process_group()

    def one(root):
        for task in ("statistics", "tensor"):
            model = model_()
            torch.manual_seed(5)
            x = torch.randn(4, 8)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            dbg = opdiff.PrecisionDebugger(dump_path=f"{root}/{task}", level="L1", task=task)
            dbg.start(model)
            model(x).pow(2).mean().backward()
            opt.step()
            dbg.stop()
            dbg.step()

    if __name__ == "__main__":
        root, store, faulty = sys.argv[1], sys.argv[2], int(sys.argv[3])
        if faulty == -2:
            one(root)
        else:
            mp.spawn(work, args=(root, store, faulty), nprocs=2, join=True)
''')
def _run(tmp: Path, name: str, faulty: int) -> str:
    return run_worker(tmp, _WORKER, name, "a 2-stage pipeline step", faulty)


@pytest.fixture(scope="session")
def pp_roots(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipeline")
    return {"one": _run(tmp, "one", -2), "pp": _run(tmp, "pp", -1), "faulty": _run(tmp, "faulty", 1)}


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_healthy_pipeline_against_one_device_names_nothing(pp_roots, task):
    result = opdiff.compare(f"{pp_roots['pp']}/{task}", f"{pp_roots['one']}/{task}")
    assert result.first_divergence is None, result.first_divergence
    assert result.counts["error"] == result.counts["unmatched"] == result.counts["warning"] == 0
    assert any("chained into one run as pipeline stages" in n for n in result.notes)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_fault_in_stage_1_is_named_on_rank_1_at_its_line(pp_roots, task):
    result = opdiff.compare(f"{pp_roots['faulty']}/{task}", f"{pp_roots['one']}/{task}")
    fd = result.first_divergence
    # stage 1's first gelu is the logical run's second
    assert fd is not None and fd.name == "Functional.gelu.1.forward", fd
    assert fd.rank == 1 and "pipeline stage 1" in fd.reason
    assert fd.location is not None and "model(inp)" in fd.location.code
