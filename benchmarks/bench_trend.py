"""Speed of `opdiff trend` on long monitor streams: 10 000 steps x 200 modules by default.

    python benchmarks/bench_trend.py [--steps 10000] [--modules 200] [--runs 3]

Writes two streams with the Monitor's own StreamWriter (the files Monitor writes: meta.json,
metrics.csv and metrics.f32; per module its seven forward/backward quantities, one weight per
module with its norm, gradient norm, update norm and Adam state norms), the target departing by
1% from step 3/4 of the run on in one module. Then times the `opdiff trend` command line, a
fresh process each time (interpreter start, imports, reading, analysis, summary.json, trend.html
and next_dump.json written), on one run and on the two runs, `--runs` times each, and reports
the median and spread, and checks that the planted step and module are what it names.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from opdiff.monitor.stream import MODULE_QUANTITIES, StreamWriter, column, rank_directory

PARAMETER_QUANTITIES = ("norm", "grad_norm", "update_norm", "exp_avg_norm", "exp_avg_sq_norm")


def write_stream(root: Path, steps: int, n_modules: int, depart_at=None, depart_module=None,
                 seed: int = 0) -> None:
    """A stream as Monitor writes it. Golden and target share the same noise (a deterministic
    pair that drifts by 1e-6); the target departs by 1% at `depart_at` in `depart_module`."""
    rng = np.random.default_rng(seed)
    names = [f"layers.{i}" for i in range(n_modules)]
    cols = ["loss", "grad_norm", "step_time"]
    for n in names:
        cols += [column(n, q) for q in MODULE_QUANTITIES]
    for n in names:
        cols += [column(f"{n}.weight", q) for q in PARAMETER_QUANTITIES]
    writer = StreamWriter(rank_directory(root, 0), flush_every=64)
    writer.write_meta({"format": "opdiff-monitor", "version": 1, "rank": 0, "world_size": 1,
                       "compute_dtype": "float32",
                       "modules": [{"name": n, "type": "Linear", "dtype": "float32"} for n in names],
                       "backward_order": names[::-1],
                       "parameters": [{"name": f"{n}.weight", "dtype": "float32", "shape": [64, 64],
                                       "updated": True} for n in names],
                       "config": {"every": 1}})
    writer.open(cols)
    base = rng.uniform(0.5, 2.0, len(cols))
    is_count = np.array([c.endswith(("_nan", "_inf")) for c in cols])
    base[is_count] = 0.0
    drift = np.random.default_rng(seed + 1)
    depart = None if depart_at is None else \
        np.array([c.startswith(f"{depart_module}:") for c in cols])
    for s in range(steps):
        row = base * (1 + 0.01 * np.sin(s / 50.0)) * (1 + 1e-6 * drift.standard_normal(len(cols)))
        row[is_count] = 0.0
        if depart is not None and s >= depart_at:
            row = np.where(depart, row * 1.01, row)
        writer.append(s, row)
    writer.close()


def _cli() -> list:
    script = Path(sys.executable).with_name("opdiff")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from opdiff.cli import main; sys.exit(main())"]


def time_cli(args: list, runs: int) -> tuple[list, str]:
    """Wall seconds of `opdiff ARGS` in a fresh process, `runs` times, and its last output."""
    times, out = [], ""
    for _ in range(runs):
        t0 = time.perf_counter()
        done = subprocess.run(_cli() + args, capture_output=True, text=True, env=dict(os.environ))
        times.append(time.perf_counter() - t0)
        if done.returncode != 0:
            raise SystemExit(f"opdiff {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
        out = done.stdout
    return times, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--modules", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3, help="timed runs of each command (spread)")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="opdiff-bench-trend-"))
    try:
        t0 = time.perf_counter()
        depart_at, module = args.steps * 3 // 4, f"layers.{args.modules // 3}"
        write_stream(root / "golden", args.steps, args.modules)
        write_stream(root / "target", args.steps, args.modules, depart_at, module)
        size = sum(p.stat().st_size for p in (root / "target").rglob("metrics.*")) / 1e6
        print(f"wrote two streams of {args.steps} steps x {args.modules} modules "
              f"({size:.0f} MB each: CSV and float32) in {time.perf_counter() - t0:.1f} s")
        for label, cmd in (("one run", ["trend", str(root / "target"), "-o", str(root / "one")]),
                           ("two runs", ["trend", str(root / "target"), str(root / "golden"),
                                         "-o", str(root / "two")])):
            times, out = time_cli(cmd, args.runs)
            print(f"opdiff trend, {label:<8}: median {statistics.median(times):.2f} s "
                  f"(runs {min(times):.2f}-{max(times):.2f} s)")
        named = f"step {depart_at}" in out and module in out
        print(f"two runs name step {depart_at} in {module} (planted): {'yes' if named else 'NO'}")
        return 0 if named else 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
