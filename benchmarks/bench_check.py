"""`opdiff check` throughput: ops checked per second on the benchmark CNN and transformer
tensor dumps (benchmarks/models.py), with 1 and 2 jobs.

    python benchmarks/bench_check.py [--cnn-batch 8] [--tf-batch 4] [--seq 32] [--jobs 1 2]
                                     [--runs 3] [--dir DIR]

Each dump is one forward+backward step captured with opdiff.dump(level="mix", task="tensor");
a check replays every api record (forward and backward) in float64 and as the CPU reference
kernel, each on one CPU thread. ops/s = records looked at (checked + not checked) / wall time
of `check_dump`: the median of --runs with (min-max) beside it, the job counts interleaved run
by run so that all see the same machine load; the time to start the worker processes is
included. The machine's load average is printed: on a shared machine it moves every number.
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
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dir", default=None)
    args = p.parse_args(argv)
    from opdiff.check import check_dump

    root = Path(args.dir or tempfile.mkdtemp(prefix="bench_check_"))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on "
          f"{os.cpu_count()} cores; {args.runs} runs", flush=True)
    for name in ("cnn", "tf"):
        path = root / name / "step0" / "rank0"
        if not path.exists():
            path = build(root, name, args)
        times: dict[int, list[float]] = {jobs: [] for jobs in args.jobs}
        result = None
        for _ in range(args.runs):
            for jobs in args.jobs:
                start = time.perf_counter()
                result = check_dump(path, jobs=jobs)
                times[jobs].append(time.perf_counter() - start)
        assert result is not None
        n = len(result.ops)
        for jobs, walls in times.items():
            wall = statistics.median(walls)
            print(f"{name:4s} jobs={jobs}: {n} ops ({len(result.checked)} checked, "
                  f"{len(result.not_checked)} not, {len(result.failures)} failed) in {wall:.2f} s "
                  f"({min(walls):.2f}-{max(walls):.2f}): {n / wall:.1f} ops/s "
                  f"({n / max(walls):.1f}-{n / min(walls):.1f})", flush=True)
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
