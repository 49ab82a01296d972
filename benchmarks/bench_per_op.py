"""Host time opdiff spends per recorded op, on a model whose kernels take next to nothing.

    python benchmarks/bench_per_op.py [--steps 31] [--level mix]

A deep MLP of tiny layers (width 16, batch 4): the plain step is almost all Python and
dispatch, so (captured step - plain step) / records per step is opdiff's own cost per record,
free of the memory traffic that makes ratios on real models noisy here. On a GPU, where kernels
run asynchronously, this host time is what capture adds to a step. Plain and captured steps
alternate (one thread); medians.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn

import opdiff
from opdiff.store import open_dump


def tiny_mlp(depth: int = 32, width: int = 16) -> nn.Module:
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=31)
    parser.add_argument("--level", default="mix")
    parser.add_argument("--task", default="statistics")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: this process's CPU time (steadier on a shared machine)")
    parser.add_argument("--pattern", choices=["reuse", "construct"], default="reuse",
                        help="reuse: one debugger, start/stop/step each step (what a user does); "
                             "construct: a new PrecisionDebugger every step (the old figure)")
    args = parser.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = tiny_mlp()
    x = torch.randn(4, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    for _ in range(3):
        step()
    root = Path(tempfile.mkdtemp(prefix="opdiff-bench-"))
    plain, captured, records = [], [], 0
    shared = opdiff.PrecisionDebugger(dump_path=str(root / "shared"), level=args.level,
                                      task=args.task)
    try:
        for i in range(args.steps):
            t0 = clock()
            step()
            plain.append(clock() - t0)
            if args.pattern == "reuse":
                path, dbg, t0 = root / "shared", shared, clock()
            else:
                path, t0 = root / str(i), clock()
                dbg = opdiff.PrecisionDebugger(dump_path=str(path), level=args.level, task=args.task)
            dbg.start(model)
            step()
            dbg.stop()
            dbg.step()
            captured.append(clock() - t0)
            directory = path / f"step{dbg.session.step_index - 1}" / "rank0"
            if i == 0:
                records = sum(1 for _ in open_dump(directory).records())
            shutil.rmtree(directory.parent if args.pattern == "reuse" else path, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    p, c = statistics.median(plain), statistics.median(captured)
    print(f"level {args.level}, task {args.task}, {args.clock} clock: plain step {p * 1e3:.2f} ms, captured "
          f"{c * 1e3:.2f} ms, {records} records: {(c - p) / records * 1e6:.1f} us per record")


if __name__ == "__main__":
    main()
