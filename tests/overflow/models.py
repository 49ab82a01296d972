"""Tiny fp16 models that overflow in one known op, and clean counterparts.

Each `build()` returns (model, inputs); `step(model, inputs)` runs forward + backward. The line
that creates inf is marked `# ORIGIN` so tests can check the reported source line.
"""
from __future__ import annotations

import torch
import torch.nn as nn


class ExpNet(nn.Module):
    """torch.exp of a large activation overflows fp16 (max 65504) in the forward."""

    def __init__(self, gain: float = 30.0):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)
        self.gain = gain

    def forward(self, x):
        h = self.fc(x) * self.gain
        h = torch.exp(h)  # ORIGIN exp
        return self.head(h)


class MatmulNet(nn.Module):
    """A matmul of large but finite activations: the dot products exceed fp16's range."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        h = self.proj(x)
        scores = h @ h.transpose(0, 1)  # ORIGIN matmul
        return scores.softmax(-1).sum(0)


class ReciprocalNet(nn.Module):
    """Finite forward; the backward of 1/h (-g/h^2) overflows fp16 for h ~ 1e-3."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.full((8,), 1e-3))

    def forward(self, x):
        h = x * self.scale
        return torch.reciprocal(h)  # ORIGIN reciprocal


class MaskedAttention(nn.Module):
    """masked_fill(mask, -inf) on purpose; softmax makes it finite again (or NaN if a row is all masked)."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.q = nn.Linear(dim, dim)

    def forward(self, x, mask):
        q = self.q(x)
        scores = q @ q.transpose(-1, -2)
        scores = scores.masked_fill(mask, float("-inf"))
        return torch.softmax(scores, -1) @ q  # ORIGIN softmax


def build(name: str, dtype=torch.float16):
    """(model, inputs) for a named case, identical on every call."""
    gen = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        if name == "exp":
            model, inputs = ExpNet(), (torch.randn(4, 8, generator=gen),)
        elif name == "exp_clean":
            model, inputs = ExpNet(gain=0.5), (torch.randn(4, 8, generator=gen),)
        elif name == "matmul":
            model = MatmulNet()
            inputs = (torch.randn(8, 16, generator=gen) * 200,)
        elif name == "reciprocal":
            model, inputs = ReciprocalNet(), (1 + torch.rand(4, 8, generator=gen),)
        elif name == "masked":
            model = MaskedAttention()
            mask = torch.zeros(4, 4, dtype=torch.bool)
            mask[:, 3] = True
            inputs = (torch.randn(2, 4, 8, generator=gen), mask)
        else:
            raise KeyError(name)
    model = model.to(dtype)
    inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    return model, inputs


def step(model, inputs):
    """One forward + backward; returns the loss."""
    loss = model(*inputs).float().sum()
    loss.backward()
    return loss


def origin_line(cls, tag: str) -> int:
    """Line number of the `# ORIGIN tag` comment in this file."""
    import inspect

    lines, start = inspect.getsourcelines(cls)
    for i, text in enumerate(lines):
        if f"# ORIGIN {tag}" in text:
            return start + i
    raise LookupError(tag)


def scaler_training(dbg, init_scale: float = 2.0 ** 16, steps: int = 2, model=None, x=None,
                    lr: float = 0.01, fp16: bool = True):
    """`steps` training steps under a real `torch.amp.GradScaler`, each recorded by the debugger
    `dbg` (started and stopped around it, even when a step raises): by default of a small MLP
    under fp16 autocast, loss mean(out^2); with `fp16=False` in fp32, loss mean(|out|).
    Returns (the scale after each step: it drops when the scaler skipped the step, the losses)."""
    torch.manual_seed(0)
    if model is None:
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    if x is None:
        x = torch.randn(4, 8)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    scales, losses = [], []
    try:
        for _ in range(steps):
            dbg.start(model)
            with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
                out = model(x).float()
            loss = out.pow(2).mean() if fp16 else out.abs().mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            dbg.stop()
            dbg.step()
            scales.append(scaler.get_scale())
            losses.append(loss.item())
    finally:
        dbg.stop()
    return scales, losses
