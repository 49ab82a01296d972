"""Overhead of opdiff.Monitor per training step (`opdiff trend`'s speed: bench_trend.py).

    python benchmarks/bench_monitor.py [--rounds 11] [--runs 3] [--models cnn,transformer]
                                       [--every 4] [--tensorboard] [--parts] [--floor] [--split]

Overhead: two identical copies of each model (the ResNet-style CNN and the small transformer of
benchmarks/models.py), each with its own Adam optimizer, one of them monitored (every step, all
submodules, update norms on). Each round runs one plain and one monitored step, alternating which
goes first, so machine noise hits both; after warm-up rounds the median step time of each is
taken and their ratio reported. `--runs` repeats the whole measurement to show its spread.
One thread (torch.set_num_threads(1)), forward + backward + Adam step. `--tensorboard` also
measures Monitor(tensorboard=True) (event files written every step). Wall time and this thread's
CPU time are both reported: on a shared machine the CPU-time ratio is the steadier one.

`--floor`: what reading the monitored tensors costs at the least. Inside a plain step, every
tensor the monitor reduces is read once by torch.sum (the cheapest full read there is): each
monitored module's forward output and output gradient, and the parameters, gradients, Adam's two
states and the update; the time of those reads is given as a share of the step.

`--split`: where the monitor's own time goes, this thread's CPU time inside each of its entry
points (forward hooks, gradient hooks, the optimizer pre-step copy, mon.step) and inside the
reductions they call (vector_norm, aminmax, _foreach_norm), per step, medians.
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


# -- the floor: one read of everything the monitor reads --------------------------------------

def floor(workload, rounds: int, warmup: int = 3) -> tuple[float, float, float, float]:
    """(step s, forward reads s, backward reads s, parameter-side reads s) per step, CPU time,
    medians: one torch.sum per tensor the monitor reduces, timed inside a plain step."""
    from opdiff.monitor.modules import floating_tensors, select_modules

    model, batch, loss_fn = workload()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    spent = {"fwd": 0.0, "bwd": 0.0}

    def read(key, tensors):
        c0 = time.thread_time()
        with torch.no_grad():
            for t in tensors:
                t.sum()
        spent[key] += time.thread_time() - c0

    def on_grad(grads):
        read("bwd", [g for g in grads[:1] if g is not None])

    def on_output(module, args, output):
        tensors = floating_tensors(output, [])
        read("fwd", tensors)
        if tensors and tensors[0].grad_fn is not None:
            tensors[0].grad_fn.register_prehook(on_grad)

    handles = [m.register_forward_hook(on_output) for _, m in select_modules(model, None)]
    params = [p for p in model.parameters() if p.requires_grad]
    steps, fwd, bwd, par = [], [], [], []
    try:
        for i in range(warmup + rounds):
            spent["fwd"] = spent["bwd"] = 0.0
            c0 = time.thread_time()
            loss = loss_fn(model, batch)
            loss.backward()
            opt.step()
            c1 = time.thread_time()
            state = [opt.state[p][k] for p in params for k in ("exp_avg", "exp_avg_sq")]
            with torch.no_grad():       # parameters, gradients, the update (read like a copy)
                for t in params + [p.grad for p in params] + state + params:
                    t.sum()
            c2 = time.thread_time()
            opt.zero_grad(set_to_none=True)
            if i >= warmup:
                steps.append(c1 - c0 + time.thread_time() - c2)
                fwd.append(spent["fwd"])
                bwd.append(spent["bwd"])
                par.append(c2 - c1)
    finally:
        for h in handles:
            h.remove()
    med = statistics.median
    return med(steps) - med(fwd) - med(bwd), med(fwd), med(bwd), med(par)


def run_floor(args) -> None:
    print("the least the monitor's reads cost: one torch.sum per tensor it reduces, CPU time, "
          f"median of {args.rounds} steps, {args.runs} runs")
    for name in args.models.split(","):
        shares = [floor(WORKLOADS[name], args.rounds) for _ in range(args.runs)]
        step = statistics.median(s[0] for s in shares)
        parts = [statistics.median(s[k] / s[0] for s in shares) for k in (1, 2, 3)]
        total = [sum(s[1:]) / s[0] for s in shares]
        print(f"{name:<12} step {step * 1e3:6.1f} ms; forward outputs {parts[0]:.1%}, output "
              f"gradients {parts[1]:.1%}, parameter side {parts[2]:.1%}: in all "
              f"{statistics.median(total):.1%} ({min(total):.1%}-{max(total):.1%}) of the step",
              flush=True)


# -- the split: the monitor's own time, by where it is spent ----------------------------------

def split(workload, rounds: int, warmup: int = 3) -> dict:
    """{part: median CPU seconds per step} inside the monitor's entry points and reductions."""
    from opdiff.monitor import modules, parameters

    model, batch, loss_fn = workload()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    root = Path(tempfile.mkdtemp(prefix="opdiff-bench-monitor-"))
    mon = opdiff.Monitor(model, root / "mon", optimizer=opt)
    spent: dict = {}

    def timed(key, f):
        def call(*a, **k):
            c0 = time.thread_time()
            try:
                return f(*a, **k)
            finally:
                spent[key] = spent.get(key, 0.0) + time.thread_time() - c0
        return call

    probe, params = mon._modules, mon._params
    probe._after_forward = timed("forward hooks", probe._after_forward)
    probe._grad_hooks = [timed("gradient hooks", h) for h in probe._grad_hooks]
    if hasattr(probe, "_leave_root"):       # the registrations deferred to the model's return
        probe._leave_root = timed("forward hooks", probe._leave_root)
    probe.remove()
    probe.install()
    if params._handle is not None:
        params._handle.remove()
        params._handle = opt.register_step_pre_hook(timed("pre-step copy", params._before_step))
    step = timed("mon.step", mon.step)
    saved = modules.norm2, modules.extremes, parameters.foreach_norms
    modules.norm2 = timed("  vector_norm (hooks)", modules.norm2)
    modules.extremes = timed("  aminmax (forward hooks)", modules.extremes)
    parameters.foreach_norms = timed("  _foreach_norm (mon.step)", parameters.foreach_norms)
    per: dict = {}
    try:
        for i in range(warmup + rounds):
            spent.clear()
            c0 = time.thread_time()
            loss = loss_fn(model, batch)
            loss.backward()
            opt.step()
            step(loss)
            opt.zero_grad(set_to_none=True)
            total = time.thread_time() - c0
            if i >= warmup:
                per.setdefault("step", []).append(total)
                for key, v in spent.items():
                    per.setdefault(key, []).append(v)
    finally:
        modules.norm2, modules.extremes, parameters.foreach_norms = saved
        mon.close()
        shutil.rmtree(root, ignore_errors=True)
    return {key: statistics.median(v) for key, v in per.items()}


def run_split(args) -> None:
    print(f"where the monitor's time goes: CPU time per step, median of {args.rounds} steps")
    for name in args.models.split(","):
        parts = split(WORKLOADS[name], args.rounds)
        own = sum(v for k, v in parts.items() if k not in ("step",) and not k.startswith(" "))
        rest = parts["step"] - own
        print(f"{name}: step without the monitor {rest * 1e3:.1f} ms, the monitor {own * 1e3:.1f} ms "
              f"({own / rest:.1%})")
        for key, v in parts.items():
            if key != "step":
                print(f"  {key:<28} {v * 1e3:6.2f} ms  {v / rest:6.1%}")


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
    ap.add_argument("--floor", action="store_true",
                    help="measure the least the monitor's reads cost (one read of each tensor)")
    ap.add_argument("--split", action="store_true",
                    help="measure where the monitor's own time goes (hooks, reductions, mon.step)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.split:
        run_split(args)
    elif args.floor:
        run_floor(args)
    else:
        run_overhead(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
