"""Observer effect zero: with opdiff on, training computes bitwise the same and draws the same randoms.

For each model family, task and level: three optimizer steps with capture on must leave the
parameters, buffers, losses and gradients bitwise equal to the same steps without opdiff, and
the torch CPU generator, Python's `random` and NumPy's global generator where they would be.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import opdiff
from opdiff.store import find_dumps

TRAINING_FAMILIES = ("cnn", "res3d", "lstm", "transformer")   # tests/conftest.py model families
TASKS = ("statistics", "tensor", "overflow_check")
LEVELS = ("L0", "L1", "mix", "L2")
STEPS = 3


def _seed_everything():
    torch.manual_seed(1234)
    random.seed(1234)
    np.random.seed(1234)


def _rng_states():
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def _same_rng(a, b) -> bool:
    return (torch.equal(a[0], b[0]) and a[1] == b[1] and a[2][0] == b[2][0]
            and np.array_equal(a[2][1], b[2][1]) and a[2][2:] == b[2][2:])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).clone()


def _train(case, debugger=None):
    """STEPS optimizer steps; returns (state bits, grad bits, loss bits, rng states after)."""
    family = case.name
    model, inputs, loss_fn = case.build()
    model.train()
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if family in ("cnn", "res3d")
           else torch.optim.Adam(model.parameters(), lr=1e-2))
    _seed_everything()
    losses, grads = [], []
    for _ in range(STEPS):
        if debugger is not None:
            debugger.start(model)
        # The user's own randomness in the loop: opdiff must not shift any of it.
        noise = torch.randn(inputs[0].shape) * 1e-3
        jitter = random.random() * 1e-3 + float(np.random.rand()) * 1e-3
        loss = loss_fn(model(inputs[0] + noise + jitter))
        loss.backward()
        grads.append([_bits(p.grad) for p in model.parameters()])
        opt.step()
        opt.zero_grad(set_to_none=True)
        if debugger is not None:
            debugger.stop()
            debugger.step()
        losses.append(_bits(loss))
    state = {k: _bits(v) for k, v in model.state_dict().items()}
    return state, grads, losses, _rng_states()


_REFERENCE: dict = {}


def _reference(case):
    if case.name not in _REFERENCE:
        _REFERENCE[case.name] = _train(case)
    return _REFERENCE[case.name]


def _matrix():
    """Every family x task x level; the fast default runs every level of every family with
    statistics and every task on the CNN, the rest is marked slow (it still runs in CI)."""
    for family in TRAINING_FAMILIES:
        for task in TASKS:
            for level in LEVELS:
                fast = task == "statistics" or family == "cnn"
                marks = () if fast else (pytest.mark.slow,)
                yield pytest.param(family, task, level, marks=marks, id=f"{family}-{task}-{level}")


@pytest.mark.parametrize("family, task, level", list(_matrix()))
def test_training_is_bitwise_unchanged(family, task, level, tmp_path, model_cases):
    case = model_cases[family]
    ref_state, ref_grads, ref_losses, ref_rng = _reference(case)
    dbg = opdiff.PrecisionDebugger(dump_path=str(tmp_path / "dump"), task=task, level=level)
    state, grads, losses, rng = _train(case, dbg)
    assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses)), "losses changed"
    for step, (g, rg) in enumerate(zip(grads, ref_grads)):
        assert all(torch.equal(a, b) for a, b in zip(g, rg)), f"gradients changed at step {step}"
    changed = [k for k in ref_state if not torch.equal(state[k], ref_state[k])]
    assert not changed, f"parameters/buffers changed: {changed}"
    assert _same_rng(rng, ref_rng), "a random generator was advanced"
    dumps = find_dumps(tmp_path / "dump")
    if task != "overflow_check":      # overflow_check writes only where inf/NaN is born
        assert [d.parent.name for d in dumps] == [f"step{i}" for i in range(STEPS)]
        assert all((d / "records.jsonl").stat().st_size > 0 for d in dumps)


class _TiedLM(torch.nn.Module):
    """Tied input/output embedding, a branch reused twice: gradients accumulate from many uses."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)
        self.mix = torch.nn.Linear(6, 6)

    def forward(self, ids):
        h = self.emb(ids)
        h = h + torch.tanh(self.mix(h)) + torch.sigmoid(self.mix(h))   # mix used twice
        return h @ self.emb.weight.t()                                  # weight tying


@pytest.mark.parametrize("level", LEVELS)
def test_shared_weights_and_micro_batches_are_bitwise_unchanged(level, tmp_path):
    def run(debugger=None):
        torch.manual_seed(0)
        model = _TiedLM()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        ids = torch.randint(0, 11, (4, 5), generator=torch.Generator().manual_seed(1))
        for _step in range(2):
            if debugger is not None:
                debugger.start(model)
            for micro in range(2):                      # gradient accumulation
                logits = model(ids[2 * micro:2 * micro + 2])
                torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[2 * micro:2 * micro + 2].flatten()).backward()
            opt.step()
            opt.zero_grad()
            if debugger is not None:
                debugger.stop()
                debugger.step()
        return [_bits(p) for p in model.parameters()]

    want = run()
    got = run(opdiff.PrecisionDebugger(dump_path=str(tmp_path / "d"), level=level, task="statistics"))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
