"""A small transformer trained for real under opdiff.Monitor, with faults planted from a step on
(the model, batches and loss are the trend demo's, opdiff.demo.trend_runs).

    losses = train(tmp_path / "golden", steps=120)
    train(tmp_path / "target", steps=120, fault="block", fault_step=60)   # block 1 output x(1+1e-3)
    train(tmp_path / "lr", steps=120, fault="lr", fault_step=60)          # learning rate x1.5
    train(tmp_path / "bf16", steps=120, autocast=torch.bfloat16)          # healthy, other dtype

Every run seeds everything with opdiff.seed_all, so two runs without a fault are bitwise equal.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn as nn

import opdiff
from opdiff.demo.trend_runs import TinyTransformer, end_step, next_token_loss
from opdiff.demo.trend_runs import batches as _batches

LR = 3e-3


def batches(n: int = 16) -> list:
    return _batches(n, seed=1)


def plant(module: nn.Module, when, change) -> None:
    """Wrap `module.forward` so that `change(output)` replaces its output while `when()`: the
    fault sits inside the module, as a wrong kernel would, so every hook sees it."""
    original = module.forward

    def faulty(*args, **kwargs):
        out = original(*args, **kwargs)
        return change(out) if when() else out

    module.forward = faulty


def train(path=None, steps: int = 120, *, fault: str | None = None, fault_step: int = 60,
          autocast=None, seed: int = 0, scale: float = 1 + 1e-3, **monitor_options) -> list:
    """Train with Adam, monitored into `path` (None: not monitored); returns the losses.

    fault: "block" (blocks[1]'s output times `scale` from fault_step on), "lr" (learning rate
    x1.5 from fault_step on), "nan" (one NaN in blocks[1].fc1's output at fault_step only),
    "spike" (blocks[1].fc2's output times 30 at fault_step only).
    """
    threads = torch.get_num_threads()
    # Tiny tensors: handing them between threads costs more than the work (and on a busy
    # machine, much more).
    torch.set_num_threads(1)
    try:
        return _train(path, steps, fault, fault_step, autocast, seed, scale, monitor_options)
    finally:
        torch.set_num_threads(threads)


def _train(path, steps, fault, fault_step, autocast, seed, scale, monitor_options) -> list:
    opdiff.seed_all(seed)
    model = TinyTransformer()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    data = batches()
    now = {"step": -1}
    if fault == "block":
        plant(model.blocks[1], lambda: now["step"] >= fault_step, lambda y: y * scale)
    elif fault == "nan":
        def poison(y):
            y = y.clone()
            y[0, 0, 0] = float("nan")
            return y
        plant(model.blocks[1].fc1, lambda: now["step"] == fault_step, poison)
    elif fault == "spike":
        plant(model.blocks[1].fc2, lambda: now["step"] == fault_step, lambda y: y * 30)
    mon = opdiff.Monitor(model, path, optimizer=opt, **monitor_options) if path else None
    losses = []
    try:
        for step in range(steps):
            now["step"] = step
            if fault == "lr" and step == fault_step:
                for group in opt.param_groups:
                    group["lr"] = LR * 1.5
            tokens = data[step % len(data)]
            with torch.autocast("cpu", dtype=autocast) if autocast else nullcontext():
                logits = model(tokens)
            loss = next_token_loss(logits, tokens)
            loss.backward()
            opt.step()
            losses.append(end_step(loss, opt, mon))
    finally:
        if mon is not None:
            mon.close()
    return losses
