"""One stream per rank; trend compares rank by rank and says which rank parts first."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opdiff.trend import read_run, trend

from .training import train

TESTS = Path(__file__).resolve().parent.parent


def test_ranks_are_compared_one_by_one_and_the_first_to_part_is_named(tmp_path):
    for rank in (0, 1):
        train(tmp_path / "golden", 40, rank=rank, seed=rank)
        fault = "block" if rank == 1 else None
        train(tmp_path / "target", 40, fault=fault, fault_step=25, rank=rank, seed=rank)
    assert sorted(read_run(tmp_path / "target").ranks) == [0, 1]
    result = trend(tmp_path / "target", tmp_path / "golden")
    assert result.first_divergence.rank == 1 and result.first_divergence.step == 25
    assert result.ranks[0].first is None and result.ranks[1].first.module == "blocks.1"
    assert "at step 25 on rank 1 first" in result.message
    summary = result.to_dict()
    assert summary["ranks"]["0"]["first_divergence"] is None
    assert summary["ranks"]["1"]["first_divergence"]["step"] == 25


DDP = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist, torch.nn.functional as F
    sys.path.insert(0, sys.argv[4])
    from trend.training import LR, TinyTransformer, batches, plant
    import opdiff
    torch.set_num_threads(1)
    rank, path, faulty, store = int(os.environ["RANK"]), sys.argv[1], sys.argv[2] == "fault", sys.argv[3]
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"file://{store}")
    opdiff.seed_all(0)
    model = TinyTransformer()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=LR)
    now = {"step": -1}
    if faulty and rank == 1:
        plant(model.blocks[1], lambda: now["step"] >= 16, lambda y: y * (1 + 1e-3))
    mon = opdiff.Monitor(model, path, optimizer=opt)      # rank from torch.distributed
    data = batches(16)[rank::2]
    for step in range(28):
        now["step"] = step
        tokens = data[step % len(data)]
        loss = F.cross_entropy(ddp(tokens).flatten(0, 1), tokens.roll(1, 1).flatten())
        loss.backward(); opt.step(); mon.step(loss); opt.zero_grad()
    mon.close()
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_real_ddp_ranks_part_where_the_faulty_rank_computes(tmp_path):
    """Two gloo processes: rank 1's block 1 is off from step 16. Rank 1 parts in its forward;
    rank 0 only through the all-reduced gradients, so rank 1 is named first."""
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    env = dict(os.environ, WORLD_SIZE="2", PYTHONPATH=os.pathsep.join(sys.path))
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / run),
                               "fault" if run == "target" else "-", str(tmp_path / f"store-{run}"),
                               str(TESTS)], env=dict(env, RANK=str(r)), stderr=subprocess.PIPE,
                              text=True)
             for run in ("golden", "target") for r in (0, 1)]     # both runs at once
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    result = trend(tmp_path / "target", tmp_path / "golden")
    first = result.first_divergence
    assert (first.rank, first.step, first.module, first.phase) == (1, 16, "blocks.1", "forward")
    rank0 = result.ranks[0].first
    assert rank0.step == 16 and rank0.phase == "parameters"   # the all-reduce brought it over
    assert read_run(tmp_path / "target").ranks[1].meta["world_size"] == 2
