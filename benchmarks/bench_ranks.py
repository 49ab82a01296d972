"""Multi-rank compare: wall time of the local engine (process pool) against the Ray engine
(one task per step/rank pair), and the driver's peak memory, on synthetic many-rank dumps.

    python benchmarks/bench_ranks.py [--ranks 8 64] [--tensor-ranks 8] [--layers 24] [--dir DIR]

The dumps are generated, not trained: one forward+backward step of a `--layers`-deep MLP is
recorded by opdiff's own writer (PrecisionDebugger, task statistics or tensor), target with a
gelu fault on rank 1, and its rank directory is copied to every other rank. Each measurement
runs in a fresh process (so ru_maxrss is that compare's own driver peak); Ray's time starts
once its local cluster is up (`ray.init(num_cpus=os.cpu_count())` first, as for a cluster the
user already has; its workers still start inside the measured time). The load average is printed:
on a shared machine it moves every number.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def build(root: Path, ranks: int, task: str, layers: int, fault: bool) -> Path:
    """A dump root step0/rank{0..ranks-1} of one MLP step; rank 1 faulty when `fault`."""
    import torch

    import opdiff
    from opdiff.testing.faults import inject_fault

    def one(path: Path, faulty: bool) -> None:
        torch.manual_seed(0)
        blocks = []
        for _ in range(layers):
            blocks += [torch.nn.Linear(64, 64), torch.nn.GELU()]
        model = torch.nn.Sequential(*blocks)
        x = torch.randn(16, 64)
        dbg = opdiff.PrecisionDebugger(dump_path=str(path), level="L1", task=task)
        if faulty:
            with inject_fault("Functional.gelu", call=layers // 2, scale=1.01):
                dbg.start()
                model(x).sum().backward()
                dbg.stop()
        else:
            dbg.start()
            model(x).sum().backward()
            dbg.stop()

    one(root / "_healthy", False)
    healthy = root / "_healthy" / "step0" / "rank0"
    for r in range(ranks):
        dest = root / "step0" / f"rank{r}"
        if fault and r == 1:
            one(root / "_faulty", True)
            shutil.copytree(root / "_faulty" / "step0" / "rank0", dest)
        else:
            shutil.copytree(healthy, dest)
    shutil.rmtree(root / "_healthy")
    shutil.rmtree(root / "_faulty", ignore_errors=True)
    return root


def measure(target: str, golden: str, engine: str) -> dict:
    """One compare in this process: wall seconds, driver peak RSS (MiB), rows, first divergence."""
    import opdiff

    if engine == "ray":
        import ray

        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    start = time.perf_counter()
    result = opdiff.compare(target, golden, engine=engine, progress=False)
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    fd = result.first_divergence
    return {"wall": wall, "peak_mib": peak, "rows": len(result.rows),
            "first": f"{fd.name} rank {fd.rank}" if fd else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    p.add_argument("--tensor-ranks", type=int, nargs="*", default=[8])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--dir", default=None)
    p.add_argument("--one", nargs=3, metavar=("TARGET", "GOLDEN", "ENGINE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one)))
        return
    base = Path(args.dir or tempfile.mkdtemp(prefix="bench_ranks_"))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'dump':<18} {'engine':<6} {'wall s':>7} {'driver MiB':>10} {'rows':>6}  first divergence")
    cases = [("statistics", n) for n in args.ranks] + [("tensor", n) for n in args.tensor_ranks]
    for task, n in cases:
        t = build(base / f"{task}{n}" / "target", n, task, args.layers, fault=True)
        g = build(base / f"{task}{n}" / "golden", n, task, args.layers, fault=False)
        for engine in ("local", "ray"):
            env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
            out = subprocess.run([sys.executable, __file__, "--one", str(t), str(g), engine],
                                 capture_output=True, text=True, env=env)
            if out.returncode != 0:
                print(f"{task} {n:>3} ranks  {engine:<6} failed: {out.stderr.strip()[-300:]}")
                continue
            m = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{task + ' ' + str(n) + ' ranks':<18} {engine:<6} {m['wall']:>7.1f} "
                  f"{m['peak_mib']:>10.0f} {m['rows']:>6}  {m['first']}", flush=True)
    if not args.dir:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
