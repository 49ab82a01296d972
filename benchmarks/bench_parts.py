"""Where a captured step's time goes, measured by switching parts of capture off, in one process.

    python benchmarks/bench_parts.py [--models mlp,llama,cnn] [--rounds 15]

Each round runs the plain step, then one captured step (level mix, statistics) per variant,
on the CPU clock (one thread); printed: each variant's median step time and its ratio to the
plain step. The difference between `normal` and a variant is what that part costs (its records
included), the only honest share where no single function dominates a profile:

- `no_api_backward`: API calls get no backward record (hook_api_backward does nothing);
- `api_backward_hooks_only`: the hooks are registered on the autograd nodes as usual, but do
  nothing when autograd calls them (normal minus this: describing the gradients and emitting);
- `no_large_cpu_stats`: large CPU tensors get no statistics (stats.cpu_stats returns None);
- `no_large_cpu_verify`: a large CPU tensor read again after user code may have run is not
  summed again to verify it (handles.Known.verify does nothing).

The records written by the variants are not opdiff's records: this is a measurement only.
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
from bench_paired import workload  # noqa: E402

import opdiff  # noqa: E402
from opdiff.capture import api, backward, handles, stats  # noqa: E402


def _variants() -> dict:
    """name -> (switch on, switch off) of each variant."""
    hook, cpu_stats, verify = api.hook_api_backward, stats.cpu_stats, handles.Known.verify
    boundary, output_node = backward.BackwardRecord.boundary, backward.BackwardRecord.output_node

    def no_api_backward():
        api.hook_api_backward = lambda *a, **k: None

    def hooks_only():
        backward.BackwardRecord.boundary = lambda self, *a: (lambda grad_inputs, grad_outputs: None)
        backward.BackwardRecord.output_node = lambda self, *a: (lambda grad_outputs: None)

    def no_large_stats():
        stats.cpu_stats = lambda t: None

    def no_large_verify():
        handles.Known.verify = lambda self, *a: None    # type: ignore[method-assign]

    def restore():
        api.hook_api_backward, stats.cpu_stats = hook, cpu_stats
        handles.Known.verify = verify    # type: ignore[method-assign]
        backward.BackwardRecord.boundary, backward.BackwardRecord.output_node = boundary, output_node

    return {"normal": (lambda: None, restore), "no_api_backward": (no_api_backward, restore),
            "api_backward_hooks_only": (hooks_only, restore),
            "no_large_cpu_stats": (no_large_stats, restore),
            "no_large_cpu_verify": (no_large_verify, restore)}


def parts(name: str, rounds: int) -> tuple[float, dict]:
    """(median plain step, {variant: median captured step}) in seconds of CPU time."""
    model, step = workload(name)
    variants = _variants()
    times: dict = {k: [] for k in variants}
    plain = []
    root = Path(tempfile.mkdtemp(prefix="opdiff-parts-"))
    dbg = opdiff.PrecisionDebugger(dump_path=str(root), level="mix", task="statistics")
    try:
        for _ in range(rounds + 2):
            t0 = time.process_time()
            step()
            plain.append(time.process_time() - t0)
            for key, (on, off) in variants.items():
                on()
                try:
                    t0 = time.process_time()
                    dbg.start(model)
                    step()
                    dbg.stop()
                    dbg.step()
                    times[key].append(time.process_time() - t0)
                finally:
                    off()
            shutil.rmtree(root / f"step{dbg.session.step_index - 1}", ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return statistics.median(plain[2:]), {k: statistics.median(v[2:]) for k, v in times.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,llama,cnn", help="of mlp, cnn, transformer, llama, gpt2")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.models.split(","):
        plain, found = parts(name, args.rounds)
        print(f"{name}: plain step {plain * 1e3:.2f} ms (CPU time, medians of {args.rounds} rounds)")
        for key, t in found.items():
            print(f"  {key:26s} {t * 1e3:8.2f} ms  {t / plain:5.2f}x  "
                  f"(normal - this: {(found['normal'] - t) * 1e3:+7.2f} ms)")


if __name__ == "__main__":
    main()
