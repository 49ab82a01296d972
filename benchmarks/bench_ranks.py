"""Multi-rank compare: wall time of the local engine (process pool) against the Ray engine
(one task per step/rank pair, or `ray-shards`: each pair's tensor measurements cut into shard
tasks of `--shard-mb`), the driver's peak memory, and how the work spread over Ray's tasks and
workers (Ray's timeline), on synthetic many-rank dumps.

    python benchmarks/bench_ranks.py [--ranks 8 64] [--tensor-ranks 8] [--layers 24] [--dir DIR]
                                     [--repeat 3] [--engines local ray ray-shards]

The dumps are generated, not trained: one forward+backward step of a `--layers`-deep MLP is
recorded by opdiff's own writer (PrecisionDebugger, task statistics or tensor), target with a
gelu fault on rank 1, and its rank directory is copied to every other rank. Each measurement
runs in a fresh process (so ru_maxrss is that compare's own driver peak) and writes the full
report (`-o`: CSV, rows.jsonl, summary.json, report.html), as a user's compare does; Ray's time
starts once its local cluster is up (`ray.init(num_cpus=os.cpu_count())` first, as for a cluster
the user already has; its workers still start inside the measured time).

Driver memory is reported twice: the peak RSS of the driver process (ru_maxrss, which includes
torch and Ray's own import, ~250 MiB) and the compare's own growth, that peak less the RSS just
before the compare started (after importing torch, opdiff's comparison and report, and
`ray.init`). With `--repeat N` each case runs
N times and the median and the range (min-max) are printed. The load average is printed: on a
shared machine it moves every number.
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
import statistics
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


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _spread_over_tasks(ray) -> dict:
    """From Ray's timeline (task events of this cluster, which ran only this compare): tasks by
    function, and each worker's seconds executing them."""
    time.sleep(2.0)                  # task events reach the GCS after a short delay
    kinds: dict[str, int] = {}
    busy: dict[str, float] = {}
    for e in ray.timeline():
        if str(e.get("cat", "")).startswith("task::"):
            kind = str(e["name"]).rsplit(".", 1)[-1]
            kinds[kind] = kinds.get(kind, 0) + 1
        elif e.get("cat") == "task:execute":
            busy[e["tid"]] = busy.get(e["tid"], 0.0) + float(e["dur"]) / 1e6
    return {"tasks": kinds, "worker_s": sorted(busy.values())}


def measure(target: str, golden: str, engine: str, shard_mb: float = 0.5) -> dict:
    """One compare in this process, report files written: wall seconds, driver peak RSS and its
    growth during the compare (MiB), rows, first divergence; for Ray, how the work was spread
    over its tasks and workers. engine "ray-shards": Ray with `RayEngine(shard_mb=shard_mb)`."""
    import opdiff
    import opdiff.comparison.pair  # noqa: F401 - torch and the comparison, before the baseline
    import opdiff.report.html  # noqa: F401
    from opdiff.comparison.engines import RayEngine

    ray = None
    if engine.startswith("ray"):
        import ray

        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    runner = RayEngine(shard_mb=shard_mb) if engine == "ray-shards" else engine
    out = tempfile.mkdtemp(prefix="bench_ranks_out_")
    before = _rss_mib()
    start = time.perf_counter()
    result = opdiff.compare(target, golden, output_path=out, engine=runner, progress=False)
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    fd = result.first_divergence
    rows = len(result.rows)
    shutil.rmtree(out)
    got = {"wall": wall, "peak_mib": peak, "growth_mib": peak - before, "rows": rows,
           "first": f"{fd.name} rank {fd.rank}" if fd else None}
    if ray is not None:
        got.update(_spread_over_tasks(ray))
    return got


def _spread(values: list[float], digits: int) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="*", default=[8, 64])
    p.add_argument("--tensor-ranks", type=int, nargs="*", default=[8])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--dir", default=None)
    p.add_argument("--repeat", type=int, default=1, help="runs per case (median and range)")
    p.add_argument("--engines", nargs="+", default=["local", "ray", "ray-shards"],
                   help="local, ray (a task per pair), ray-shards (pairs cut by --shard-mb)")
    p.add_argument("--shard-mb", type=float, default=0.5,
                   help="ray-shards: MiB of saved tensors per shard task (tensor dumps)")
    p.add_argument("--one", nargs=3, metavar=("TARGET", "GOLDEN", "ENGINE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(*args.one, shard_mb=args.shard_mb)))
        return
    base = Path(args.dir or tempfile.mkdtemp(prefix="bench_ranks_"))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          f"{args.repeat} run(s) per case: median (min-max)")
    print(f"{'dump':<18} {'engine':<10} {'wall s':>18} {'driver peak MiB':>18} "
          f"{'compare growth MiB':>20} {'rows':>6}  first divergence")
    cases = [("statistics", n) for n in args.ranks] + [("tensor", n) for n in args.tensor_ranks]
    for task, n in cases:
        t, g = base / f"{task}{n}" / "target", base / f"{task}{n}" / "golden"
        if not (t / "step0").exists():
            build(t, n, task, args.layers, fault=True)
            build(g, n, task, args.layers, fault=False)
        for engine in args.engines:
            env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
            runs = []
            for _ in range(args.repeat):
                out = subprocess.run([sys.executable, __file__, "--one", str(t), str(g), engine,
                                      "--shard-mb", str(args.shard_mb)],
                                     capture_output=True, text=True, env=env)
                if out.returncode != 0:
                    print(f"{task} {n:>3} ranks  {engine:<10} failed: {out.stderr.strip()[-300:]}")
                    break
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            if not runs:
                continue
            m = runs[0]
            print(f"{task + ' ' + str(n) + ' ranks':<18} {engine:<10} "
                  f"{_spread([r['wall'] for r in runs], 1):>18} "
                  f"{_spread([r['peak_mib'] for r in runs], 0):>18} "
                  f"{_spread([r['growth_mib'] for r in runs], 0):>20} {m['rows']:>6}  {m['first']}",
                  flush=True)
            if "tasks" in m:      # the work spread over Ray's tasks and workers (first run)
                busy = m["worker_s"]
                print(f"{'':<25} tasks {m['tasks']}; {len(busy)} workers busy "
                      f"{min(busy):.1f}-{max(busy):.1f} s each ({sum(busy):.1f} s in all)",
                      flush=True)
    if not args.dir:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
