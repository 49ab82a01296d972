"""`opdiff run`'s cost next to PrecisionDebugger in the loop, on the benchmark transformer.

    python benchmarks/bench_run.py [--rounds 7] [--models transformer,llama]

In one process, per round (the settings alternate, so machine noise hits all of them): a plain
step; a step that opdiff run's hooks see but do not record (installed, step not configured);
a step recorded by opdiff run (mix, statistics); a step recorded by a PrecisionDebugger the
loop starts and stops itself. Prints each one's median and its ratio to the plain step.
"""
from __future__ import annotations

import argparse
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
from opdiff.launch.autorun import Autorun  # noqa: E402
from opdiff.launch.settings import RunSettings  # noqa: E402


def _plain(model, batch, loss_fn, opt) -> float:
    t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss_fn(model, batch).backward()
    opt.step()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--models", default="transformer")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in args.models.split(","):
        model, batch, loss_fn = getattr(models, f"{name}_workload")()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        tmp = Path(tempfile.mkdtemp())
        times: dict[str, list[float]] = {"plain": [], "run, step not recorded": [],
                                         "run, recorded": [], "debugger in loop": []}
        try:
            for r in range(args.rounds + 1):
                plain = _plain(model, batch, loss_fn, opt)
                # opdiff run's hooks: one step not configured, then one recorded
                runner = Autorun(RunSettings(dump={"dump_path": str(tmp / f"run{r}"), "level": "mix",
                                                   "step": [1]}))
                runner.install()
                run_opt = torch.optim.SGD(model.parameters(), lr=1e-3)   # created under the hooks
                idle = _plain(model, batch, loss_fn, run_opt)
                t = time.perf_counter()
                _plain(model, batch, loss_fn, run_opt)
                recorded = time.perf_counter() - t
                runner.close()
                if not runner.done:
                    runner.uninstall()
                dbg = opdiff.PrecisionDebugger(dump_path=str(tmp / f"dbg{r}"), level="mix")
                t = time.perf_counter()
                models.captured_step(dbg, model, batch, loss_fn, opt)
                in_loop = time.perf_counter() - t
                if r:   # the first round warms up
                    for key, value in zip(times, (plain, idle, recorded, in_loop)):
                        times[key].append(value)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        base = statistics.median(times["plain"])
        print(f"{name}:")
        for key, values in times.items():
            med = statistics.median(values)
            print(f"  {key:24} {med * 1e3:8.1f} ms  x{med / base:5.2f}")


if __name__ == "__main__":
    main()
