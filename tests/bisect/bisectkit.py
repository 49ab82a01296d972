"""A tiny compiled training step, and a compiler bug of the pytorch#168126 kind planted in the
process that compiles it: `aten.silu` decomposed by Inductor's table as x * sigmoid(x) * 1.001."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch

# The same step as a script, for `opdiff compile-bisect -- python train.py [--wrong-silu]`.
SCRIPT = '''
import sys, torch
if "--wrong-silu" in sys.argv:
    from torch._inductor import decomposition
    decomposition.decompositions[torch.ops.aten.silu.default] = (
        lambda x: x * torch.sigmoid(x) * 1.001)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
compiled = torch.compile(model)
for _ in range(3):
    loss = compiled(torch.randn(4, 8)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print("loss", repr(loss.item()))
'''


def step() -> list[Any]:
    """One forward and backward of a tiny SiLU MLP, compiled inside (as compile_bisect asks)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 4))
    loss = torch.compile(model)(torch.randn(4, 8)).square().mean()
    loss.backward()
    return [loss] + [p.grad for p in model.parameters()]


@contextmanager
def wrong_silu() -> Iterator[None]:
    """Inductor's decomposition of aten.silu made 0.1% too large in this process, then undone."""
    from torch._inductor import decomposition

    table, op = decomposition.decompositions, torch.ops.aten.silu.default
    old = table.get(op)
    table[op] = lambda x: x * torch.sigmoid(x) * 1.001
    # Inductor compiles with a copy of the table made once per process (select_decomp_table)
    decomposition.fast_random_decomps.cache_clear()
    try:
        yield
    finally:
        if old is None:
            table.pop(op, None)
        else:
            table[op] = old
        decomposition.fast_random_decomps.cache_clear()
