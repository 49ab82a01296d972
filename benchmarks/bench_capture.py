"""Capture overhead: the same training step with and without opdiff, side by side in one process.

    python benchmarks/bench_capture.py [--steps 9] [--models cnn,transformer,llama,gpt2] [--autocast bf16]
    python benchmarks/bench_capture.py --floor [--models ...]   # what any Python capture pays
    python benchmarks/bench_capture.py --device cuda --json rows.json   # on a GPU (gpu_check.sh)

Prints, per model and setting, the median step time and its ratio to the plain step measured
in the same rounds (plain and captured steps alternate, so machine noise hits both), on one
thread (`torch.set_num_threads(1)`, `--threads` to change), after a warm-up captured step.
`llama` and `gpt2` are tiny Hugging Face models built from configs (transformers installed).
`--device cuda`: model and batch moved there, every timed step ends with a synchronize (the
kernels a step queued are part of its time); the spread is the quartiles of per-round ratios.
"""
from __future__ import annotations

import argparse
import json
import os
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

SETTINGS = [("L1", "statistics"), ("mix", "statistics"), ("L1", "tensor"), ("mix", "tensor"),
            ("mix", "overflow_check")]


def run_step(model, batch, loss_fn, opt, autocast=None):
    opt.zero_grad(set_to_none=True)
    device = next(model.parameters()).device
    with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
        loss = loss_fn(model, batch)
    loss.backward()
    opt.step()


def on_device(workload, device: str):
    """The workload with its model and batch moved to `device`."""
    def build():
        model, batch, loss_fn = workload()
        return model.to(device), tuple(b.to(device) for b in batch), loss_fn
    return build


def synced(clock, device: str):
    """`clock`, after waiting for the device's queued kernels (a step's time includes them)."""
    if not device.startswith("cuda"):
        return clock

    def read():
        torch.cuda.synchronize()
        return clock()
    return read


def spread(ratios: list) -> tuple:
    """Quartiles of the per-round ratios (the median's own noise)."""
    if len(ratios) < 2:
        return (ratios[0], ratios[0])
    q = statistics.quantiles(ratios, n=4)
    return (q[0], q[2])


def bench(name, workload, steps, settings, warmup=2, autocast=None, clock=time.perf_counter):
    """Per setting, a warm-up captured step, then `steps` rounds of (plain step, captured
    step); ratio of the two medians.

    Each setting gets its own plain steps, taken right beside its captured ones. Dirty pages
    from the tensor task are synced to disk outside the timed region: the kernel writing them
    back in the background would otherwise slow whichever steps come next.
    """
    model, batch, loss_fn = workload()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(warmup):
        run_step(model, batch, loss_fn, opt, autocast)
    rows = []
    root = Path(tempfile.mkdtemp(prefix="opdiff-bench-"))
    try:
        for level, task in settings:
            plain, captured = [], []
            for i in range(-1, steps):      # round -1: the warm-up captured step, not timed
                t0 = clock()
                run_step(model, batch, loss_fn, opt, autocast)
                plain.append(clock() - t0)
                path = root / f"{level}-{task}-{i}"
                t0 = clock()
                dbg = opdiff.PrecisionDebugger(dump_path=str(path), level=level, task=task)
                dbg.start(model)
                run_step(model, batch, loss_fn, opt, autocast)
                dbg.stop()
                dbg.step()
                if i >= 0:
                    captured.append(clock() - t0)
                else:
                    plain.pop()
                shutil.rmtree(path, ignore_errors=True)
                if hasattr(os, "sync"):
                    os.sync()
            base, med = statistics.median(plain), statistics.median(captured)
            rows.append((name, level, task, base, med, med / base,
                         spread([c / p for c, p in zip(captured, plain)])))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


_CONSTANT = {"max": 0.0, "min": 0.0, "mean": 0.0, "norm": 0.0, "nan": 0, "inf": 0}


def _skipping(which):
    """StatsBatch.add (and add_contiguous, the describer's shortcut to it) giving constant
    statistics to small tensors, large ones, or all."""
    from opdiff.capture import handles, stats
    real = stats.StatsBatch.add
    constant = handles.Known(_CONSTANT)

    def add(self, desc, t, *known):
        small = t.numel() <= stats._SMALL
        if which == "all" or (which == "small") == small:
            desc["stats"] = _CONSTANT
            return constant
        return real(self, desc, t)
    return add


def parts(name, workload, steps, warmup=2):
    """Where mix statistics' time goes: each round times a plain step and captured steps with
    real statistics, without those of small tensors (<= 16k elements), without those of large
    ones, and without any (constants instead); medians of the per-round ratios to plain."""
    from opdiff.capture import stats
    model, batch, loss_fn = workload()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(warmup):
        run_step(model, batch, loss_fn, opt)
    real, real_contiguous = stats.StatsBatch.add, stats.StatsBatch.add_contiguous
    variants = {"all statistics": real, "no small-tensor statistics": _skipping("small"),
                "no large-tensor statistics": _skipping("large"), "no statistics": _skipping("all")}
    ratios = {v: [] for v in variants}
    try:
        with tempfile.TemporaryDirectory(prefix="opdiff-bench-") as root:
            for i in range(steps):
                t0 = time.perf_counter()
                run_step(model, batch, loss_fn, opt)
                plain = time.perf_counter() - t0
                for v, add in variants.items():
                    stats.StatsBatch.add = add
                    stats.StatsBatch.add_contiguous = real_contiguous if add is real else add
                    t0 = time.perf_counter()
                    dbg = opdiff.PrecisionDebugger(dump_path=f"{root}/{i}-{len(ratios[v])}-{v}",
                                                   level="mix", task="statistics")
                    dbg.start(model)
                    run_step(model, batch, loss_fn, opt)
                    dbg.stop()
                    dbg.step()
                    ratios[v].append((time.perf_counter() - t0) / plain)
    finally:
        stats.StatsBatch.add, stats.StatsBatch.add_contiguous = real, real_contiguous
    return [(name, v, statistics.median(r)) for v, r in ratios.items()]


def floor(name, workload, steps, warmup=2, clock=time.perf_counter):
    """What any Python capture pays on this model: each round times a plain step, the step under
    a torch-function mode that only calls through, under bench_per_op.FloorRecorder (the records
    opdiff writes, as tuples of tensor heads: no statistics, stacks or files) and under opdiff at
    mix statistics, and under bench_per_op.ContractRecorder (the floor plus statistics, producers,
    call sites and JSON lines: the least that keeps opdiff's dump contract); ratios of the
    medians to the plain step's."""
    from bench_per_op import BareMode, ContractRecorder, FloorRecorder
    model, batch, loss_fn = workload()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(warmup):
        run_step(model, batch, loss_fn, opt)
    recorder = FloorRecorder().watching(model)
    times: dict = {"plain": [], "bare mode": [], "floor recorder": [], "contract recorder": [],
                   "opdiff mix": []}
    with tempfile.TemporaryDirectory(prefix="opdiff-bench-") as root:
        contractor = ContractRecorder(Path(root) / "contract.jsonl").watching(model)
        for i in range(-1, steps):      # round -1: warm-up, not timed
            t0 = clock()
            run_step(model, batch, loss_fn, opt)
            times["plain"].append(clock() - t0)
            t0 = clock()
            with BareMode():
                run_step(model, batch, loss_fn, opt)
            times["bare mode"].append(clock() - t0)
            t0 = clock()
            with recorder:
                run_step(model, batch, loss_fn, opt)
            times["floor recorder"].append(clock() - t0)
            t0 = clock()
            with contractor:
                run_step(model, batch, loss_fn, opt)
            times["contract recorder"].append(clock() - t0)
            t0 = clock()
            dbg = opdiff.PrecisionDebugger(dump_path=f"{root}/{i}", level="mix", task="statistics")
            dbg.start(model)
            run_step(model, batch, loss_fn, opt)
            dbg.stop()
            dbg.step()
            times["opdiff mix"].append(clock() - t0)
    base = statistics.median(times["plain"][1:])
    return [(name, variant, statistics.median(t[1:]) / base, base,
             spread([a / b for a, b in zip(t[1:], times["plain"][1:])]))
            for variant, t in times.items() if variant != "plain"], len(recorder.records)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=9, help="measured steps per setting (median)")
    parser.add_argument("--models", default="cnn,transformer", help="of cnn, transformer, llama, gpt2")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: this process's CPU time (steadier on a shared machine)")
    parser.add_argument("--settings", default=None, help="e.g. mix:statistics,L1:tensor")
    parser.add_argument("--autocast", choices=["bf16"], default=None,
                        help="run every step (plain and captured) under CPU bf16 autocast")
    parser.add_argument("--parts", action="store_true",
                        help="instead: where mix statistics' time goes (statistics of small "
                             "tensors, of large ones, the rest)")
    parser.add_argument("--floor", action="store_true",
                        help="instead: the floor of any Python capture (a bare torch-function "
                             "mode, bench_per_op.FloorRecorder, bench_per_op.ContractRecorder) "
                             "beside opdiff at mix statistics")
    parser.add_argument("--device", default="cpu", help="where model and batch live (cuda: steps synchronized)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    autocast = torch.bfloat16 if args.autocast == "bf16" else None
    workloads = {"cnn": models.cnn_workload, "transformer": models.transformer_workload,
                 "llama": models.llama_workload, "gpt2": models.gpt2_workload}
    workloads = {k: on_device(w, args.device) for k, w in workloads.items()}
    if args.parts:
        print(f"mix statistics, {args.steps} rounds, median of per-round ratios to the plain step")
        for name in args.models.split(","):
            for model_name, variant, ratio in parts(name, workloads[name], args.steps):
                print(f"{model_name:<12} {variant:<28} {ratio:6.2f}")
        return
    if args.floor:
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        print(f"{args.steps} rounds, {args.clock} clock, device {args.device}, median step / median plain step")
        out = []
        for name in args.models.split(","):
            rows, records = floor(name, workloads[name], args.steps, clock=synced(clock, args.device))
            for model_name, variant, ratio, base, (q1, q3) in rows:
                print(f"{model_name:<12} {variant:<16} {ratio:6.2f}x  (quartiles {q1:.2f}-{q3:.2f}, plain "
                      f"{base * 1e3:.1f} ms" + (f", {records} floor records)" if variant == "floor recorder" else ")"))
                out.append({"model": model_name, "level": "floor", "task": variant, "plain_ms": base * 1e3,
                            "ratio": ratio, "q1": q1, "q3": q3})
            if args.json:
                Path(args.json).write_text(json.dumps({"device": args.device, "rows": out}, indent=1))
        return
    settings = SETTINGS
    if args.settings:
        settings = [tuple(s.split(":")) for s in args.settings.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.steps} steps, median, "
          f"{args.clock} clock, device {args.device}"
          + (", bf16 autocast" if autocast else ""))
    print(f"{'model':<12} {'level':<5} {'task':<15} {'plain ms':>9} {'step ms':>9} {'x plain':>8}  quartiles")
    out = []
    for name in args.models.split(","):
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        for row in bench(name, workloads[name], args.steps, settings, autocast=autocast,
                         clock=synced(clock, args.device)):
            print(f"{row[0]:<12} {row[1]:<5} {row[2]:<15} {row[3] * 1000:9.1f} {row[4] * 1000:9.1f} "
                  f"{row[5]:8.2f}  {row[6][0]:.2f}-{row[6][1]:.2f}")
            out.append({"model": row[0], "level": row[1], "task": row[2], "plain_ms": row[3] * 1e3,
                        "step_ms": row[4] * 1e3, "ratio": row[5], "q1": row[6][0], "q3": row[6][1]})
        if args.json:       # after each model: a run stopped by a time limit keeps what it measured
            Path(args.json).write_text(json.dumps({"device": args.device, "rows": out}, indent=1))


if __name__ == "__main__":
    main()
