"""Three recorded training steps of a small MLP, dumped in its own process by the optimizer
test: `python optimizer_run.py DUMP LR INSIDE` (INSIDE "1": optimizer.step() is recorded)."""
from __future__ import annotations

import sys

import torch
import torch.nn as nn

import opdiff


def main(dump: str, lr: float, inside: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=lr, foreach=False)
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    dbg = opdiff.PrecisionDebugger(dump_path=dump, task="tensor", level="mix", step=[0, 1, 2])
    for _ in range(3):
        dbg.start(model)
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        if inside:
            opt.step()
            opt.zero_grad()
        dbg.stop()
        if not inside:
            opt.step()
            opt.zero_grad()
        dbg.step()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1")
