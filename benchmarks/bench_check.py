"""`opdiff check` throughput: ops checked per second on the benchmark CNN and transformer
tensor dumps (benchmarks/models.py), with 1 and 2 jobs.

    python benchmarks/bench_check.py [--cnn-batch 8] [--tf-batch 4] [--seq 32] [--jobs 1 2]
                                     [--runs 1] [--dir DIR]

Each dump is one forward+backward step captured with opdiff.dump(level="mix", task="tensor");
a check replays every api record (forward and backward) in float64 and as the CPU reference
kernel. ops/s = records looked at (checked + not checked) / wall time of `check_dump`,
median of --runs; the time to start the worker processes is included. The machine's load
average is printed: on a shared machine it moves every number.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build(root: Path, name: str, args: argparse.Namespace) -> Path:
    """Dump one training step of a benchmark model; return its step/rank directory."""
    import opdiff

    sys.path.insert(0, str(HERE))
    import models

    if name == "cnn":
        model, batch, loss_fn = models.cnn_workload(batch=args.cnn_batch)
    else:
        model, batch, loss_fn = models.transformer_workload(batch=args.tf_batch, seq=args.seq)
    if name == "tf":
        model.eval()        # dropout off: a random op cannot be checked
    with opdiff.dump(model, str(root / name), level="mix", task="tensor"):
        loss_fn(model, batch).backward()
    return root / name / "step0" / "rank0"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one line per model and job count."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cnn-batch", type=int, default=8)
    p.add_argument("--tf-batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--dir", default=None)
    args = p.parse_args(argv)
    from opdiff.check import check_dump

    root = Path(args.dir or tempfile.mkdtemp(prefix="bench_check_"))
    for name in ("cnn", "tf"):
        path = build(root, name, args)
        for jobs in args.jobs:
            times, result = [], None
            for _ in range(args.runs):
                start = time.perf_counter()
                result = check_dump(path, jobs=jobs)
                times.append(time.perf_counter() - start)
            assert result is not None
            wall = statistics.median(times)
            n = len(result.ops)
            print(f"{name:4s} jobs={jobs}: {n} ops ({len(result.checked)} checked, "
                  f"{len(result.not_checked)} not, {len(result.failures)} failed) in {wall:.2f} s: "
                  f"{n / wall:.1f} ops/s   (load average {os.getloadavg()[0]:.1f})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
