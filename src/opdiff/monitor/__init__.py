"""The monitor: cheap numbers from every training step, to find *which step* and *which part of
the model* before dumping op by op.

    mon = opdiff.Monitor(model, "./mon/npu", optimizer=opt)     # a few % of a step
    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y); loss.backward(); opt.step()
        mon.step(loss)                                          # after opt.step(), before zero_grad()
        opt.zero_grad()

    opdiff trend ./mon/npu ./mon/gpu -o out     # the step and module where the two runs part
    opdiff trend ./mon/npu -o out               # one run: where inf/NaN and spikes start

Per recorded step: the loss, the global gradient norm, the loss scale (with `scaler=`); per
module, its forward output's norm, max |x| and NaN/inf counts and its output gradient's norm;
per parameter, its norm, gradient norm, update norm and optimizer-state norms. Reductions stay on
the device until one transfer per step. The stream format is described in opdiff.monitor.stream
(`pandas.read_csv("mon/npu/rank0/metrics.csv")` reads it).
"""
from __future__ import annotations

__all__ = ["Monitor"]


def __getattr__(name):
    # opdiff.monitor.stream is torch-free and shared with the trend reader: import torch only here.
    if name == "Monitor":
        from .monitor import Monitor
        return Monitor
    raise AttributeError(f"module 'opdiff.monitor' has no attribute {name!r}")
