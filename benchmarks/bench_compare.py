"""Compare throughput: time `opdiff.compare` on tensor dump pairs of a few hundred MB per side.

    python benchmarks/bench_compare.py [--mb 300] [--models] [--runs 3] [--replay auto]
                                       [--replay-jobs N] [--threads N ...] [--against SRC ...]
                                       [--dir DIR] [--keep]

Pairs:
  synthetic   tanh ops on 4 MB float32 tensors; the target is the golden rounded through bf16,
              so no metric takes a shortcut (no identical tensors, no zeros)
  cnn, tf     with --models: the ResNet-style CNN and the transformer of benchmarks/models.py,
              one forward+backward captured with opdiff.dump(level="mix", task="tensor"); the
              target carries a planted 1e-4 fault (opdiff.testing.inject_fault). Real dumps
              save each tensor once and reference it from every record that saw it.
  cnn-bf16,   with --models: the target runs under CPU bf16 autocast, no planted fault, against
  tf-bf16     the fp32 golden (the issue's bar: nothing to find, so the default compare replays
              every op before it can say so)
  cnn-stat,   with --models: the fp32 pairs dumped with task="statistics" (no tensors: MB/s is
  tf-stat     not defined there, records/s is)

Every compare runs in a child process (so its peak RSS is its own) with `--replay` (default
"auto": what `opdiff compare` does by default, i.e. measuring plus the replays a verdict needs;
"off": the measuring path alone). MB/s per side = bytes of saved tensors in one side's dump /
compare time (`--clock wall`, the default, or `--clock cpu`: user+sys CPU seconds of the
compare and its replay processes); records/s = records of one side / that time; median of
--runs, (min-max) beside it. `--replay-jobs N` sets OPDIFF_REPLAY_JOBS for the child (the compare's replay
processes). `--threads 1 2` times this opdiff once per OPDIFF_REPLAY_THREADS value (1: replay
after measuring on one thread; 2, the default on 2+ cores: replay on a second thread while the
first measures), run for run interleaved; the cores this process may use are printed, since
the design's target is per side on 2 cores. `--against SRC` (repeatable) also times the opdiff package found under
SRC (the `src` directory of another checkout, e.g. `git archive <commit> src | tar -x -C
/tmp/old`), run for run interleaved with this one, so all see the same machine load; the load
average is printed, because on a shared machine it moves every number.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from opdiff.store import DumpWriter

HERE = Path(__file__).resolve().parent
THIS_SRC = HERE.parent / "src"

# The child: import opdiff from the given src directory, compare, report wall time and peak RSS.
_CHILD = r"""
import inspect, json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import opdiff
from opdiff.api import compare
assert opdiff.__file__.startswith(sys.argv[1]), opdiff.__file__
kwargs = {"progress": False}
if "replay" in inspect.signature(compare).parameters:
    kwargs["replay"] = sys.argv[4]
def cpu():  # this process and its finished children (the replay's worker processes)
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
start, cpu_start = time.perf_counter(), cpu()
result = compare(sys.argv[2], sys.argv[3], **kwargs)
wall, cpu_s = time.perf_counter() - start, cpu() - cpu_start
fd = result.first_divergence
try:  # VmHWM: this process's own peak. ru_maxrss would start at the parent's RSS (kept over exec)
    with open("/proc/self/status") as f:
        peak = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
except OSError:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
replayed = [n for n in result.notes if n.startswith("replayed")]
print(json.dumps({"wall": wall, "cpu": cpu_s, "rows": len(result.rows), "first": fd and fd.name, "rss_mb": peak,
                  "replayed": replayed[0] if replayed else ""}))
"""


def build_synthetic(root: Path, total_mb: int, tensor_mb: float = 4.0) -> None:
    """Golden and target dumps of ~total_mb of float32 tensors each."""
    numel = int(tensor_mb * (1 << 20) / 4)
    n_ops = max(1, int(total_mb / (2 * tensor_mb)))     # two tensors (input, output) per op
    g = torch.Generator().manual_seed(0)
    writers = {side: DumpWriter(root / side / "step0" / "rank0", {"environment": {}})
               for side in ("golden", "target")}
    for i in range(n_ops):
        x = torch.randn(numel, generator=g)
        y = torch.tanh(x)
        for side, w in writers.items():
            noise = side == "target"
            xi = x if not noise else x.bfloat16().float()
            yi = y if not noise else torch.tanh(xi).bfloat16().float()
            name = f"Torch.tanh.{i}.forward"
            rec = {"seq": i, "name": name, "op": "Torch.tanh", "kind": "api", "phase": "forward",
                   "module": None, "stack": None,
                   "inputs": [_desc(xi, f"{name}.input.0")],
                   "outputs": [_desc(yi, f"{name}.output.0")]}
            w.write(rec)
            w.save_tensor(f"{name}.input.0", xi.clone())
            w.save_tensor(f"{name}.output.0", yi.clone())
    for w in writers.values():
        w.close()


def _desc(t: torch.Tensor, key: str) -> dict:
    return {"type": "tensor", "dtype": "float32", "shape": list(t.shape), "key": key,
            "stats": {"max": float(t.max()), "min": float(t.min()), "mean": float(t.mean()),
                      "norm": float(t.norm()), "nan": 0, "inf": 0}}


def build_model(root: Path, name: str, task: str = "tensor", bf16: bool = False) -> None:
    """One training step of a benchmark model, golden and with a planted 1e-4 forward fault
    (bf16: the target under CPU bf16 autocast instead, no fault)."""
    import opdiff
    import opdiff.testing

    sys.path.insert(0, str(HERE))
    import models

    if name == "cnn":     # batch 24: ~450 MB of tensors per side
        workload = lambda: models.cnn_workload(batch=24)
        fault = dict(op="Tensor.__iadd__", call=3, scale=1 + 1e-4)
    else:                 # batch 16 x 64 tokens: ~170 MB per side
        workload = lambda: models.transformer_workload(batch=16, seq=64)
        fault = dict(op="Functional.linear", call=5, scale=1 + 1e-4)
    for side in ("golden", "target"):
        model, batch, loss_fn = workload()
        target = side == "target"
        planted = opdiff.testing.inject_fault(**fault) if target and not bf16 else \
            contextlib.nullcontext()
        with planted, opdiff.dump(model, str(root / side), level="mix", task=task):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=target and bf16):
                loss = loss_fn(model, batch)
            loss.float().backward()


def tensor_bytes(dump_root: Path) -> int:
    return sum(p.stat().st_size for p in dump_root.rglob("*.safetensors"))


def record_count(dump_root: Path) -> int:
    return sum(sum(1 for _ in p.open()) for p in dump_root.rglob("records.jsonl"))


def time_compare(src: Path, target: Path, golden: Path, replay: str = "auto",
                 replay_jobs: int | None = None, threads: int | None = None) -> dict:
    env = dict(os.environ)
    if replay_jobs is not None:
        env["OPDIFF_REPLAY_JOBS"] = str(replay_jobs)
    if threads is not None:
        env["OPDIFF_REPLAY_THREADS"] = str(threads)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(src), str(target), str(golden),
                           replay], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"compare with {src} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=300, help="MB of tensors per side, synthetic pair")
    ap.add_argument("--models", action="store_true", help="also dump and compare the CNN and transformer")
    ap.add_argument("--runs", type=int, default=3, help="compares per pair and implementation (median)")
    ap.add_argument("--replay", choices=("auto", "off", "all"), default="auto",
                    help="the compare's replay mode (default auto, as `opdiff compare`)")
    ap.add_argument("--replay-jobs", type=int, default=None,
                    help="OPDIFF_REPLAY_JOBS for the compares (default: opdiff's own choice)")
    ap.add_argument("--threads", type=int, nargs="+", default=None,
                    help="OPDIFF_REPLAY_THREADS values to time this opdiff with, interleaved "
                         "(default: opdiff's own choice)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time the compares by wall clock or by CPU time (user+sys of the "
                         "compare and its replay processes: steadier on a shared machine)")
    ap.add_argument("--only", nargs="+", default=None,
                    help="time only these pairs (synthetic cnn tf cnn-bf16 tf-bf16 cnn-stat tf-stat)")
    ap.add_argument("--against", type=Path, action="append", default=[],
                    help="src directory of another opdiff to time side by side (repeatable)")
    ap.add_argument("--dir", default=None,
                    help="where to build the dumps, or find them from an earlier run (kept)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary dumps afterwards")
    args = ap.parse_args(argv)
    root = Path(args.dir or tempfile.mkdtemp(prefix="opdiff-bench-"))
    impls: dict[str, tuple[Path, int | None]] = {}
    for src in args.against:
        if not (src / "opdiff" / "__init__.py").exists():
            raise SystemExit(f"--against {src}: no opdiff package there (give its src directory)")
        src = src.resolve()
        impls[src.name if src.name != "src" else src.parent.name] = (src, None)
    for n in args.threads or [None]:
        impls["this" if n is None else f"this/t{n}"] = (THIS_SRC, n)
    try:
        pairs = {}
        if not args.only or "synthetic" in args.only:
            pairs["synthetic"] = root / "synthetic"
            if not (root / "synthetic" / "golden").exists():
                build_synthetic(root / "synthetic", args.mb)
        if args.models:
            for name in ("cnn", "tf"):
                for task, pair, bf16 in (("tensor", name, False), ("tensor", f"{name}-bf16", True),
                                         ("statistics", f"{name}-stat", False)):
                    if args.only and pair not in args.only:
                        continue
                    pairs[pair] = root / pair
                    if not (root / pair / "golden").exists():
                        build_model(root / pair, name, task, bf16)
        if args.only:
            pairs = {k: v for k, v in pairs.items() if k in args.only}
        try:
            usable = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            usable = os.cpu_count() or 1
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
              f"on {os.cpu_count()} cores ({usable} usable by the compares)")
        runs: dict = {(p, i): [] for p in pairs for i in impls}
        for _ in range(args.runs):
            for pair, path in pairs.items():
                for impl, (src, threads) in impls.items():
                    runs[(pair, impl)].append(time_compare(src, path / "target", path / "golden",
                                                           args.replay, args.replay_jobs, threads))
        print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print()
        width = max(len(i) for i in impls) + 2
        print(f"replay={args.replay}, replay jobs={args.replay_jobs or 'default'}, {args.runs} runs, "
              f"clock={args.clock}")
        header = (f"{'pair':<10}{'impl':<{width}}{'MB/side':>8}{'records':>8}{'rows':>6}"
                  f"{args.clock + ' s':>8}{'(min-max)':>14}{'MB/s per side':>15}{'(min-max)':>12}"
                  f"{'records/s':>10}{'(min-max)':>14}{'peak RSS MB':>13}  first divergence")
        print(header)
        print("-" * len(header))
        for (pair, impl), results in runs.items():
            mb = tensor_bytes(pairs[pair] / "golden") / 1e6
            recs = record_count(pairs[pair] / "target")
            walls = [r[args.clock] for r in results]
            wall = statistics.median(walls)
            rss = max(r["rss_mb"] for r in results)
            mbs = (f"{mb / wall:15.0f}{f'({mb / max(walls):.0f}-{mb / min(walls):.0f})':>12}"
                   if mb > 0 else f"{'-':>15}{'':>12}")
            print(f"{pair:<10}{impl:<{width}}{mb:8.0f}{recs:8d}{results[0]['rows']:6d}{wall:8.2f}"
                  f"{f'({min(walls):.2f}-{max(walls):.2f})':>14}{mbs}{recs / wall:10.0f}"
                  f"{f'({recs / max(walls):.0f}-{recs / min(walls):.0f})':>14}"
                  f"{rss:13.0f}  {results[0]['first']}")
            for r in results:
                if r.get("replayed"):
                    print(f"{'':<10}  {r['replayed']}")
            both = "  ".join(
                f"{clock} {statistics.median(v):.2f} s ({min(v):.2f}-{max(v):.2f})"
                for clock in ("wall", "cpu") if (v := [r[clock] for r in results if clock in r]))
            print(f"{'':<10}  {both}")
        for impl, (src, threads) in impls.items():
            print(f"{impl}: {src}" + (f" (OPDIFF_REPLAY_THREADS={threads})" if threads else ""))
        print("\ngoal: >= 200 MB/s per side; peak RSS near a few tensors' worth "
              "(import torch alone: ~250 MB). msprobe's compare of the same step: "
              "benchmarks/bench_msprobe_compare.py")
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
