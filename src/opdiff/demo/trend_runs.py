"""The trend demo's training: a small transformer trained for real, monitored every step, with
a GELU kernel that is slightly wrong from a given step on (opdiff.testing.inject_fault).

    losses = train(steps=60, monitor_path="mon/golden")
    losses = train(steps=60, monitor_path="mon/target", fault_from=30)
    train(steps=31, fault_from=30, dump_config="out/next_dump.json", dump_path="dump/target")
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F

import opdiff
from opdiff.testing import inject_fault

SEED = 1234
VOCAB, DIM, BLOCKS, BATCH, SEQ = 64, 32, 3, 8, 16
LEARNING_RATE = 3e-3
FAULT_SIZE = 1e-3
FAULTY_BLOCK = 1            # the GELU of blocks.1 is the second F.gelu call of a forward


class Block(nn.Module):
    """A pre-norm transformer block: self-attention and a GELU MLP, each with a residual."""

    def __init__(self, d: int = DIM, heads: int = 2):
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.norm1(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        x = x + a
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class TinyTransformer(nn.Module):
    """Embedding, `blocks` Blocks, a final LayerNorm and a linear head over the vocabulary
    (also the model of opdiff's own trend tests)."""

    def __init__(self, blocks: int = BLOCKS):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([Block() for _ in range(blocks)])
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def batches(n: int = 16, seed: int = SEED) -> list:
    """`n` fixed batches of random tokens, the same for every run with the same seed."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen) for _ in range(n)]


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the logits (computed in float32) against the tokens shifted by one."""
    return F.cross_entropy(logits.float().flatten(0, 1), tokens.roll(1, 1).flatten())


def end_step(loss: torch.Tensor, opt: torch.optim.Optimizer, mon=None) -> float:
    """What follows optimizer.step() in a monitored loop: mon.step(loss) (after the optimizer,
    before zero_grad, as Monitor asks), zero_grad, and the loss as a number."""
    if mon is not None:
        mon.step(loss)
    opt.zero_grad()
    return loss.item()


def train(steps: int, *, monitor_path=None, fault_from=None, dump_config=None,
          dump_path=None) -> list:
    """Train `steps` Adam steps on a fixed stream of token batches; returns the losses.

    monitor_path: record every step with opdiff.Monitor. fault_from: from this step on, the GELU
    of blocks.1 returns its output times 1 + FAULT_SIZE. dump_config: also run
    opdiff.PrecisionDebugger(config_path=dump_config, dump_path=dump_path) on every step (it
    dumps the steps the config names).
    """
    opdiff.seed_all(SEED)
    model = TinyTransformer()
    opt = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    data = batches()
    mon = opdiff.Monitor(model, monitor_path, optimizer=opt) if monitor_path else None
    dbg = (opdiff.PrecisionDebugger(config_path=str(dump_config), dump_path=str(dump_path))
           if dump_config else None)
    losses = []
    try:
        for step in range(steps):
            tokens = data[step % len(data)]
            faulty = fault_from is not None and step >= fault_from
            planted = (inject_fault(op="Functional.gelu", call=FAULTY_BLOCK, phase="forward",
                                    scale=1 + FAULT_SIZE) if faulty else nullcontext())
            with planted:       # entered before the debugger: the fault sits below the recorder
                if dbg is not None:
                    dbg.start(model)
                logits = model(tokens)
                loss = next_token_loss(logits, tokens)
                loss.backward()
                opt.step()
                if dbg is not None:
                    dbg.stop()
                    dbg.step()
            if faulty and cast(inject_fault, planted).hits != 1:
                raise RuntimeError(f"the planted GELU fault fired {cast(inject_fault, planted).hits} times in a step")
            losses.append(end_step(loss, opt, mon))
    finally:
        if mon is not None:
            mon.close()
        if dbg is not None:
            dbg.stop()
    return losses
