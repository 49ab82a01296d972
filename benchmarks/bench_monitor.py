"""Overhead of opdiff.Monitor per training step, and the speed of `opdiff trend` on long streams.

    python benchmarks/bench_monitor.py [--rounds 11] [--runs 3] [--models cnn,transformer]
                                       [--every 4] [--tensorboard] [--parts]
    python benchmarks/bench_monitor.py --trend [--steps 10000 --modules 200]

Overhead: two identical copies of each model (the ResNet-style CNN and the small transformer of
benchmarks/models.py), each with its own Adam optimizer, one of them monitored (every step, all
submodules, update norms on). Each round runs one plain and one monitored step, alternating which
goes first, so machine noise hits both; after warm-up rounds the median step time of each is
taken and their ratio reported. `--runs` repeats the whole measurement to show its spread.
One thread (torch.set_num_threads(1)), forward + backward + Adam step. `--tensorboard` also
measures Monitor(tensorboard=True) (event files written every step). Wall time and this thread's
CPU time are both reported: on a shared machine the CPU-time ratio is the steadier one.

Trend: writes two synthetic streams (`--steps` x `--modules` modules, one weight per module,
Adam state), the target departing at a known step in a known module, and times
`opdiff.trend.trend()` on them (reading both streams, analysis, summary, HTML page).
"""
from __future__ import annotations

import argparse
import copy
from contextlib import contextmanager
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import models  # noqa: E402

import opdiff  # noqa: E402

WORKLOADS = {"cnn": models.cnn_workload, "transformer": models.transformer_workload}


def _step(model, batch, loss_fn, opt, mon=None):
    loss = loss_fn(model, batch)
    loss.backward()
    opt.step()
    if mon is not None:
        mon.step(loss)
    opt.zero_grad(set_to_none=True)


def overhead(workload, rounds: int, warmup: int = 3, **monitor_options) -> dict:
    """{"plain": [s], "monitored": [s], and the same as this thread's CPU time, "..._cpu"}
    step times from interleaved rounds. (CPU time is what the step itself used: on a shared
    machine it moves less than wall time when other processes compete for the cores.)"""
    model, batch, loss_fn = workload()
    twin = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    twin_opt = torch.optim.Adam(twin.parameters(), lr=1e-4)
    root = Path(tempfile.mkdtemp(prefix="opdiff-bench-monitor-"))
    mon = opdiff.Monitor(twin, root / "mon", optimizer=twin_opt, **monitor_options)
    times = {"plain": [], "monitored": [], "plain_cpu": [], "monitored_cpu": []}
    try:
        for i in range(warmup + rounds):
            order = ("plain", "monitored") if i % 2 else ("monitored", "plain")
            for kind in order:
                t0, c0 = time.perf_counter(), time.thread_time()
                if kind == "plain":
                    _step(model, batch, loss_fn, opt)
                else:
                    _step(twin, batch, loss_fn, twin_opt, mon)
                if i >= warmup:
                    times[kind].append(time.perf_counter() - t0)
                    times[kind + "_cpu"].append(time.thread_time() - c0)
    finally:
        mon.close()
        shutil.rmtree(root, ignore_errors=True)
    return times


def run_overhead(args) -> None:
    print(f"torch {torch.__version__}, 1 thread, fwd+bwd+Adam, median of {args.rounds} rounds "
          f"after warm-up, {args.runs} runs")
    print(f"{'model':<12} {'setting':<24} {'plain ms':>9} {'monitored':>10} {'wall ratio':>11} "
          f"{'(runs)':>13} {'cpu ratio':>10} {'(runs)':>13}")
    settings: dict = {"default": {}}
    if args.every > 1:
        settings[f"every={args.every}"] = {"every": args.every}
    if args.tensorboard:
        settings["tensorboard"] = {"tensorboard": True}
        if args.every > 1:
            settings[f"tensorboard every={args.every}"] = {"tensorboard": True, "every": args.every}
    if args.parts:      # where the time goes: some work left out
        settings["update_norm=False"] = {"update_norm": False}
        settings["no max|x| (diagnostic)"] = {"_parts": ("extremes",)}
        settings["no module norms (diag.)"] = {"_parts": ("extremes", "norm2")}
    for name in args.models.split(","):
        for label, options in settings.items():
            wall, cpu, plains, mons = [], [], [], []
            for _ in range(args.runs):
                with _without(options.get("_parts", ())):
                    t = overhead(WORKLOADS[name], args.rounds,
                                 **{k: v for k, v in options.items() if k != "_parts"})
                p, m = statistics.median(t["plain"]), statistics.median(t["monitored"])
                plains.append(p)
                mons.append(m)
                wall.append(m / p)
                cpu.append(statistics.median(t["monitored_cpu"]) / statistics.median(t["plain_cpu"]))
            print(f"{name:<12} {label:<24} {statistics.median(plains) * 1e3:9.1f} "
                  f"{statistics.median(mons) * 1e3:10.1f} {statistics.median(wall):10.3f}x "
                  f"{min(wall):6.3f}-{max(wall):.3f} {statistics.median(cpu):9.3f}x "
                  f"{min(cpu):6.3f}-{max(cpu):.3f}", flush=True)


@contextmanager
def _without(parts):
    """Replace the monitor's module reductions named in `parts` by constants (diagnostics)."""
    from opdiff.monitor import modules

    saved = {p: getattr(modules, p) for p in parts}
    zero = torch.zeros(())
    stubs = {"extremes": lambda t: (zero, zero), "norm2": lambda t: zero}
    try:
        for p in parts:
            setattr(modules, p, stubs[p])
        yield
    finally:
        for p, f in saved.items():
            setattr(modules, p, f)


# -- trend on synthetic streams ------------------------------------------------------------------

def write_synthetic(root: Path, steps: int, n_modules: int, depart_at=None, depart_module=None,
                    seed: int = 0) -> None:
    """A stream as Monitor writes it: per module forward/backward quantities, one weight per
    module with Adam state; the golden and target share the same noise (a deterministic pair
    that drifts by 1e-6) and the target departs by 1e-2 at `depart_at` in `depart_module`."""
    from opdiff.monitor.stream import (MODULE_QUANTITIES, StreamWriter, column,
                                       rank_directory)

    rng = np.random.default_rng(seed)
    names = [f"layers.{i}" for i in range(n_modules)]
    cols = ["loss", "grad_norm", "step_time"]
    for n in names:
        cols += [column(n, q) for q in MODULE_QUANTITIES]
    for n in names:
        cols += [column(f"{n}.weight", q) for q in ("norm", "grad_norm", "update_norm",
                                                     "exp_avg_norm", "exp_avg_sq_norm")]
    directory = rank_directory(root, 0)
    writer = StreamWriter(directory, flush_every=64)
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
    depart = None
    if depart_at is not None:
        depart = np.array([c.startswith(f"{depart_module}:") for c in cols])
    for s in range(steps):
        row = base * (1 + 0.01 * np.sin(s / 50.0)) * (1 + 1e-6 * drift.standard_normal(len(cols)))
        row[is_count] = 0.0
        if depart is not None and s >= depart_at:
            row = np.where(depart, row * 1.01, row)
        writer.append(s, row)
    writer.close()


def run_trend(args) -> None:
    from opdiff.trend import trend

    root = Path(tempfile.mkdtemp(prefix="opdiff-bench-trend-"))
    try:
        t0 = time.perf_counter()
        write_synthetic(root / "golden", args.steps, args.modules, seed=0)
        depart_at, module = args.steps * 3 // 4, f"layers.{args.modules // 3}"
        write_synthetic(root / "target", args.steps, args.modules, depart_at, module, seed=0)
        size = sum(p.stat().st_size for p in root.rglob("metrics.csv")) / 2 / 1e6
        print(f"wrote two streams of {args.steps} steps x {args.modules} modules "
              f"({size:.0f} MB each) in {time.perf_counter() - t0:.1f} s")
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            result = trend(root / "target", root / "golden", output=root / "out")
            times.append(time.perf_counter() - t0)
        found = result.first_divergence
        print(f"trend: median {statistics.median(times):.2f} s (runs {min(times):.2f}-"
              f"{max(times):.2f} s); found step {found.step if found else None} in "
              f"{found.module if found else None} (planted: step {depart_at} in {module})")
        t0 = time.perf_counter()
        trend(root / "target", output=root / "out1")
        print(f"trend, one run: {time.perf_counter() - t0:.2f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11, help="timed rounds per run (median)")
    ap.add_argument("--runs", type=int, default=3, help="repeat the measurement (spread)")
    ap.add_argument("--models", default="cnn,transformer", help="comma list of: cnn, transformer")
    ap.add_argument("--every", type=int, default=1, help="also measure Monitor(every=N)")
    ap.add_argument("--tensorboard", action="store_true",
                    help="also measure with the TensorBoard export on")
    ap.add_argument("--parts", action="store_true",
                    help="also measure without update norms, and with some reductions replaced "
                         "by constants")
    ap.add_argument("--trend", action="store_true", help="time opdiff trend on synthetic streams")
    ap.add_argument("--steps", type=int, default=10000, help="synthetic stream length (--trend)")
    ap.add_argument("--modules", type=int, default=200, help="synthetic module count (--trend)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.trend:
        run_trend(args)
    else:
        run_overhead(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
