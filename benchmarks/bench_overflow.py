"""Overhead of task="overflow_check" next to task="statistics": one process, same models.

    python benchmarks/bench_overflow.py [--steps 7] [--models cnn,transformer]

Level mix, forward + backward + SGD step, on the ResNet-style CNN and the small transformer of
benchmarks/models.py. Plain, statistics and overflow_check steps are interleaved in each round
(so machine noise hits all three), and the median step time of each is reported with its ratio
to plain. overflow_check should cost less than statistics: it reduces each op's outputs to one
"all finite" flag instead of six statistics, and writes nothing unless an op overflows.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import models  # noqa: E402

import opdiff  # noqa: E402

TASKS = ("statistics", "overflow_check")
WORKLOADS = {"cnn": models.cnn_workload, "transformer": models.transformer_workload}


def _train_step(model, batch, loss_fn, opt):
    opt.zero_grad(set_to_none=True)
    loss_fn(model, batch).backward()
    opt.step()


def bench(workload, steps: int, warmup: int = 2) -> dict:
    """{"plain" | task: [seconds per step]} measured in interleaved rounds."""
    model, batch, loss_fn = workload()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(warmup):
        _train_step(model, batch, loss_fn, opt)
    times = {"plain": [], **{t: [] for t in TASKS}}
    root = Path(tempfile.mkdtemp(prefix="opdiff-bench-overflow-"))
    try:
        for i in range(steps + 1):            # round 0 warms the capture paths up, not timed
            t0 = time.perf_counter()
            _train_step(model, batch, loss_fn, opt)
            elapsed = {"plain": time.perf_counter() - t0}
            for task in TASKS:
                path = root / f"{task}-{i}"
                t0 = time.perf_counter()
                dbg = opdiff.PrecisionDebugger(dump_path=str(path), level="mix", task=task,
                                               overflow_nums=-1)
                dbg.start(model)
                _train_step(model, batch, loss_fn, opt)
                dbg.stop()
                dbg.step()
                elapsed[task] = time.perf_counter() - t0
                shutil.rmtree(path, ignore_errors=True)
            if i:
                for k, v in elapsed.items():
                    times[k].append(v)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=7, help="timed rounds (median reported)")
    ap.add_argument("--models", default="cnn,transformer", help="comma list of: cnn, transformer")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, level mix, fwd+bwd, "
          f"median of {args.steps} steps")
    print(f"{'model':<12} {'setting':<16} {'median ms':>10} {'x plain':>8}")
    for name in args.models.split(","):
        times = bench(WORKLOADS[name], args.steps)
        plain = statistics.median(times["plain"])
        for key in ("plain", *TASKS):
            med = statistics.median(times[key])
            print(f"{name:<12} {key:<16} {med * 1e3:>10.1f} {med / plain:>8.2f}")
        ratio = statistics.median(times["overflow_check"]) / statistics.median(times["statistics"])
        print(f"{name:<12} overflow_check / statistics = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
