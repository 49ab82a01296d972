"""test_run_ddp.py's DDP script with 4 gloo processes: a broken gelu on rank 2, golden and target
each launched as `torchrun --nproc_per_node 4 -m opdiff run -- train.py`. The compare names rank
2's gelu at its line, and every other rank's step-0 pair is origin "collective" (its gradients
came from rank 2 through DDP's all-reduce, recorded without an opt-in)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist
from runkit import run
from test_run_ddp import FORWARD_LINE, PLAIN

import opdiff

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not dist.is_available(), reason="torch.distributed not built")]

RANKS = 4
FAULT_RANK = 2
ARGS = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(RANKS),
        "-m", "opdiff", "run", "--dump", "dump", "--steps", "0", "--", "train.py"]


def _launch(where: Path, fault: int) -> Path:
    where.mkdir()
    (where / "train.py").write_text(PLAIN)
    proc = run(ARGS, where, timeout=300, FAULT_RANK=str(fault))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return where / "dump"


def test_four_ranks_name_the_faulty_one_and_the_collective_on_the_others(tmp_path):
    target = _launch(tmp_path / "target", fault=FAULT_RANK)
    golden = _launch(tmp_path / "golden", fault=-1)
    for dump in (target, golden):
        assert sorted(p.name for p in dump.iterdir()) == ["step0"]
        assert sorted(p.name for p in (dump / "step0").iterdir()) == [f"rank{r}" for r in range(RANKS)]
    result = opdiff.compare(str(target), str(golden))
    fd = result.first_divergence
    assert fd is not None and (fd.rank, fd.step, fd.op, fd.origin) == (FAULT_RANK, 0, "Functional.gelu", "op")
    assert fd.location is not None and fd.location.line == FORWARD_LINE and fd.location.file.endswith("train.py")
    pairs = {(p["step"], p["rank"]): p["first_divergence"] for p in result.pairs}
    assert sorted(pairs) == [(0, r) for r in range(RANKS)]
    for rank in range(RANKS):
        if rank == FAULT_RANK:
            continue
        got = pairs[(0, rank)]
        assert got is not None and got.origin == "collective" and got.op == "Distributed.all_reduce", (rank, got)
        assert f"from rank {FAULT_RANK}" in got.reason, (rank, got.reason)
