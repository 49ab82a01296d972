"""Capture overhead on a `torch.compile`d training step, and compile time with and without opdiff.

    python benchmarks/bench_compile.py [--backends aot_eager,inductor] [--levels mix]
                                       [--rounds 11] [--runs 3] [--compiles 3]

Workload: the tiny Llama of benchmarks/models.py (2 layers, hidden 64, batch 2 x 32 tokens),
forward + backward + SGD step, the model compiled with `torch.compile(model, backend=...)`, the
optimizer eager; one thread (torch.set_num_threads(1)).

Overhead: two copies of the model, each compiled, one recorded every step by a
PrecisionDebugger (task="statistics", `--levels`, default mix). Each round runs one plain and
one recorded step, alternating which goes first; after warm-up rounds (which also compile) the
median step time of each is taken and their ratio reported, wall and this thread's CPU time,
with the records a recorded step writes; `--runs` repeats the whole measurement to show its
spread.

Compile time: the first step of a fresh model after `torch._dynamo.reset()` (dynamo, AOT
autograd, the backend's compile, and the step itself), plain and recorded alternately,
`--compiles` times each, medians. Inductor's FX graph and AOT autograd caches are off
(TORCHINDUCTOR_FX_GRAPH_CACHE=0, TORCHINDUCTOR_AUTOGRAD_CACHE=0) so each compile lowers and
generates code again; the C++ compiler's output is still reused from disk (same kernels: capture
does not change the graph), after one untimed warm-up compile.

`--warm-cache`: the caches on, in a private cache directory, warmed by that warm-up compile: the
plain compile is handed its code back, as a user's second run of a script is, while the recorded
one generates it again (opdiff turns both caches off while it records at mix and L2, so that
each kernel names its modules: capture/inductor.py).
"""
from __future__ import annotations

import os
import sys

if "--warm-cache" in sys.argv:
    import tempfile as _tempfile
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _tempfile.mkdtemp(prefix="opdiff-bench-cache-")
else:
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")

import argparse  # noqa: E402
import gc  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Optional  # noqa: E402

import torch  # noqa: E402
import torch._dynamo  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import models  # noqa: E402

import opdiff  # noqa: E402


def _setup(backend: str) -> tuple[Any, Callable[[], None]]:
    """(the eager model, one compiled training step of it)."""
    model, batch, loss_fn = models.llama_workload()
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(compiled, batch).backward()
        opt.step()
    return model, step


def _timed(step: Callable[[], None], dbg: Any = None, model: Any = None) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.thread_time()
    if dbg is not None:
        dbg.start(model)
    step()
    if dbg is not None:
        dbg.stop()
        dbg.step()
    return time.perf_counter() - t0, time.thread_time() - c0


def overhead(backend: str, level: str, rounds: int, warmup: int = 3) -> dict[str, list[float]]:
    """Step times of interleaved plain and recorded steps (after warm-up)."""
    torch._dynamo.reset()
    _, plain = _setup(backend)
    twin, recorded = _setup(backend)
    root = Path(tempfile.mkdtemp(prefix="opdiff-bench-compile-"))
    dbg = opdiff.PrecisionDebugger(dump_path=str(root / "dump"), level=level, task="statistics")
    times: dict[str, list[float]] = {"plain": [], "recorded": [], "plain_cpu": [],
                                     "recorded_cpu": []}
    from torch._dynamo.utils import counters
    try:
        for i in range(warmup + rounds):
            if i == warmup:
                graphs = counters["stats"]["unique_graphs"]
            for kind in (("plain", "recorded") if i % 2 else ("recorded", "plain")):
                wall, cpu = (_timed(plain) if kind == "plain" else
                             _timed(recorded, dbg, twin))
                if i >= warmup:
                    times[kind].append(wall)
                    times[kind + "_cpu"].append(cpu)
        if counters["stats"]["unique_graphs"] != graphs:     # the ratio would time compiles
            print(f"  warning: {counters['stats']['unique_graphs'] - graphs} graphs compiled "
                  f"after warm-up", flush=True)
        times["records"] = [float(_records(root / "dump"))]
    finally:
        del dbg
        shutil.rmtree(root, ignore_errors=True)
        torch._dynamo.reset()
    return times


def _records(dump: Path) -> int:
    """Records of the last recorded step (every recorded step writes as many)."""
    steps = sorted(dump.glob("step*/rank*/records.jsonl"), key=lambda p: int(p.parts[-3][4:]))
    return sum(1 for _ in steps[-1].open()) if steps else 0


def compile_time(backend: str, level: Optional[str]) -> float:
    """Wall time of the first (compiling) step of a fresh model, recorded at `level` or not."""
    torch._dynamo.reset()
    model, step = _setup(backend)
    root = Path(tempfile.mkdtemp(prefix="opdiff-bench-compile-"))
    dbg = (opdiff.PrecisionDebugger(dump_path=str(root / "dump"), level=level, task="statistics")
           if level else None)
    gc.collect()    # the previous run's garbage is not collected inside this one's timing
    try:
        return _timed(step, dbg, model)[0]
    finally:
        del dbg
        shutil.rmtree(root, ignore_errors=True)
        torch._dynamo.reset()


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f}x ({min(values):.3f}-{max(values):.3f})"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="aot_eager,inductor")
    p.add_argument("--levels", default="mix")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--compiles", type=int, default=3)
    p.add_argument("--what", default="steps,compile", help="steps, compile or both")
    p.add_argument("--warm-cache", action="store_true",
                   help="compile with Inductor's caches on and warm (see the module docstring)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, tiny Llama fwd+bwd+SGD, compiled; load "
          f"{os.getloadavg()[0]:.1f}")
    for backend in args.backends.split(","):
        for level in args.levels.split(","):
            wall, cpu, plains, recs, count = [], [], [], [], 0.0
            for _ in range(args.runs if "steps" in args.what else 0):
                t = overhead(backend, level, args.rounds)
                pm, rm = statistics.median(t["plain"]), statistics.median(t["recorded"])
                count = t["records"][0]
                plains.append(pm)
                recs.append(rm)
                wall.append(rm / pm)
                cpu.append(statistics.median(t["recorded_cpu"]) /
                           statistics.median(t["plain_cpu"]))
            if wall:
                print(f"step     {backend:<10} {level:<4} "
                      f"plain {statistics.median(plains) * 1e3:7.1f} ms"
                      f"  recorded {statistics.median(recs) * 1e3:7.1f} ms  wall {_spread(wall)}"
                      f"  cpu {_spread(cpu)}  records/step {count:.0f}", flush=True)
            if "compile" not in args.what:
                continue
            compile_time(backend, level)      # warm-up: the C++ compiler's output is on disk
            if args.warm_cache:
                compile_time(backend, None)   # (and the plain graph in the warm caches)
            plain_s, rec_s = [], []
            for i in range(args.compiles):
                for recorded in ((False, True) if i % 2 else (True, False)):
                    (rec_s if recorded else plain_s).append(
                        compile_time(backend, level if recorded else None))
            ratios = [r / q for r, q in zip(rec_s, plain_s)]
            print(f"compile  {backend:<10} {level:<4} plain {statistics.median(plain_s):7.2f} s"
                  f"   recorded {statistics.median(rec_s):7.2f} s   ratio {_spread(ratios)}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
