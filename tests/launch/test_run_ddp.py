"""A DDP script with no opdiff line, golden and target (a broken gelu on rank 1) each launched
through `opdiff run` under torchrun with 2 gloo processes: the compare names rank 1's gelu at
its line, and rank 0's step-0 pair is origin "collective" (its gradients came through DDP's
all-reduce, recorded without an opt-in call). The same answer with `PrecisionDebugger` in the
script and no `record_ddp_allreduce`. Training under `opdiff run` is bit for bit the same."""
from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from runkit import run

import opdiff

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]

SCRIPT = textwrap.dedent('''
    import contextlib, os, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    fault = contextlib.nullcontext()
    if int(os.environ.get("FAULT_RANK", "-1")) == rank:   # a broken gelu kernel on this rank
        from opdiff.testing.faults import inject_fault
        fault = inject_fault("Functional.gelu", call=0, scale=1.05)
    DEBUGGER
    torch.manual_seed(1 + rank)
    with fault:
        for step in range(2):
            x = torch.randn(4, 8)
            START
            loss = ddp(x).pow(2).mean()          # FORWARD_LINE
            loss.backward()
            opt.step()
            opt.zero_grad()
            STOP
    torch.save(model.state_dict(), f"params.rank{rank}.pt")
    # DDP's reducer holds the gloo group (and a comm hook) until interpreter exit, where gloo's
    # threads can abort the process ("terminate called without an active exception", seen once
    # in CI under load): free it first, as tests/distributed/test_ddp_bucket.py does.
    del ddp, opt
    import gc; gc.collect()
    dist.destroy_process_group()
''')
FORWARD_LINE = next(i for i, line in enumerate(SCRIPT.splitlines(), 1) if "FORWARD_LINE" in line)
PLAIN = SCRIPT.replace("DEBUGGER", "").replace("START", "").replace("STOP", "")
IN_SCRIPT = SCRIPT.replace(
    "DEBUGGER", "import opdiff; dbg = opdiff.PrecisionDebugger(dump_path=sys.argv[1], level='mix', step=[0, 1])"
).replace("START", "dbg.start(ddp)").replace("STOP", "dbg.stop(); dbg.step()")
OWN_HOOK = PLAIN.replace(
    "opt = torch.optim", "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks; "
    "ddp.register_comm_hook(None, default_hooks.allreduce_hook); opt = torch.optim")
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def _launch(tmp: Path, name: str, args: list, fault: int, script: str = PLAIN) -> Path:
    where = tmp / name
    where.mkdir()
    (where / "train.py").write_text(script)
    proc = run(args, where, timeout=300, FAULT_RANK=str(fault))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return where


def _torchrun_bin() -> str:
    return str(Path(sys.executable).parent / "torchrun")


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run_ddp")
    # torchrun runs `opdiff run` in each worker (runpy form) ...
    target = _launch(tmp, "target", TORCHRUN + ["-m", "opdiff", "run", "--dump", "dump", "--steps", "0-1",
                                                "--", "train.py"], fault=1)
    # ... or opdiff run launches torchrun, which reaches the workers through PYTHONPATH
    launcher = [_torchrun_bin()] if os.path.exists(_torchrun_bin()) else [sys.executable] + TORCHRUN
    golden = _launch(tmp, "golden", ["-m", "opdiff", "run", "--dump", "dump", "--steps", "0-1", "--",
                                     *launcher, *TORCHRUN[2:], "train.py"], fault=-1)
    plain = _launch(tmp, "plain", TORCHRUN + ["train.py"], fault=-1)
    return target, golden, plain


def _check(target: Path, golden: Path) -> None:
    result = opdiff.compare(str(target), str(golden))
    fd = result.first_divergence
    assert fd is not None and (fd.rank, fd.step, fd.op) == (1, 0, "Functional.gelu")
    assert fd.location is not None and fd.location.line == FORWARD_LINE and fd.location.file.endswith("train.py")
    pairs = {(p["step"], p["rank"]): p["first_divergence"] for p in result.pairs}
    got = pairs[(0, 0)]
    assert got is not None and got.origin == "collective" and got.op == "Distributed.all_reduce"
    assert "from rank 1" in got.reason


def test_opdiff_run_names_the_faulty_rank_and_the_collective(launched):
    target, golden, _ = launched
    for run_dir in (target, golden):
        assert sorted(p.name for p in (run_dir / "dump").iterdir()) == ["step0", "step1"]
        assert sorted(p.name for p in (run_dir / "dump/step0").iterdir()) == ["rank0", "rank1"]
    _check(target / "dump", golden / "dump")


def test_training_under_opdiff_run_is_bitwise_the_same(launched):
    _, golden, plain = launched
    for rank in (0, 1):
        a = torch.load(golden / f"params.rank{rank}.pt")
        b = torch.load(plain / f"params.rank{rank}.pt")
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_precision_debugger_in_the_script_records_the_all_reduce_without_opt_in(tmp_path):
    target = _launch(tmp_path, "target", TORCHRUN + ["train.py", "dump"], fault=1, script=IN_SCRIPT)
    golden = _launch(tmp_path, "golden", TORCHRUN + ["train.py", "dump"], fault=-1, script=IN_SCRIPT)
    _check(target / "dump", golden / "dump")


def test_an_unrecorded_all_reduce_is_inferred(tmp_path):
    """The user's own comm hook stays (said once); rank 0 is still not blamed: what it read
    after the all-reduce is origin "collective", inferred."""
    args = TORCHRUN + ["-m", "opdiff", "run", "--dump", "dump", "--steps", "0", "--", "train.py"]
    target = _launch(tmp_path, "target", args, fault=1, script=OWN_HOOK)
    golden = _launch(tmp_path, "golden", args, fault=-1, script=OWN_HOOK)
    result = opdiff.compare(str(target / "dump"), str(golden / "dump"))
    fd = result.first_divergence
    assert fd is not None and (fd.rank, fd.op, fd.origin) == (1, "Functional.gelu", "op")
    got = {p["rank"]: p["first_divergence"] for p in result.pairs}[0]
    assert got is not None and got.origin == "collective"
    assert "inferred: not recorded" in got.reason and "from rank 1" in got.reason
    assert got.location is not None and got.location.code == "opt.step()"


FSDP = textwrap.dedent('''
    import contextlib, os
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
    for module in (model[0], model[2], model):
        fully_shard(module, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fault = contextlib.nullcontext()
    if int(os.environ.get("FAULT_RANK", "-1")) == rank:
        from opdiff.testing.faults import inject_fault
        fault = inject_fault("Functional.gelu", call=0, scale=1.05)
    torch.manual_seed(1 + rank)
    with fault:
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    dist.destroy_process_group()
''')


def test_fsdp2_reduce_scatter_is_recorded_without_opt_in(tmp_path):
    args = TORCHRUN + ["-m", "opdiff", "run", "--dump", "dump", "--level", "L1", "--", "train.py"]
    target = _launch(tmp_path, "target", args, fault=1, script=FSDP)
    golden = _launch(tmp_path, "golden", args, fault=-1, script=FSDP)
    result = opdiff.compare(str(target / "dump"), str(golden / "dump"))
    fd = result.first_divergence
    assert fd is not None and (fd.rank, fd.op) == (1, "Functional.gelu")
    got = {p["rank"]: p["first_divergence"] for p in result.pairs}[0]
    assert got is not None and got.origin == "collective" and got.op.startswith("Distributed.reduce_scatter")
    assert "from rank 1" in got.reason
