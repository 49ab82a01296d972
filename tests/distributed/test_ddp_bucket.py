"""DDP's gradient all-reduce, recorded on request (`record_ddp_allreduce`): on a real 2-process
gloo DDP run with a gelu fault on rank 1, the bucket's all_reduce is a `Distributed.all_reduce`
record with its group and number on every rank, rank 1's gelu is the first divergence at its
line, and rank 0's gradients are received through that all_reduce from rank 1 (origin
"collective"), not a local error; a healthy pair names nothing (capture/api.py lets the
hook's collective through during backward)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch.distributed as dist

import opdiff

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]

_WORKER = textwrap.dedent('''
    import contextlib, gc, os, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    import opdiff
    from opdiff.capture.collectives import record_ddp_allreduce
    from opdiff.testing.faults import inject_fault

    def work(rank, root, store, faulty):
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        record_ddp_allreduce(ddp)
        torch.manual_seed(1 + rank)
        x = torch.randn(4, 8)
        fault = inject_fault("Functional.gelu", call=0, scale=1.05) if rank == faulty \\
            else contextlib.nullcontext()
        with fault:
            dbg = opdiff.PrecisionDebugger(dump_path=root, level="L1", task="tensor")
            dbg.start()
            ddp(x).sum().backward()              # STEP_LINE
            dbg.stop()
            dbg.step()
        dist.barrier()
        # Tear the gloo group down now, while the interpreter is whole. destroy_process_group()
        # alone leaves it alive: DDP's reducer (and the comm hook, in a reference cycle) still
        # hold it, with its worker and transport threads, until interpreter teardown, where
        # one of those C++ threads could be destroyed still joinable: SIGABRT, "terminate
        # called without an active exception" (about one run in twenty on a loaded machine).
        del ddp, model
        gc.collect()
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)         # the dump is closed: skip the teardown of torch's C++ globals too

    if __name__ == "__main__":
        mp.spawn(work, args=(sys.argv[1], sys.argv[2], int(sys.argv[3])), nprocs=2, join=True)
''')
STEP_LINE = next(i for i, line in enumerate(_WORKER.splitlines(), 1) if "STEP_LINE" in line)


def _run(tmp: Path, name: str, faulty: int) -> str:
    script = tmp / "ddp_worker.py"
    script.write_text(_WORKER)
    root = tmp / name
    proc = subprocess.run([sys.executable, str(script), str(root), str(tmp / f"store_{name}"),
                           str(faulty)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(root)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp_bucket")
    return (_run(tmp, "target", faulty=1), _run(tmp, "golden", faulty=-1),
            _run(tmp, "golden2", faulty=-1))


def test_the_bucket_all_reduce_is_recorded_and_carries_the_fault(runs):
    target, golden, _ = runs
    for rank in (0, 1):
        recs = [json.loads(line) for line in
                (Path(target) / "step0" / f"rank{rank}" / "records.jsonl").open()]
        reduces = [r for r in recs if r["op"] == "Distributed.all_reduce"]
        assert [r["group"] for r in reduces] == [{"ranks": [0, 1], "seq": 0}]
    result = opdiff.compare(target, golden)
    fd = result.first_divergence
    assert fd is not None and fd.rank == 1 and fd.op == "Functional.gelu"
    assert fd.location is not None and fd.location.line == STEP_LINE
    pairs = {p["rank"]: p for p in result.pairs}
    got = pairs[0]["first_divergence"]
    assert got is not None and got.origin == "collective" and got.op == "Distributed.all_reduce"
    assert "from rank 1" in got.reason


def test_a_healthy_ddp_pair_names_nothing(runs):
    _, golden, golden2 = runs
    assert opdiff.compare(golden2, golden).first_divergence is None
