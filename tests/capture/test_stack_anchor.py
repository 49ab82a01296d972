"""The call-site walk of an op inside a module call stops at that call's frame (stacks.py
`anchor`), and gives the stack a full walk gives."""
from __future__ import annotations

import sys

import torch
from torch import nn

import opdiff
from opdiff.capture import stacks


class Probe(nn.Module):
    """Notes, while its forward runs, whether the module layer's anchor frame is on the stack
    and what an op's walk from here gives with and without it."""

    def __init__(self, seen: list):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.seen = seen

    def forward(self, x):
        session = self.seen[0]
        anchor = session.modules.anchor
        chain, f = [], sys._getframe()
        while f is not None:
            chain.append(f)
            f = f.f_back
        here = sys._getframe()
        self.seen.append((anchor is not None and any(f is anchor[0] for f in chain),
                          stacks.frames_from(here, anchor=anchor), stacks.frames_from(here)))
        return self.fc(x).relu()


def test_ops_walk_stops_at_the_running_module_call(tmp_path):
    seen: list = []
    model = nn.Sequential(Probe(seen), nn.Linear(4, 2))
    dbg = opdiff.PrecisionDebugger(dump_path=str(tmp_path), level="mix", task="statistics")
    seen.append(dbg.session)
    dbg.start(model)
    model(torch.randn(3, 4)).sum().backward()
    dbg.stop()
    dbg.step()
    on_stack, anchored, full = seen[1]
    assert on_stack, "the module call's anchor frame had returned before its forward ran"
    assert anchored == full and anchored
