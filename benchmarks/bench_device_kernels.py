"""Kernels the statistics of one captured step launch on an accelerator, counted on the CPU.

    python benchmarks/bench_device_kernels.py [--models cnn,transformer]

On a GPU or NPU each kernel is a launch (microseconds of host time, whatever its size), so the
number of kernels per described tensor is what the device statistics path costs beyond memory
bandwidth. No accelerator is needed to count them: the statistics of a step at level mix are
routed through the device path with CPU tensors, and a dispatch mode counts the ops it runs
(views and detaches are free and not counted). No timing here: CPU kernels say nothing of a
GPU's launch cost.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))
import models  # noqa: E402

import opdiff  # noqa: E402
from opdiff.capture import stats  # noqa: E402

_FREE = ("view", "detach", "select", "slice", "alias", "_reshape_alias", "as_strided", "expand")


class KernelCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.kernels = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name.split("::")[-1] not in _FREE:
            self.kernels += 1
        return func(*args, **(kwargs or {}))


def count(workload) -> tuple[int, int]:
    """(tensors described with statistics, kernels their statistics ran) in one mix step."""
    model, batch, loss_fn = workload()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    counter, described = KernelCount(), [0]
    add, resolve = stats.StatsBatch.add, stats.StatsBatch.resolve

    def counted_add(self, desc, t):
        described[0] += 1
        with counter:
            return add(self, desc, t)

    def counted_resolve(self, *args, **kwargs):
        with counter:
            return resolve(self, *args, **kwargs)

    with tempfile.TemporaryDirectory() as root:
        dbg = opdiff.PrecisionDebugger(dump_path=root, level="mix", task="statistics")
        dbg.session.stats = stats.StatsBatch(cpu_as_device=True)
        stats.StatsBatch.add, stats.StatsBatch.resolve = counted_add, counted_resolve
        try:
            models.captured_step(dbg, model, batch, loss_fn, opt)
        finally:
            stats.StatsBatch.add, stats.StatsBatch.resolve = add, resolve
    return described[0], counter.kernels


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="cnn,transformer")
    args = parser.parse_args(argv)
    workloads = {"cnn": models.cnn_workload, "transformer": models.transformer_workload}
    print(f"{'model':<12} {'tensors':>8} {'kernels':>8} {'per tensor':>11}")
    for name in args.models.split(","):
        described, kernels = count(workloads[name])
        print(f"{name:<12} {described:8d} {kernels:8d} {kernels / described:11.1f}")


if __name__ == "__main__":
    main()
