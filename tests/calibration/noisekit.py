"""Healthy runs of one tiny transformer training step that differ only as healthy runs do, for
the noise-floor tests: another thread count, each weight nudged by one ulp up, down or not at
all, the loss summed in another order; and a fault planted at a chosen op.

    run(path, threads=2, nudge=7, order=3)                       # a healthy run
    run(path, fault=dict(op="Functional.linear", call=2, scale=1 + 1e-6))
"""
from __future__ import annotations

import contextlib

import torch

import opdiff
from opdiff.testing import inject_fault

DIM = 32


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.ln2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.qkv, self.proj = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM)
        self.up, self.down = torch.nn.Linear(DIM, 4 * DIM), torch.nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        q, k, v = self.qkv(self.ln(x)).chunk(3, -1)
        x = x + self.proj(torch.softmax(q @ k.transpose(-1, -2) / DIM ** 0.5, -1) @ v)
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


def run(path, *, threads: int = 1, nudge: int | None = None, order: int = 0, fault=None,
        level: str = "mix"):
    """One SGD step of a 2-block transformer, recorded (statistics) at `path`."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block())
    x, y = torch.randn(4, 16, DIM), torch.randn(4, 16, DIM)
    if nudge is not None:       # each weight one ulp up, down or kept (a checkpoint round trip)
        g = torch.Generator().manual_seed(nudge)
        with torch.no_grad():
            for p in model.parameters():
                way = torch.randint(-1, 2, p.shape, generator=g).to(p.dtype)
                p.copy_(torch.where(way == 0, p, torch.nextafter(p, way * torch.inf)))
    # the loss summed in another order: what a nondeterministic reduction does
    perm = torch.randperm(x.numel(), generator=torch.Generator().manual_seed(order)) \
        if order else None
    planted = inject_fault(**fault) if fault else contextlib.nullcontext()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with planted, opdiff.dump(model, str(path), level=level, task="statistics"):
            d = (model(x) - y).pow(2).flatten()
            loss = (d[perm] if perm is not None else d).sum() / d.numel()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(before)
    return path


def healthy(i: int) -> dict:
    """The i-th healthy perturbation: thread count, weight nudge and summation order."""
    return {"threads": 1 + i % 2, "nudge": 1000 + i, "order": 1 + i}
