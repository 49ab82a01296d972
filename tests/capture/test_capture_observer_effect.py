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
from opdiff.store import find_dumps, open_dump

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


class _Gated(torch.nn.Module):
    """A block whose activation goes through `torch.nn.functional.silu` at call time (as
    nn.SiLU and Hugging Face's activations do), so a library's replacement of it is used."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.act = torch.nn.SiLU()

    def forward(self, x):
        return self.act(self.fc(x)) + torch.nn.functional.silu(x)


@pytest.mark.parametrize("level", LEVELS)
def test_a_library_wrapper_of_a_torch_function_runs_once_per_call(level, tmp_path, monkeypatch):
    """A library that replaces F.silu by its own function (which calls the original and scales
    its result) must see its function called as often as without opdiff, with the same result;
    the torch op it wraps is still recorded under torch's name."""
    original = torch.nn.functional.silu
    calls = []

    def library_silu(input, inplace=False):
        calls.append(1)
        return original(input, inplace) * 2.0

    monkeypatch.setattr(torch.nn.functional, "silu", library_silu)
    torch.manual_seed(0)
    model = _Gated()
    x = torch.randn(3, 4, requires_grad=True)

    def run():
        calls.clear()
        x.grad = None
        out = model(x)
        out.sum().backward()
        return len(calls), _bits(out), _bits(x.grad)

    want_calls, want_out, want_grad = run()
    assert want_calls == 2
    with opdiff.dump(model, str(tmp_path / "d"), level=level):
        got_calls, got_out, got_grad = run()
    assert got_calls == want_calls, f"the library's silu ran {got_calls} times, {want_calls} without opdiff"
    assert torch.equal(got_out, want_out) and torch.equal(got_grad, want_grad)
    names = [r["name"] for r in open_dump(tmp_path / "d" / "step0" / "rank0").records()]
    if level in ("L1", "mix"):
        assert "Functional.silu.0.forward" in names and "Functional.silu.1.forward" in names
        assert "Tensor.__mul__.0.forward" in names     # the library's own op, recorded once each
        assert "Tensor.__mul__.2.forward" not in names


@pytest.mark.parametrize("task", ["statistics", "overflow_check", "tensor"])
@pytest.mark.parametrize("level", ["L1", "mix"])
def test_described_tensors_stay_resizable(task, level, tmp_path):
    """Capture's statistics copy values without a NumPy view of the user's tensors (a view makes
    a storage unresizable for good: FSDP2's `storage.resize_(0)` then fails)."""
    # (64 wide: the tensor writer's reference search looks only at tensors of 256 bytes and more)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU())
    x = torch.randn(2, 64)
    with opdiff.dump(model, str(tmp_path / "d"), level=level, task=task):
        y = model(x)
        y.sum().backward()
    for t in (x, y.detach(), model[0].weight.detach(), model[0].weight.grad):
        storage = t.untyped_storage()
        storage.resize_(storage.nbytes())      # raises on an unresizable storage


@pytest.mark.parametrize("task", ("statistics", "tensor"))
def test_parameter_gradients_are_the_tensors_autograd_made(tmp_path, task):
    """Capture holds no gradient while autograd runs: each `.grad` is the very tensor the
    engine handed AccumulateGrad (torch takes a gradient only nobody else holds, and copies it
    otherwise), as without opdiff. The biases of F.linear get theirs from a different node than
    the weights, so a hook holding the op's gradients until its last node made every bias
    gradient a copy. (overflow_check still holds them: its check reads the op's gradients
    once all have arrived.)"""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
    x = torch.randn(4, 16, requires_grad=True)
    dbg = opdiff.PrecisionDebugger(dump_path=str(tmp_path), level="mix", task=task)
    dbg.start(model)
    y = model(x)
    arriving: dict = {}
    todo, seen = [y.grad_fn], set()
    while todo:    # the gradient each AccumulateGrad node receives, by the address of its memory
        node = todo.pop()
        for nxt, _ in node.next_functions:
            if nxt is None or id(nxt) in seen:
                continue
            seen.add(id(nxt))
            if type(nxt).__name__ == "AccumulateGrad":
                nxt.register_prehook(lambda grads, v=nxt.variable: arriving.__setitem__(
                    id(v), grads[0].data_ptr()))
            else:
                todo.append(nxt)
    y.sum().backward()
    dbg.stop()
    dbg.step()
    params = dict(model.named_parameters())
    assert {n for n, p in params.items() if id(p) in arriving} == set(params)
    copied = [n for n, p in params.items() if p.grad.data_ptr() != arriving[id(p)]]
    assert copied == []
    records = {r["name"]: r for r in open_dump(find_dumps(tmp_path)[0]).records()}
    grads = records["Functional.linear.0.backward"]["outputs"]   # to input, weight and bias
    assert [g["shape"] for g in grads] == [[4, 16], [16, 16], [16]]
    if task == "statistics":
        assert grads[2]["stats"]["max"] >= grads[2]["stats"]["min"]
